// Device side of the split inputs (device/split_inputs.hip has the layout and why): eight
// consecutive float32 inputs of a block of 32 split into their three BF16 parts and written as
// lane t's words. Shared by the split kernel and the producers that write a stage's output and
// its split together (RMSNorm). Included by .hip files only.
#pragma once
#include <cstdint>

#include "device/hip_compat.h"
#include "device/kernels.h"

namespace parity::device {

// float -> BF16 bits, rounded to nearest even; a NaN stays a (quiet) NaN.
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) {
  return __uint_as_float(b << 16);
}

// v: inputs 32 b + 8 t .. 32 b + 8 t + 7 of the flat array; block: split + 48 b.
__device__ __forceinline__ void split_bf16x3_write8(const float (&v)[8], uint32_t* block, int t) {
  uint32_t part[3][8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint32_t hi = f32_to_bf16_bits(v[e]);
    const float r1 = v[e] - bf16_bits_to_f32(hi);
    const uint32_t mid = f32_to_bf16_bits(r1);
    const float r2 = r1 - bf16_bits_to_f32(mid);
    part[0][e] = hi, part[1][e] = mid, part[2][e] = f32_to_bf16_bits(r2);
  }
#pragma unroll
  for (int q = 0; q < 3; ++q)
    *reinterpret_cast<uint4*>(block + 16 * q + 4 * t) =
        uint4{part[q][0] | part[q][4] << 16, part[q][1] | part[q][5] << 16,
              part[q][2] | part[q][6] << 16, part[q][3] | part[q][7] << 16};
}

}  // namespace parity::device
