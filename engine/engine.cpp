#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "device/runtime/kv_blocks.h"
#include "engine/graph_runner.h"
#include "tokenizer/harmony.h"
#include "model/error.h"
#include "model/untrusted.h"

namespace parity {

double nearest_rank_percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::clamp(rank, size_t(1), v.size()) - 1];
}

double EngineStats::ttft_percentile(double q) const {
  return nearest_rank_percentile(ttft_seconds, q);
}

double EngineStats::tpot_percentile(double q) const {
  return nearest_rank_percentile(tpot_seconds, q);
}

void EngineStats::merge(const EngineStats& o) {
  requests += o.requests;
  failed += o.failed;
  prompt_tokens += o.prompt_tokens;
  generated_tokens += o.generated_tokens;
  prefill_rows += o.prefill_rows;
  decode_rows += o.decode_rows;
  steps += o.steps;
  wall_seconds = std::max(wall_seconds, o.wall_seconds);
  prefill_seconds += o.prefill_seconds;
  decode_seconds += o.decode_seconds;
  ttft_seconds.insert(ttft_seconds.end(), o.ttft_seconds.begin(), o.ttft_seconds.end());
  tpot_seconds.insert(tpot_seconds.end(), o.tpot_seconds.begin(), o.tpot_seconds.end());
}

Engine::Engine(StepRunner& runner, const EngineOptions& options)
    : runner_(runner), options_(options) {
  init();
}

Engine::Engine(Backend& backend, const EngineOptions& options)
    : owned_runner_(std::make_unique<GraphRunner>(backend)),
      runner_(*owned_runner_),
      options_(options) {
  init();
}

Engine::~Engine() = default;

void Engine::init() {
  options_.sampling.validate();
  if (options_.max_tokens < 1) fail("--max-tokens {}: at least one token", options_.max_tokens);
  const int runner_context = runner_.max_context();
  context_ = options_.context == 0 ? runner_context : options_.context;
  if (context_ < 1 || context_ > runner_context)
    fail("context of {} positions: {} holds {}", context_, runner_.name(), runner_context);
  Scheduler check(options_.limits);  // validates the limits
  (void)check;
  options_.limits.step_tokens = std::max(options_.limits.step_tokens, options_.limits.max_batch);
}

int Engine::reserve_blocks(size_t prompt_length, int max_tokens) const {
  if (runner_.kv_blocks() == 0) return 0;
  const device::KvLayout layout = device::KvLayout::of(runner_.config(), runner_.kv_block_size());
  const int64_t positions = std::min<int64_t>(int64_t(prompt_length) + max_tokens, context_);
  return layout.blocks_per_sequence(int(positions), options_.limits.step_tokens);
}

std::string Engine::check_prompt(const std::vector<TokenId>& prompt) const {
  EngineRequest r;
  r.prompt = prompt;
  return check_request(r);
}

std::string Engine::check_request(const EngineRequest& request) const {
  const std::vector<TokenId>& prompt = request.prompt;
  if (request.max_tokens < 0) return fmt::format("max_tokens {} is negative", request.max_tokens);
  if (request.max_tokens > context_)
    return fmt::format("max_tokens {} is more than the context of {} positions", request.max_tokens,
                       context_);
  const int max_tokens = request.max_tokens > 0 ? request.max_tokens : options_.max_tokens;
  if (prompt.empty()) return "empty prompt";
  if (prompt.size() > size_t(context_))
    return fmt::format("{} prompt tokens, longer than the context of {} positions", prompt.size(),
                       context_);
  const int vocab = runner_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return fmt::format("token {} at index {} is outside the model's vocabulary of {}", prompt[i],
                         i, vocab);
  if (const int need = reserve_blocks(prompt.size(), max_tokens); need > runner_.kv_blocks())
    return fmt::format(
        "needs {} KV-cache blocks ({} prompt tokens + {} to generate), more than the {} the cache "
        "holds (raise --kv-memory, or lower {})",
        need, prompt.size(), max_tokens, runner_.kv_blocks(),
        request.max_tokens > 0 ? "the request's max_tokens" : "--max-tokens");
  return "";
}

