// The engine's steps on a parity Backend (model/backend.h): the forward graph over every row,
// then each sample drawn on the host by the CPU sampler (engine/sampler.h) from the row's logits.
// Slow on the device (every stage's bookkeeping, full logits copied to the host) but exactly
// what the traced backends compute: CI runs the engine on the CPU backends this way.
#pragma once
#include "engine/step_runner.h"

namespace parity {

class GraphRunner final : public StepRunner {
 public:
  // `kv_blocks` > 0 gives the engine a KV budget of that many blocks of `kv_block_size`
  // positions to plan with (--kv-memory on a host backend; the host caches are not bounded by
  // it, the engine's admission is).
  explicit GraphRunner(Backend& backend, int kv_blocks = 0, int kv_block_size = 32);

  std::string name() const override { return backend_.name(); }
  const Config& config() const override { return backend_.config(); }
  int max_context() const override { return backend_.config().max_position_embeddings; }
  int kv_blocks() const override { return kv_blocks_; }
  int kv_block_size() const override { return kv_block_size_; }
  std::vector<TokenId> step(const Batch& batch, std::span<const RowSample> samples,
                            const SamplingParams& sampling) override;
  void release(int) override {}  // a new sequence in the slot truncates the old cache
  void reset() override { backend_.reset(); }

 private:
  Backend& backend_;
  int kv_blocks_ = 0, kv_block_size_ = 32;
  std::vector<double> logits_;
};

}  // namespace parity
