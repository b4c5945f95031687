// The `run` engine's batch limits on a GPU when the user gives none, sized from the memory the
// weights leave free, as vLLM sizes its batch and KV cache after profiling a step. Host
// arithmetic (no GPU toolkit needed): tools/run.cpp calls it with the device's free memory and
// the weight plan before the runtime loads, and passes the KV pool it decides to the runtime.
//
// The rule, for B = free memory - weights:
//  1. step tokens: the largest of 4096, 2048, ..., 64 rows whose activations at their largest
//     take at most a quarter of B. At their largest: the arena for that many rows
//     (ArenaLayout, logits included) plus the scores/att rows of every row at the end of the
//     context (what the arena grows to in the worst step), so no step can run out of memory.
//  2. the KV pool: the free fraction (90 %) of B less those activations (or the bytes asked for).
//  3. max batch: min(512, step tokens, the sequences of 512 positions (prompt and output; the
//     context when shorter) that the pool holds), at least 1. 512 positions: ShareGPT's mean
//     prompt and output as vLLM's benchmark samples them (415 tokens) rounded up to a power of
//     two. Longer requests are bounded by the KV cache itself (the engine admits a request only
//     when its blocks fit), so the batch is a cap, not a promise.
// A limit the user gives is kept (and the others sized around it).
#pragma once
#include <cstddef>
#include <string>

#include "device/kernel_types.h"
#include "model/config.h"

namespace parity::device {

inline constexpr int kServingMaxStepTokens = 4096;
inline constexpr int kServingMinStepTokens = 64;
inline constexpr int kServingMaxBatch = 512;
inline constexpr int kServingNominalPositions = 512;  // the sequence max batch is counted in
inline constexpr int kServingActivationShare = 4;     // activations: 1 / this of B at most

struct ServingMemory {
  size_t free_bytes = 0;     // the device's free memory before the weights
  size_t weights_bytes = 0;  // WeightPlan::total
  int max_context = 0;       // positions per sequence (DeviceOptions::resolve_max_context)
  int kv_block_size = 32;
  double kv_free_fraction = 0.9;
  size_t kv_bytes = 0;  // the pool asked for (--kv-memory); 0: the free fraction
  int step_tokens = 0;  // given (--step-tokens); 0: sized
  int max_batch = 0;    // given (--max-batch); 0: sized
  Precision precision = Precision::fp32;  // the KV cache's dtype follows it (kv_cache_dtype)
};

struct ServingLimits {
  int step_tokens = 0, max_batch = 0;
  bool step_tokens_sized = false, max_batch_sized = false;
  size_t budget_bytes = 0;      // B: free memory less the weights
  size_t activation_bytes = 0;  // the largest activations of a step of max(step, batch) rows
  size_t kv_bytes = 0;          // the pool, whole blocks
  int kv_blocks = 0;
  int nominal_sequences = 0;  // sequences of kServingNominalPositions the pool holds
  int nominal_positions = 0;  // kServingNominalPositions, or the context when shorter

  // "--max-batch 512 (...), --step-tokens 4096 (...)": each value and why.
  std::string text() const;
};

// The largest activations of a step of `rows` rows (see the rule above).
size_t step_activation_bytes(const Config& c, int rows, int max_context);

// The limits by the rule above.
ServingLimits size_serving_limits(const Config& c, const ServingMemory& m);

}  // namespace parity::device
