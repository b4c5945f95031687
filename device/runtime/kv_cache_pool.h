// The paged KV cache on the device: one allocation of fixed-size blocks (KvLayout) whose
// bookkeeping -- free list, per-sequence block tables, sliding-window release -- is the host's
// KvBlockManager. Sized once, from a byte budget or the free memory (MemoryReport::plan).
// The attention kernels read it through view(), with the step's uploaded block tables.
#pragma once
#include <cstddef>

#include "device/hip_compat.h"
#include "device/kernel_types.h"
#include "device/runtime/device_buffer.h"
#include "device/runtime/kv_blocks.h"

namespace parity::device {

class KvCachePool {
 public:
  // Allocates num_blocks blocks and zeroes them on `stream` (no key is ever read before it is
  // written; zeros keep a stray read deterministic).
  KvCachePool(KvLayout layout, int num_blocks, int max_context, hipStream_t stream);

  KvBlockManager& blocks() { return blocks_; }
  const KvBlockManager& blocks() const { return blocks_; }
  const KvLayout& layout() const { return blocks_.layout(); }
  size_t bytes() const { return pool_.bytes(); }
  // The blocks, elements of layout().dtype.
  void* data() const { return pool_.as<void>(); }

  // The kernels' view, with the block tables of the current step (device memory).
  KvCacheView view(const int32_t* step_block_tables) const {
    return {pool_.as<void>(), step_block_tables, layout().block_shift, layout().slots,
            layout().dtype};
  }

 private:
  KvBlockManager blocks_;
  DeviceBuffer pool_;
};

}  // namespace parity::device
