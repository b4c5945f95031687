#include "device/runtime/kv_blocks.h"

#include <algorithm>

#include "model/error.h"

namespace parity::device {

namespace {
constexpr int32_t kPending =
    -2;  // in a planned table: a block still to be taken from the free list
}

KvDtype kv_cache_dtype(const Config& c, Precision precision) {
  AttentionShape a;
  a.n_heads = c.num_attention_heads;
  a.n_kv = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  return kv_cache_dtype(a, precision);
}

std::string_view kv_dtype_name(KvDtype t) {
  return t == KvDtype::bf16 ? "bf16" : "f32";
}

KvLayout KvLayout::of(const Config& c, int block_size, KvDtype dtype) {
  if (block_size < 1 || block_size > (1 << 16) || (block_size & (block_size - 1)) != 0)
    fail("KV cache: block size {} must be a power of two from 1 to 65536", block_size);
  KvLayout k;
  k.block_size = block_size;
  while ((1 << k.block_shift) < block_size) ++k.block_shift;
  k.kv_dim = c.kv_dim();
  k.dtype = dtype;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int g = c.sliding(l) && c.sliding_window > 0 ? kKvSlidingGroup : kKvFullGroup;
    k.group_of_layer.push_back(g);
    k.slot_of_layer.push_back(k.layers_in_group[size_t(g)]++);
  }
  k.window = k.has_group(kKvSlidingGroup) ? c.sliding_window : 0;
  k.slots = std::max(k.layers_in_group[0], k.layers_in_group[1]);
  return k;
}

size_t KvLayout::block_elements() const {
  return size_t(slots) * 2 * size_t(block_size) * size_t(kv_dim);
}

int KvLayout::blocks_for(int positions) const {
  return int((int64_t(positions) + block_size - 1) >> block_shift);
}

int KvLayout::blocks_per_sequence(int max_context, int step_rows) const {
  int n = 0;
  if (has_group(kKvFullGroup)) n += blocks_for(max_context);
  if (has_group(kKvSlidingGroup)) {
    // The rows of a step starting at F read keys from F - window + 1 on: window - 1 + step_rows
    // positions, over at most one block more than they fill.
    const int64_t span = int64_t(window) - 1 + std::max(step_rows, 1);
    n += int(std::min<int64_t>(blocks_for(max_context), (span + block_size - 1) / block_size + 1));
  }
  return n;
}

KvBlockManager::KvBlockManager(KvLayout layout, int num_blocks, int max_context)
    : layout_(std::move(layout)), num_blocks_(num_blocks), max_context_(max_context) {
  if (num_blocks < 0 || max_context < 1)
    fail("KV cache: {} blocks for sequences of {} positions", num_blocks, max_context);
  clear();
}

void KvBlockManager::clear() {
  seqs_.clear();
  free_.resize(size_t(num_blocks_));
  for (int i = 0; i < num_blocks_; ++i) free_[size_t(i)] = num_blocks_ - 1 - i;  // 0 on top
}

