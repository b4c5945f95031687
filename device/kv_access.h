// Device side of the paged KV cache's elements (KvCacheView::dtype, device/kernel_types.h):
// loads that widen to float32 and stores that round to the cache's dtype, for the kernels that
// take either cache. Included by .hip files only.
#pragma once
#include <cstdint>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/split_inputs.h"

namespace parity::device {

// Element `at` of the cache, as float32 (exact: BF16 widens without rounding).
__device__ __forceinline__ float kv_load(const KvCacheView& kv, int64_t at) {
  if (kv.dtype == KvDtype::bf16)
    return bf16_bits_to_f32(static_cast<const uint16_t*>(kv.blocks)[at]);
  return static_cast<const float*>(kv.blocks)[at];
}
// Elements at .. at + 3 (at a multiple of 4): one 16-byte load, or 8 bytes of BF16.
__device__ __forceinline__ float4 kv_load4(const KvCacheView& kv, int64_t at) {
  if (kv.dtype == KvDtype::bf16) {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(kv.blocks) + at);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  }
  return *reinterpret_cast<const float4*>(static_cast<const float*>(kv.blocks) + at);
}
// Writes x as element `at`: as is, or rounded to BF16 to nearest even (f32_to_bf16_bits, the
// rounding the bf16 attention applies to every key and value it reads).
__device__ __forceinline__ void kv_store(const KvCacheView& kv, int64_t at, float x) {
  if (kv.dtype == KvDtype::bf16)
    static_cast<uint16_t*>(kv.blocks)[at] = uint16_t(f32_to_bf16_bits(x));
  else
    static_cast<float*>(kv.blocks)[at] = x;
}

}  // namespace parity::device
