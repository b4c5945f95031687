#include "engine/work_queue.h"

#include "model/error.h"

namespace parity {

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::context:
      return "context";
    case FinishReason::error:
      return "error";
  }
  return "?";
}

LocalQueue::LocalQueue(std::vector<EngineRequest> requests)
    : results_(requests.size()), finished_(requests.size(), false) {
  for (size_t i = 0; i < requests.size(); ++i) pending_.push_back({i, std::move(requests[i])});
}

std::optional<WorkItem> LocalQueue::next() {
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return std::nullopt;
  WorkItem item = std::move(pending_.front());
  pending_.pop_front();
  return item;
}

void LocalQueue::done(size_t index, EngineResult result) {
  std::lock_guard lock(mutex_);
  PARITY_CHECK(index < results_.size() && !finished_[index], "request {} completed twice or unknown",
               index);
  generated_ += int64_t(result.generated.size());
  results_[index] = std::move(result);
  finished_[index] = true;
  ++completed_;
}

size_t LocalQueue::completed() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

int64_t LocalQueue::generated_tokens() const {
  std::lock_guard lock(mutex_);
  return generated_;
}

std::vector<EngineResult> LocalQueue::take_results() {
  std::lock_guard lock(mutex_);
  PARITY_CHECK(completed_ == results_.size(), "{} of {} requests completed", completed_,
               results_.size());
  return std::move(results_);
}

}  // namespace parity
