#include "device/runtime/serving_limits.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "device/runtime/arena_layout.h"
#include "device/runtime/kv_blocks.h"
#include "device/runtime/memory_report.h"
#include "model/error.h"

namespace parity::device {

size_t step_activation_bytes(const Config& c, int rows, int max_context) {
  // Scores/att are packed [heads, pos + 2] per row (device/runtime/step_layout.h): at most
  // heads x (max_context + 1) for a row at the last position.
  return ArenaLayout::of(c, rows, max_context).bytes +
         scores_bytes(int64_t(rows) * c.num_attention_heads * (int64_t(max_context) + 1));
}

ServingLimits size_serving_limits(const Config& c, const ServingMemory& m) {
  PARITY_CHECK(m.max_context > 0 && m.step_tokens >= 0 && m.max_batch >= 0,
               "serving limits: context {}, step tokens {}, max batch {}", m.max_context,
               m.step_tokens, m.max_batch);
  ServingLimits l;
  l.budget_bytes = m.free_bytes > m.weights_bytes ? m.free_bytes - m.weights_bytes : 0;
  // A step holds every decoding sequence's row: its rows are at least the batch.
  const auto rows_of = [&](int step) { return std::max(step, m.max_batch); };
  l.step_tokens = m.step_tokens;
  if (l.step_tokens == 0) {
    l.step_tokens_sized = true;
    l.step_tokens = kServingMaxStepTokens;
    while (l.step_tokens > kServingMinStepTokens &&
           step_activation_bytes(c, rows_of(l.step_tokens), m.max_context) >
               l.budget_bytes / kServingActivationShare)
      l.step_tokens /= 2;
  }
  const int rows = rows_of(l.step_tokens);
  l.activation_bytes = step_activation_bytes(c, rows, m.max_context);

  const KvLayout kv = KvLayout::of(c, m.kv_block_size, kv_cache_dtype(c, m.precision));
  const size_t block = kv.block_bytes();
  size_t blocks = 0;
  if (m.kv_bytes > 0) {
    blocks = m.kv_bytes / block;
  } else {
    const size_t left =
        l.budget_bytes > l.activation_bytes ? l.budget_bytes - l.activation_bytes : 0;
    blocks = size_t(std::floor(double(left) * m.kv_free_fraction / double(block)));
  }
  l.kv_blocks = int(std::min<size_t>(blocks, size_t(std::numeric_limits<int32_t>::max())));
  l.kv_bytes = size_t(l.kv_blocks) * block;
  l.nominal_positions = std::min(kServingNominalPositions, m.max_context);
  l.nominal_sequences = l.kv_blocks / kv.blocks_per_sequence(l.nominal_positions, rows);

  l.max_batch = m.max_batch;
  if (l.max_batch == 0) {
    l.max_batch_sized = true;
    l.max_batch = std::max(1, std::min({kServingMaxBatch, l.step_tokens, l.nominal_sequences}));
  }
  return l;
}

std::string ServingLimits::text() const {
  const std::string batch =
      max_batch_sized
          ? fmt::format(
                "--max-batch {} (the least of {}, the step tokens and the {} sequences of {} "
                "positions that the KV pool of {} holds)",
                max_batch, kServingMaxBatch, nominal_sequences, nominal_positions,
                format_bytes(kv_bytes))
          : fmt::format(
                "--max-batch {} (given; the KV pool of {} holds {} sequences of {} "
                "positions)",
                max_batch, format_bytes(kv_bytes), nominal_sequences, nominal_positions);
  const bool floor = step_tokens_sized && step_tokens == kServingMinStepTokens &&
                     activation_bytes > budget_bytes / kServingActivationShare;
  const std::string step =
      floor ? fmt::format(
                  "--step-tokens {} (the smallest it sizes; its activations, {} at most, "
                  "take more than a quarter of the {} the weights leave free)",
                  step_tokens, format_bytes(activation_bytes), format_bytes(budget_bytes))
      : step_tokens_sized
          ? fmt::format(
                "--step-tokens {} (the largest of {} to {} whose activations, {} at most, take "
                "a quarter or less of the {} the weights leave free)",
                step_tokens, kServingMaxStepTokens, kServingMinStepTokens,
                format_bytes(activation_bytes), format_bytes(budget_bytes))
          : fmt::format("--step-tokens {} (given; activations {} at most)", step_tokens,
                        format_bytes(activation_bytes));
  return batch + ", " + step;
}

}  // namespace parity::device
