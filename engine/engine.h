// The `run` engine: continuous batching (engine/scheduler.h) of many requests on a StepRunner
// (engine/step_runner.h). Each step runs every running sequence's next rows -- one decode row
// each, then chunks of the prompts being prefilled while the step's token budget lasts -- and
// samples the sequences whose rows reached their end. A sequence retires as soon as it ends (a
// stop token, max_tokens generated, or the context full) and the next request takes its slot in
// the next step.
//
// Admission is bounded by the KV cache: a request is admitted only when the blocks it can ever
// hold (its prompt plus max_tokens, capped at the context; sliding-window layers only their
// window) fit beside those reserved by the running ones. A running sequence therefore never runs
// out of cache, nothing is preempted, and a request larger than the whole cache is refused with
// its sizes instead of waiting forever.
//
// A request's tokens depend only on its prompt, its id and the sampling parameters: each row is
// computed from its own sequence's cache (row-independent kernels and backends), and the
// generator is keyed by (seed, request id, step).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "tokenizer/tokenizer.h"
#include "engine/work_queue.h"
#include "model/backend.h"

namespace parity {

struct EngineOptions {
  SchedulerLimits limits;
  int max_tokens = 128;  // generated tokens per request at most (>= 1), unless the request says
  int context = 0;       // positions per sequence; 0: the runner's (the model's or the device's)
  SamplingParams sampling;
  std::vector<TokenId> stop_tokens;  // generation ends after one of these (kept in the output)
};

struct EngineStats {
  size_t requests = 0, failed = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefill_rows = 0, decode_rows = 0, steps = 0;
  double wall_seconds = 0;
  // Step time shared between prefill and decode in proportion to their rows in the step.
  double prefill_seconds = 0, decode_seconds = 0;
  // Per request that produced a token: the time to its first token (from the start of the run).
  std::vector<double> ttft_seconds;
  // Per request that produced at least two: the time per output token after the first, (time of
  // its last token - time of its first) / (tokens - 1), as vLLM's benchmark reports TPOT.
  std::vector<double> tpot_seconds;
  double ttft_percentile(double q) const;  // nearest rank; 0 with none
  double tpot_percentile(double q) const;
  void merge(const EngineStats& o);  // another engine's (several GPUs or ranks)
};

// The q-quantile of `values` by nearest rank (q in (0, 1]); 0 when there are none.
double nearest_rank_percentile(std::vector<double> values, double q);

using Clock = std::chrono::steady_clock;

class Engine {
 public:
  // Throws parity::Error on bad options (sampling values, max_tokens, limits, context).
  Engine(StepRunner& runner, const EngineOptions& options);
  // The engine on a parity Backend (a GraphRunner of its own).
  Engine(Backend& backend, const EngineOptions& options);
  ~Engine();

  // Why `request` cannot run ("empty prompt", "N tokens, longer than the context of C
  // positions", a token outside the vocabulary, max_tokens above the context, more KV blocks
  // than the cache holds), or "".
  std::string check_request(const EngineRequest& request) const;
  // check_request of a request of `prompt` with the options' max_tokens.
  std::string check_prompt(const std::vector<TokenId>& prompt) const;

  // Called with (index of the request in its source, token) as each token is sampled.
  using TokenCallback = std::function<void(size_t index, TokenId token)>;

  // Runs requests from `source` until it has no more and each one taken has finished; each
  // result goes back to the source as its request ends (a request that fails check_prompt
  // comes back at once with finish == error). Time to first token counts from `start`;
  // results are marked with `worker`.
  void run(WorkSource& source, const TokenCallback& on_token = {},
           Clock::time_point start = Clock::now(), int worker = 0);
  // Convenience: every request of the list, results in its order. Every request must pass
  // check_request (a parity::Error otherwise).
  std::vector<EngineResult> run(const std::vector<EngineRequest>& requests,
                                const TokenCallback& on_token = {});

  const EngineStats& stats() const { return stats_; }
  int context() const { return context_; }
  StepRunner& runner() { return runner_; }

 private:
  void init();  // validates the options
  // KV blocks a request may ever hold.
  int reserve_blocks(size_t prompt_length, int max_tokens) const;

  std::unique_ptr<StepRunner> owned_runner_;
  StepRunner& runner_;
  EngineOptions options_;
  int context_ = 0;
  EngineStats stats_;
};

// The model's stop tokens: generation_config.json's eos_token_id (a number or a list) in
// `model_dir` when there is one, else the harmony stop tokens of `tokenizer`
// (tokenizer/harmony.h). A malformed generation_config.json is an Error naming it.
std::vector<TokenId> model_stop_tokens(const std::string& model_dir, const Tokenizer& tokenizer);

// The stop tokens of a generation_config.json's text (`source` names it in errors): its
// eos_token_id, one id or a list of them; empty when it has none. Bad JSON, a value that is not
// a token id, trailing bytes: one Error naming `source`.
std::vector<TokenId> generation_config_stop_tokens(std::string_view text,
                                                   const std::string& source);

// generation_config.json is a few hundred bytes; a larger one is not one.
inline constexpr uint64_t kMaxGenerationConfigBytes = uint64_t(1) << 20;

}  // namespace parity
