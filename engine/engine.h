// The `run` engine on a Backend (model/backend.h): continuous batching (engine/scheduler.h) of
// many requests, the forward graph run once per step over every row (model/forward.h), each
// finished sequence sampled from its last row's logits (engine/sampler.h), and sequences retired
// as soon as they end -- a stop token, max_tokens generated, or the context full -- so that the
// next waiting request takes their slot in the next step.
//
// A request's tokens depend only on its prompt, its id and the sampling parameters: each row of a
// step is computed from its own sequence's cache (the reference and cpu-f32 backends are row
// independent), and the generator is keyed by (seed, request id, step).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "model/backend.h"

namespace parity {

struct EngineOptions {
  SchedulerLimits limits;
  int max_tokens = 128;  // generated tokens per request at most (>= 1)
  int context = 0;       // positions per sequence; 0: the model's max_position_embeddings
  SamplingParams sampling;
  std::vector<TokenId> stop_tokens;  // generation ends after one of these (kept in the output)
};

struct EngineRequest {
  uint64_t id = 0;  // keys the request's generator
  std::vector<TokenId> prompt;
};

enum class FinishReason { stop, length, context };
const char* finish_name(FinishReason r);

struct EngineResult {
  std::vector<TokenId> generated;
  FinishReason finish = FinishReason::length;
  double ttft_seconds = 0;  // from the start of run() to the first generated token
};

struct EngineStats {
  size_t requests = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefill_rows = 0, decode_rows = 0, steps = 0;
  double wall_seconds = 0;
  // Step time shared between prefill and decode in proportion to their rows in the step.
  double prefill_seconds = 0, decode_seconds = 0;
  std::vector<double> ttft_seconds;        // per request, in request order
  double ttft_percentile(double q) const;  // nearest rank; 0 with no requests
};

class Engine {
 public:
  // Throws parity::Error on bad options (sampling values, max_tokens, limits, context).
  Engine(Backend& backend, const EngineOptions& options);

  // Why `prompt` cannot run ("empty prompt", "N tokens, longer than the context of C
  // positions"), or "" when it can.
  std::string check_prompt(const std::vector<TokenId>& prompt) const;

  // Called with (index of the request in run()'s list, token) as each token is sampled.
  using TokenCallback = std::function<void(size_t request, TokenId token)>;

  // Runs every request to its end from empty caches; results in the order of `requests`. Every
  // prompt must pass check_prompt (a parity::Error otherwise).
  std::vector<EngineResult> run(const std::vector<EngineRequest>& requests,
                                const TokenCallback& on_token = {});

  const EngineStats& stats() const { return stats_; }
  int context() const { return context_; }

 private:
  Backend& backend_;
  EngineOptions options_;
  int context_ = 0;
  EngineStats stats_;
};

// The model's stop tokens: generation_config.json's eos_token_id (a number or a list) in
// `model_dir` when there is one, else the harmony stop tokens of `tokenizer`
// (engine/harmony.h). A malformed generation_config.json is an Error naming it.
std::vector<TokenId> model_stop_tokens(const std::string& model_dir, const Tokenizer& tokenizer);

}  // namespace parity