int KvBlockManager::length(int seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

std::span<const int32_t> KvBlockManager::table(int seq, int g) const {
  PARITY_CHECK(g >= 0 && g < kKvGroups, "KV cache: no layer group {}", g);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.tables[size_t(g)];
}

int KvBlockManager::blocks_held(int seq) const {
  int n = 0;
  for (int g = 0; g < kKvGroups; ++g)
    for (int32_t b : table(seq, g)) n += b != kNoBlock;
  return n;
}

KvBlockManager::Change KvBlockManager::plan(int seq, int first, int end) const {
  const auto it = seqs_.find(seq);
  const int cached = it == seqs_.end() ? 0 : it->second.length;
  PARITY_CHECK(first >= 0 && first <= cached && end > first && end <= max_context_,
               "KV cache: sequence {} steps over positions [{}, {}) with {} cached (limit {})", seq,
               first, end, cached, max_context_);
  Change ch;
  ch.seq = seq;
  ch.end = end;
  const int hi = layout_.blocks_for(end);
  for (int g = 0; g < kKvGroups; ++g) {
    if (!layout_.has_group(g)) continue;
    std::vector<int32_t> table;
    if (it != seqs_.end()) table = it->second.tables[size_t(g)];
    // The oldest key any row of this step (or a later one) reads in this group.
    const int lo_pos = g == kKvSlidingGroup ? std::max(0, first - layout_.window + 1) : 0;
    const int lo = lo_pos >> layout_.block_shift;
    // Cached keys [lo_pos, first) are read by this step's rows: their blocks must still be there.
    for (int b = lo; b < layout_.blocks_for(first); ++b)
      if (size_t(b) >= table.size() || table[size_t(b)] == kNoBlock)
        fail(
            "KV cache: sequence {} restarts at position {}, but its sliding-window keys from "
            "position {} on were released when the window moved past them (HINT: release the "
            "sequence, or reset the backend, and run it again from position 0)",
            seq, first, lo_pos);
    for (size_t b = size_t(hi); b < table.size(); ++b)  // a restart before the end: the tail
      if (table[b] != kNoBlock) ch.released.push_back(table[b]);
    table.resize(size_t(hi), kNoBlock);
    for (int b = 0; b < lo; ++b) {  // slid out of the window
      if (table[size_t(b)] != kNoBlock) ch.released.push_back(table[size_t(b)]);
      table[size_t(b)] = kNoBlock;
    }
    for (int b = lo; b < hi; ++b)
      if (table[size_t(b)] == kNoBlock) {
        table[size_t(b)] = kPending;
        ++ch.needed;
      }
    ch.tables[size_t(g)] = std::move(table);
  }
  return ch;
}

void KvBlockManager::apply(std::vector<Change>& changes) {
  size_t needed = 0, released = 0;
  for (const auto& ch : changes) {
    needed += size_t(ch.needed);
    released += ch.released.size();
  }
  if (needed > free_.size() + released) {
    size_t held = 0;
    for (const auto& [seq, s] : seqs_) held += size_t(blocks_held(seq));
    fail(
        "KV cache pool exhausted: the step needs {} new blocks of {} positions and {} are free "
        "(the pool has {}; {} sequences hold {}) (HINT: a larger pool: DeviceOptions::kv_bytes or "
        "PARITY_DEVICE_KV_BYTES; or release finished sequences)",
        needed, layout_.block_size, free_.size() + released, num_blocks_, seqs_.size(), held);
  }
  for (const auto& ch : changes) free_.insert(free_.end(), ch.released.begin(), ch.released.end());
  for (auto& ch : changes) {
    for (auto& table : ch.tables)
      for (int32_t& b : table)
        if (b == kPending) {
          b = free_.back();
          free_.pop_back();
        }
    Sequence& s = seqs_[ch.seq];
    s.length = ch.end;
    s.tables = std::move(ch.tables);
  }
}

std::map<int, SequenceStep> KvBlockManager::begin_step(const Batch& b, const Config& c) {
  const auto steps = check_batch(b, c, max_context_, [&](int seq) { return length(seq); });
  std::vector<Change> changes;
  for (const auto& [seq, step] : steps) changes.push_back(plan(seq, step.first, step.end));
  apply(changes);
  return steps;
}

void KvBlockManager::append(int seq, int first, int end) {
  if (first < 0 || first > length(seq) || end <= first || end > max_context_)
    fail("KV cache: sequence {} cannot take positions [{}, {}): {} cached, at most {} positions",
         seq, first, end, length(seq), max_context_);
  std::vector<Change> changes{plan(seq, first, end)};
  apply(changes);
}

void KvBlockManager::release(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (const auto& table : it->second.tables)
    for (int32_t b : table)
      if (b != kNoBlock) free_.push_back(b);
  seqs_.erase(it);
}

}  // namespace parity::device
