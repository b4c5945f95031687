// The paged KV cache's bookkeeping, on the host (no GPU toolkit needed): how a model's layers
// share blocks (KvLayout), and which blocks each sequence holds (KvBlockManager): a free list,
// a block table per sequence and layer group, blocks allocated as a sequence grows and, on
// sliding-window layers, released as they slide out of the window. The device memory itself is
// device/runtime/kv_cache_pool.h; the kernels read it through KvCacheView (device/kernel_types.h).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string_view>
#include <vector>

#include "device/kernel_types.h"
#include "model/backend.h"
#include "model/config.h"

namespace parity::device {

inline constexpr int32_t kNoBlock = -1;  // a block-table entry with no block behind it

// The cache's dtype for model `c` computed in `precision` (kv_cache_dtype of its layers' shape).
KvDtype kv_cache_dtype(const Config& c, Precision precision);
std::string_view kv_dtype_name(KvDtype t);  // "f32", "bf16"

// Layers are grouped by attention kind: the full-attention layers (group 0) and the sliding-
// window layers (group 1) each page their own blocks, so a sliding layer keeps only its window.
// A block holds block_size positions of one sequence for every layer of one group (`slots`
// layer slots: the larger group's layer count), keys and values:
//   [slot][K, V][position in block][kv_dim] of `dtype` (float32, or BF16: kv_cache_dtype).
struct KvLayout {
  int block_size = 0, block_shift = 0;
  int kv_dim = 0;
  KvDtype dtype = KvDtype::f32;
  int window = 0;  // of the sliding group; 0 when the model has no sliding layer
  int slots = 0;
  std::array<int, kKvGroups> layers_in_group{};
  std::vector<int> group_of_layer, slot_of_layer;

  // Throws unless block_size is a power of two.
  static KvLayout of(const Config& c, int block_size, KvDtype dtype = KvDtype::f32);

  size_t block_elements() const;
  size_t block_bytes() const { return block_elements() * size_t(kv_dtype_bytes(dtype)); }
  int blocks_for(int positions) const;  // blocks covering positions [0, positions)
  // Blocks one sequence holds at most with up to max_context positions, written in steps of up
  // to step_rows rows: every block on full layers; on sliding layers the window plus one step.
  int blocks_per_sequence(int max_context, int step_rows) const;
  bool has_group(int g) const { return layers_in_group[size_t(g)] > 0; }
};

// The blocks of a pool of num_blocks blocks and the sequences that hold them. Block ids are
// indices into the pool; a sequence's table for a group maps its logical block (position /
// block_size) to a block id, kNoBlock where released (slid out of the window).
class KvBlockManager {
 public:
  KvBlockManager(KvLayout layout, int num_blocks, int max_context);

  // One step: validates the batch like every backend (check_batch: token ids, positions in the
  // model's context and under max_context, each sequence's rows contiguous from its cached
  // length), then, per sequence, releases its sliding-window blocks that no row of this step
  // or later can see and allocates blocks for the step's new positions. All or nothing: on an
  // invalid batch, an exhausted pool or a restart behind a released window it throws
  // parity::Error and nothing changes. Returns each sequence's first and end position.
  std::map<int, SequenceStep> begin_step(const Batch& b, const Config& c);

  // One sequence at a time, for a scheduler: makes room for positions [first, end) of `seq`
  // (first at or before its cached length), as begin_step does; all or nothing.
  void append(int seq, int first, int end);
  // Returns every block of `seq` to the free list and forgets it.
  void release(int seq);
  void clear();  // every sequence

  int length(int seq) const;  // positions cached; 0 for an unknown sequence
  // The sequence's table for group g: blocks_for(length) entries (empty for an unknown sequence
  // or a group with no layers).
  std::span<const int32_t> table(int seq, int g) const;
  int blocks_held(int seq) const;
  int free_blocks() const { return int(free_.size()); }
  int num_blocks() const { return num_blocks_; }
  int sequences() const { return int(seqs_.size()); }
  int max_context() const { return max_context_; }
  const KvLayout& layout() const { return layout_; }

 private:
  struct Sequence {
    int length = 0;
    std::array<std::vector<int32_t>, kKvGroups> tables;
  };
  // What one sequence's step changes: its new tables (kPending where a block is to be taken),
  // the blocks it gives back, how many it takes.
  struct Change {
    int seq = 0, end = 0;
    std::array<std::vector<int32_t>, kKvGroups> tables;
    std::vector<int32_t> released;
    int needed = 0;
  };
  Change plan(int seq, int first, int end) const;
  void apply(std::vector<Change>& changes);

  KvLayout layout_;
  int num_blocks_ = 0;
  int max_context_ = 0;
  std::vector<int32_t> free_;  // a stack: the most recently released block is taken first
  std::map<int, Sequence> seqs_;
};

}  // namespace parity::device
