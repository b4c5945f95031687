#include "device/runtime/kv_cache_pool.h"

namespace parity::device {

KvCachePool::KvCachePool(KvLayout layout, int num_blocks, int max_context, hipStream_t stream)
    : blocks_(std::move(layout), num_blocks, max_context) {
  const size_t bytes = size_t(num_blocks) * blocks_.layout().block_bytes();
  pool_.allocate(bytes);
  if (bytes > 0) HIP_CHECK(hipMemsetAsync(pool_.as(), 0, bytes, stream));
}

}  // namespace parity::device
