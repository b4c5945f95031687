// What the engine (engine/engine.h) runs its steps on: a model that takes a batch of rows and
// returns one sampled token for each sequence that asked for one. Two kinds:
//   GraphRunner  (engine/graph_runner.h)  any parity Backend through the forward graph, sampled
//                on the host: the CPU backends (CI) and the traced `hip` backend;
//   DeviceRunner (engine/device_runner.h) the production path on the device runtime: the same
//                kernels without the graph's bookkeeping, logits for the sampled rows only,
//                sampled on the device, one host synchronisation per step.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"
#include "model/backend.h"

namespace parity {

// One token to sample after a step: from the logits of row `row`, with the generator of
// (seed, request, step) -- engine/sampler.h.
struct RowSample {
  int row = 0;
  uint64_t request = 0;
  uint64_t step = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual std::string name() const = 0;  // "cpu-f32", "hip (graph)", "device 0: NVIDIA ..."
  virtual const Config& config() const = 0;
  // Positions per sequence at most (the device's KV cache); the model's context on the host.
  virtual int max_context() const = 0;
  // The KV cache's blocks of kv_block_size() positions (device/runtime/kv_blocks.h's layout);
  // 0 when the cache has no fixed size (host caches grow with the sequences).
  virtual int kv_blocks() const = 0;
  virtual int kv_block_size() const = 0;

  // Runs the batch (rows of sequences, backend sequence ids = the engine's slots) and returns
  // the token of each sample, in order.
  virtual std::vector<TokenId> step(const Batch& batch, std::span<const RowSample> samples,
                                    const SamplingParams& sampling) = 0;
  // Sequence `seq` has ended: its KV cache may be reused.
  virtual void release(int seq) = 0;
  // Drops every sequence.
  virtual void reset() = 0;
  // Per-kernel device times accumulated so far, as a table (empty when not measured).
  virtual std::string kernel_times() const { return {}; }
  // How the steps so far were launched, as one line ("12 steps: 3 captured as graphs, ..."); empty
  // where it does not apply (the host runners).
  virtual std::string launches() const { return {}; }
};

}  // namespace parity
