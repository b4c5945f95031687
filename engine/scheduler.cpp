#include "engine/scheduler.h"

#include <algorithm>

#include "model/error.h"

namespace parity {

void SchedulerLimits::validate() const {
  if (max_batch < 1) fail("--max-batch: {} is not a positive count of sequences", max_batch);
  if (max_batch > kMaxBatch)
    fail("--max-batch: {} sequences at once, more than the {} a run can hold", max_batch,
         kMaxBatch);
  if (step_tokens < 1) fail("--step-tokens: {} is not a positive count of rows", step_tokens);
  if (step_tokens > kMaxStepTokens)
    fail("--step-tokens: {} rows per step, more than the {} a step can hold", step_tokens,
         kMaxStepTokens);
}

Scheduler::Scheduler(const SchedulerLimits& limits) : limits_(limits) {
  limits_.validate();
  limits_.step_tokens = std::max(limits_.step_tokens, limits_.max_batch);
  slots_.resize(size_t(limits_.max_batch));
  for (int s = limits_.max_batch - 1; s >= 0; --s) free_slots_.push_back(s);
}

void Scheduler::enqueue(size_t request, std::vector<TokenId> prompt) {
  PARITY_CHECK(!prompt.empty(), "request {} has an empty prompt", request);
  ScheduledSequence s;
  s.request = request;
  s.prompt_length = prompt.size();
  s.tokens = std::move(prompt);
  waiting_.push_back(std::move(s));
}

std::vector<int> Scheduler::admit(const std::function<bool(const ScheduledSequence&)>& fits) {
  std::vector<int> filled;
  while (!waiting_.empty() && !free_slots_.empty() && (!fits || fits(waiting_.front()))) {
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[size_t(slot)] = std::move(waiting_.front());
    slots_[size_t(slot)].slot = slot;
    waiting_.pop_front();
    running_.push_back(slot);
    filled.push_back(slot);
  }
  return filled;
}

StepPlan Scheduler::plan() {
  StepPlan p;
  int budget = limits_.step_tokens;
  const auto add_rows = [&](ScheduledSequence& s, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      p.batch.tokens.push_back(s.tokens[s.cached + i]);
      p.batch.positions.push_back(int32_t(s.cached + i));
      p.batch.seqs.push_back(s.slot);
    }
    s.cached += n;
    budget -= int(n);
    if (s.cached == s.tokens.size()) p.samples.push_back({s.slot, p.batch.rows() - 1});
  };
  for (int slot : running_) {  // decode rows first: one each
    ScheduledSequence& s = slots_[size_t(slot)];
    if (s.cached >= s.prompt_length && s.cached < s.tokens.size()) {
      add_rows(s, 1);
      ++p.decode_rows;
    }
  }
  for (int slot : running_) {  // then prompt chunks while the budget lasts
    if (budget <= 0) break;
    ScheduledSequence& s = slots_[size_t(slot)];
    if (s.cached >= s.prompt_length) continue;
    const size_t n = std::min(s.prompt_length - s.cached, size_t(budget));
    add_rows(s, n);
    p.prefill_rows += int(n);
  }
  return p;
}

void Scheduler::append(int slot, TokenId token) {
  sequence(slot).tokens.push_back(token);
}

void Scheduler::retire(int slot) {
  const auto it = std::find(running_.begin(), running_.end(), slot);
  PARITY_CHECK(it != running_.end(), "slot {} is not running", slot);
  running_.erase(it);
  free_slots_.push_back(slot);
  std::sort(free_slots_.begin(), free_slots_.end(), std::greater<>());
}

ScheduledSequence& Scheduler::sequence(int slot) {
  PARITY_CHECK(slot >= 0 && slot < int(slots_.size()), "slot {} out of range", slot);
  return slots_[size_t(slot)];
}

}  // namespace parity
