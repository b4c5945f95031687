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
// Two floats rounded to BF16 as f32_to_bf16_bits rounds them, packed: lo in the low half (one
// conversion instruction where the device has one, device/hip_compat.h).
__device__ __forceinline__ uint32_t bf16x2_pack_rn(float lo, float hi) {
#if PARITY_DEVICE_CVT_BF16X2
  return cvt_bf16x2_rn(lo, hi);
#else
  return f32_to_bf16_bits(lo) | f32_to_bf16_bits(hi) << 16;
#endif
}

// The three BF16 parts of v: hi = bf16(v), mid = bf16(v - hi), lo = bf16(v - hi - mid).
__device__ __forceinline__ void split_bf16x3_parts(float v, uint32_t (&part)[3]) {
  const uint32_t hi = f32_to_bf16_bits(v);
  const float r1 = v - bf16_bits_to_f32(hi);
  const uint32_t mid = f32_to_bf16_bits(r1);
  const float r2 = r1 - bf16_bits_to_f32(mid);
  part[0] = hi, part[1] = mid, part[2] = f32_to_bf16_bits(r2);
}

// v: inputs 32 b + 8 t .. 32 b + 8 t + 7 of the flat array; block: split + 48 b.
__device__ __forceinline__ void split_bf16x3_write8(const float (&v)[8], uint32_t* block, int t) {
  uint32_t part[3][8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    uint32_t p[3];
    split_bf16x3_parts(v[e], p);
    part[0][e] = p[0], part[1][e] = p[1], part[2][e] = p[2];
  }
#pragma unroll
  for (int q = 0; q < 3; ++q)
    *reinterpret_cast<uint4*>(block + 16 * q + 4 * t) =
        uint4{part[q][0] | part[q][4] << 16, part[q][1] | part[q][5] << 16,
              part[q][2] | part[q][6] << 16, part[q][3] | part[q][7] << 16};
}

// Input f of the flat array alone: its three parts as three 16-bit stores, for producers whose
// threads hold single outputs (the attention output, mlp1's SwiGLU epilogue). The same words as
// split_bf16x3_write8 once every input of a block is written: input e = f % 8 of lane t's eight
// is the low half (e < 4) or the high half (e >= 4) of word 4 t + e % 4 of each part.
__device__ __forceinline__ void split_bf16x3_write1(float v, uint32_t* split, int64_t f) {
  const int i = int(f % 32), t = i / 8, e = i % 8;
  uint16_t* const at =
      reinterpret_cast<uint16_t*>(split + kSplitWordsPerBlock * (f / 32) + 4 * t + e % 4) + e / 4;
  uint32_t p[3];
  split_bf16x3_parts(v, p);
#pragma unroll
  for (int q = 0; q < 3; ++q) at[32 * q] = uint16_t(p[q]);  // part q: 16 words on
}

}  // namespace parity::device
