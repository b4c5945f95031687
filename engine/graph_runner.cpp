#include "engine/graph_runner.h"

#include "model/error.h"
#include "model/forward.h"

namespace parity {

GraphRunner::GraphRunner(Backend& backend, int kv_blocks, int kv_block_size)
    : backend_(backend), kv_blocks_(kv_blocks), kv_block_size_(kv_block_size) {
  if (kv_blocks_ < 0) fail("KV blocks {}: cannot be negative", kv_blocks_);
  if (kv_block_size_ < 1) fail("KV block size {}: at least one position", kv_block_size_);
}

std::vector<TokenId> GraphRunner::step(const Batch& batch, std::span<const RowSample> samples,
                                       const SamplingParams& sampling) {
  forward(backend_, batch);
  std::vector<TokenId> tokens;
  tokens.reserve(samples.size());
  for (const RowSample& s : samples) {
    const StageData row = backend_.read(Stage::logits, kModelLayer, s.row);
    logits_.resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) logits_[i] = row.at(i);
    tokens.push_back(sample_token(logits_, sampling, s.request, s.step));
  }
  return tokens;
}

}  // namespace parity
