// What the runtime takes on the device, set against the free memory, decided before anything is
// allocated: the weights, the activation arena, the paged KV pool (whose size it decides from
// DeviceOptions), and the refusal, with the sizes, of a model that does not fit. Host
// arithmetic (no GPU toolkit needed); the runtime fills in the device's free memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "device/runtime/arena_layout.h"
#include "device/runtime/kv_blocks.h"
#include "device/runtime/options.h"
#include "device/runtime/shard_plan.h"
#include "device/runtime/weight_plan.h"

namespace parity::device {

std::string format_bytes(size_t bytes);  // "1.50 GiB", "85.5 MiB", "512 B"

struct MemoryReport {
  std::string device;  // "NVIDIA H100 80GB HBM3 (sm_90)"
  size_t free_bytes = 0, total_bytes = 0;

  size_t weights_bytes = 0;
  std::map<std::string, size_t> weights_by_kind;
  size_t arena_bytes = 0;  // stage outputs and the attention workspace for arena_rows rows
  int arena_rows = 0;
  size_t scores_bytes = 0;  // scores/att for one row at the end of the context

  KvLayout kv;
  int max_context = 0;
  int kv_blocks = 0;        // the pool
  int sequence_blocks = 0;  // blocks one sequence of max_context positions holds at most
  size_t kv_bytes() const { return size_t(kv_blocks) * kv.block_bytes(); }
  // Sequences of max_context positions the pool holds at once.
  int sequences() const { return sequence_blocks > 0 ? kv_blocks / sequence_blocks : 0; }

  // Tensor parallelism: this device is rank `rank` of `degree` (1: the whole model).
  int degree = 1, rank = 0;

  // Decides the KV pool's size from the options (kv_bytes, else kv_sequences, else the free
  // fraction of what the weights and activations leave free) and fills every field. With a shard
  // plan, for that rank: `weights` is its part (plan_weights with the plan), its KV blocks hold
  // its KV heads only, and the activations add the all-reduces' gathered parts
  // (shard_join_floats); they are the rank's with `c` its rank_config (as the runtime plans), an
  // upper bound with the whole model's.
  static MemoryReport plan(const DeviceOptions& o, const Config& c, int max_context,
                           const WeightPlan& weights, std::string device, size_t free_bytes,
                           size_t total_bytes, const ShardPlan* shard = nullptr);

  size_t need() const { return weights_bytes + arena_bytes + scores_bytes + kv_bytes(); }
  // Everything fits in the free memory and the pool holds one sequence of max_context positions.
  bool fits() const { return need() <= free_bytes && kv_blocks >= sequence_blocks; }
  std::string text() const;  // the report printed at load, one line per part
  // Why it does not fit, with the sizes and what to change; empty when it fits.
  std::string refusal(const std::string& model) const;
};

}  // namespace parity::device
