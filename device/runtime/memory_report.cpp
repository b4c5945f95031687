#include "device/runtime/memory_report.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/error.h"

namespace parity::device {

std::string format_bytes(size_t b) {
  const double x = double(b);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return fmt::format("{:.1f} KiB", x / 1024.0);
  return fmt::format("{} B", b);
}

MemoryReport MemoryReport::plan(const DeviceOptions& o, const Config& c, int max_context,
                                const WeightPlan& weights, std::string device, size_t free_bytes,
                                size_t total_bytes, const ShardPlan* shard) {
  MemoryReport r;
  if (shard != nullptr) r.degree = shard->degree, r.rank = shard->rank;
  r.device = std::move(device);
  r.free_bytes = free_bytes;
  r.total_bytes = total_bytes;
  r.weights_bytes = weights.total;
  r.weights_by_kind = weights.bytes_by_kind;
  r.arena_rows = o.arena_rows;
  r.arena_bytes = ArenaLayout::of(c, o.arena_rows, max_context).bytes;
  if (shard != nullptr &&
      shard->degree > 1)  // the all-reduces' gathered parts (DeviceRuntime::all_reduce)
    r.arena_bytes += size_t(shard->degree) * sizeof(float) *
                     size_t(shard_join_floats(c, shard->degree, o.arena_rows, kShardJoinRows));
  r.scores_bytes = device::scores_bytes(scores_floats_for_one_row(c, max_context));
  r.kv = KvLayout::of(c, o.kv_block_size, kv_cache_dtype(c, o.precision));
  if (shard != nullptr) r.kv.kv_dim = shard->kv_heads.size() * c.head_dim;  // its KV heads
  r.max_context = max_context;
  r.sequence_blocks = r.kv.blocks_per_sequence(max_context, o.arena_rows);
  const size_t block = r.kv.block_bytes();
  const size_t max_blocks = size_t(std::numeric_limits<int32_t>::max());
  size_t blocks = 0;
  if (o.kv_bytes > 0) {
    blocks = o.kv_bytes / block;
  } else if (o.kv_sequences > 0) {
    blocks = size_t(o.kv_sequences) * size_t(r.sequence_blocks);
  } else {
    const size_t rest = r.weights_bytes + r.arena_bytes + r.scores_bytes;
    const size_t left = free_bytes > rest ? free_bytes - rest : 0;
    blocks = size_t(std::floor(double(left) * o.kv_free_fraction / double(block)));
  }
  r.kv_blocks = int(std::min(blocks, max_blocks));
  return r;
}

std::string MemoryReport::text() const {
  std::string by_kind;
  for (const auto& [kind, bytes] : weights_by_kind)
    by_kind += fmt::format("{}{} {}", by_kind.empty() ? "" : ", ", kind, format_bytes(bytes));
  std::string groups;
  if (kv.has_group(kKvFullGroup))
    groups += fmt::format("{} full-attention layers keep every block", kv.layers_in_group[0]);
  if (kv.has_group(kKvSlidingGroup))
    groups += fmt::format("{}{} sliding layers only their window of {}", groups.empty() ? "" : ", ",
                          kv.layers_in_group[1], kv.window);
  const std::string rank_line =
      degree > 1 ? fmt::format(
                       "  tensor parallel: rank {} of {}: its part of the weights, its KV "
                       "heads, its activations with the all-reduces' parts\n",
                       rank, degree)
                 : std::string();
  return fmt::format(
      "device runtime on {}: {} free of {}\n"
      "{}"
      "  weights      {} ({})\n"
      "  KV cache     {}: {} blocks of {} positions x {} layers x {} x K,V x {} ({} each); a "
      "sequence of {} positions holds up to {} blocks ({}): room for {}\n"
      "  activations  {} for {} rows per step, scores/att {} (both grow with the step)\n"
      "  total        {}\n",
      device, format_bytes(free_bytes), format_bytes(total_bytes), rank_line,
      format_bytes(weights_bytes), by_kind, format_bytes(kv_bytes()), kv_blocks, kv.block_size,
      kv.slots, kv.kv_dim, kv_dtype_name(kv.dtype), format_bytes(kv.block_bytes()), max_context,
      sequence_blocks, groups, sequences(), format_bytes(arena_bytes), arena_rows,
      format_bytes(scores_bytes), format_bytes(need()));
}

std::string MemoryReport::refusal(const std::string& model_name) const {
  const std::string model =
      degree > 1 ? fmt::format("{} (tensor parallel rank {} of {})", model_name, rank, degree)
                 : model_name;
  if (need() > free_bytes)
    return fmt::format(
        "{}: the model does not fit on {}: weights {} + activations {} + KV cache {} ({} blocks "
        "of {} positions) = {}, but only {} is free (HINT: a smaller KV cache "
        "(PARITY_DEVICE_KV_BYTES, DeviceOptions::kv_bytes), a shorter context "
        "(PARITY_DEVICE_MAX_CONTEXT) or fewer rows per step (PARITY_DEVICE_ROWS); or a larger GPU)",
        model, device, format_bytes(weights_bytes), format_bytes(arena_bytes + scores_bytes),
        format_bytes(kv_bytes()), kv_blocks, kv.block_size, format_bytes(need()),
        format_bytes(free_bytes));
  if (kv_blocks < sequence_blocks)
    return fmt::format(
        "{}: the KV cache of {} on {} holds {} blocks of {} positions, but one sequence of {} "
        "positions needs {} ({} each) (HINT: a larger KV cache (PARITY_DEVICE_KV_BYTES, "
        "DeviceOptions::kv_bytes) or a shorter context (PARITY_DEVICE_MAX_CONTEXT))",
        model, format_bytes(kv_bytes()), device, kv_blocks, kv.block_size, max_context,
        sequence_blocks, format_bytes(kv.block_bytes()));
  return {};
}

}  // namespace parity::device
