// Where an engine gets its requests and leaves its results. The engine pulls a request whenever
// it has room for one more sequence, so several engines (one per GPU, engine/engine_pool.h, or
// one per MPI rank, engine/mpi_work.h) sharing one source divide the work dynamically: a fast or
// lightly loaded engine simply asks more often.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace parity {

struct EngineRequest {
  uint64_t id = 0;  // keys the request's generator (engine/sampler.h)
  std::vector<TokenId> prompt;
  int max_tokens = 0;       // generated tokens at most; 0: the engine's (EngineOptions)
  bool ignore_eos = false;  // generate past the stop tokens, up to max_tokens
};

enum class FinishReason { stop, length, context, error };
const char* finish_name(FinishReason r);

struct EngineResult {
  std::vector<TokenId> generated;
  FinishReason finish = FinishReason::length;
  std::string error;        // why the request could not run (finish == error)
  double ttft_seconds = 0;  // from the start of the run to the first generated token
  int worker = 0;           // the engine (GPU, rank) that ran it
};

// A request with its place in the input order.
struct WorkItem {
  size_t index = 0;
  EngineRequest request;
};

class WorkSource {
 public:
  virtual ~WorkSource() = default;
  // The next request, or nullopt when there are no more. Thread-safe.
  virtual std::optional<WorkItem> next() = 0;
  // The result of request `index`. Thread-safe.
  virtual void done(size_t index, EngineResult result) = 0;
};

// Requests held in memory, handed out first come first served; results kept in input order.
class LocalQueue final : public WorkSource {
 public:
  explicit LocalQueue(std::vector<EngineRequest> requests);
  std::optional<WorkItem> next() override;
  void done(size_t index, EngineResult result) override;

  size_t size() const { return results_.size(); }
  size_t completed() const;
  int64_t generated_tokens() const;  // by the completed requests
  // The results, in input order (call once every engine has returned).
  std::vector<EngineResult> take_results();

 private:
  mutable std::mutex mutex_;
  std::deque<WorkItem> pending_;
  std::vector<EngineResult> results_;
  std::vector<bool> finished_;
  size_t completed_ = 0;
  int64_t generated_ = 0;
};

}  // namespace parity