void Engine::run(WorkSource& source, const TokenCallback& on_token, Clock::time_point start,
                 int worker) {
  const auto since_start = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  stats_ = EngineStats{};
  Scheduler scheduler(options_.limits);
  // Per slot: the request's index in the source, its id, its limits, its result so far, its KV
  // reservation.
  struct Running {
    size_t index = 0;
    uint64_t id = 0;
    int max_tokens = 0;
    bool ignore_eos = false;
    EngineResult result;
    int blocks = 0;
  };
  std::vector<Running> slots(size_t(options_.limits.max_batch));
  Running waiting;  // taken from the source, not admitted yet (at most one)
  int reserved = 0;
  bool exhausted = false;
  runner_.reset();
  std::vector<RowSample> samples;
  while (true) {
    // Take requests one at a time while the next can start at once: a free slot and room in the
    // KV cache (the source may be shared by other engines: take none that would only wait).
    while (true) {
      if (scheduler.waiting() == 0) {
        if (exhausted || scheduler.full()) break;
        std::optional<WorkItem> item = source.next();
        if (!item) {
          exhausted = true;
          break;
        }
        ++stats_.requests;
        std::string why = check_request(item->request);
        if (!why.empty()) {
          EngineResult r;
          r.finish = FinishReason::error;
          r.error = std::move(why);
          r.worker = worker;
          ++stats_.failed;
          source.done(item->index, std::move(r));
          continue;
        }
        stats_.prompt_tokens += int64_t(item->request.prompt.size());
        waiting.index = item->index;
        waiting.id = item->request.id;
        waiting.max_tokens =
            item->request.max_tokens > 0 ? item->request.max_tokens : options_.max_tokens;
        waiting.ignore_eos = item->request.ignore_eos;
        waiting.blocks = reserve_blocks(item->request.prompt.size(), waiting.max_tokens);
        waiting.result = EngineResult{};
        waiting.result.worker = worker;
        scheduler.enqueue(item->index, std::move(item->request.prompt));
      }
      const std::vector<int> admitted = scheduler.admit([&](const ScheduledSequence&) {
        return runner_.kv_blocks() == 0 || reserved + waiting.blocks <= runner_.kv_blocks();
      });
      if (admitted.empty()) break;  // waits for a running sequence to end
      reserved += waiting.blocks;
      slots[size_t(admitted.front())] = std::move(waiting);
    }
    if (scheduler.idle()) {
      if (exhausted) break;
      continue;
    }
    StepPlan plan = scheduler.plan();
    PARITY_CHECK(plan.batch.rows() > 0, "a step with no rows and {} sequences running",
                 scheduler.running());
    const auto step_start = Clock::now();
    samples.clear();
    for (const StepPlan::Sample& s : plan.samples) {
      const Running& r = slots[size_t(s.slot)];
      samples.push_back({s.row, r.id, uint64_t(r.result.generated.size())});
    }
    const std::vector<TokenId> tokens = runner_.step(plan.batch, samples, options_.sampling);
    PARITY_CHECK(tokens.size() == plan.samples.size(), "{} tokens for {} samples", tokens.size(),
                 plan.samples.size());
    const double sampled_at = since_start();  // every token of the step is there now
    for (size_t i = 0; i < plan.samples.size(); ++i) {
      const int slot = plan.samples[i].slot;
      ScheduledSequence& seq = scheduler.sequence(slot);
      Running& r = slots[size_t(slot)];
      const TokenId token = tokens[i];
      if (r.result.generated.empty()) {
        r.result.ttft_seconds = sampled_at;
        stats_.ttft_seconds.push_back(r.result.ttft_seconds);
      }
      r.result.generated.push_back(token);
      ++stats_.generated_tokens;
      if (on_token) on_token(r.index, token);
      const bool stop =
          !r.ignore_eos && std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(),
                                     token) != options_.stop_tokens.end();
      const bool length = int(r.result.generated.size()) >= r.max_tokens;
      // The new token would run at position tokens.size() (before the append): past the end?
      const bool full = seq.tokens.size() >= size_t(context_);
      if (stop || length || full) {
        r.result.finish = stop     ? FinishReason::stop
                          : length ? FinishReason::length
                                   : FinishReason::context;
        if (const size_t n = r.result.generated.size(); n >= 2)
          stats_.tpot_seconds.push_back((sampled_at - r.result.ttft_seconds) / double(n - 1));
        scheduler.retire(slot);
        runner_.release(slot);
        reserved -= r.blocks;
        source.done(r.index, std::move(r.result));
        r = Running{};
      } else {
        scheduler.append(slot, token);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    const double rows = plan.prefill_rows + plan.decode_rows;
    stats_.prefill_seconds += seconds * plan.prefill_rows / rows;
    stats_.decode_seconds += seconds * plan.decode_rows / rows;
    stats_.prefill_rows += plan.prefill_rows;
    stats_.decode_rows += plan.decode_rows;
    ++stats_.steps;
  }
  stats_.wall_seconds = since_start();
}

std::vector<EngineResult> Engine::run(const std::vector<EngineRequest>& requests,
                                      const TokenCallback& on_token) {
  for (const EngineRequest& r : requests)
    if (const std::string why = check_request(r); !why.empty()) fail("request {}: {}", r.id, why);
  LocalQueue queue(requests);
  run(queue, on_token);
  return queue.take_results();
}

std::vector<TokenId> generation_config_stop_tokens(std::string_view text,
                                                   const std::string& source) {
  const nlohmann::json j = parse_json(text, source);
  if (!j.is_object()) fail("{}: not a JSON object", source);
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return {};
  std::vector<TokenId> ids;
  const auto add = [&](const nlohmann::json& v) {
    const bool id =
        v.is_number_integer() &&
        (v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kMaxTokenId)
                                : v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId);
    if (!id) fail("{}: eos_token_id holds {}, not a token id", source, json_excerpt(v));
    ids.push_back(v.get<TokenId>());
  };
  if (it->is_array()) {
    for (const auto& v : *it) add(v);
  } else {
    add(*it);
  }
  return ids;
}

std::vector<TokenId> model_stop_tokens(const std::string& model_dir, const Tokenizer& tokenizer) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  // Absent means "none"; anything there (a directory, a FIFO, a dangling link) must be a file.
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    return harmony_stop_tokens(tokenizer);
  std::vector<TokenId> ids = generation_config_stop_tokens(
      read_small_file(path, kMaxGenerationConfigBytes, "generation config"), path);
  if (ids.empty()) return harmony_stop_tokens(tokenizer);
  return ids;
}

}  // namespace parity
