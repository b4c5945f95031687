// Device-side building blocks shared by the kernels (included by .hip files only): exact
// decoding of the checkpoint dtypes, 16-byte vector loads, and warp/block reductions in a
// fixed order. Numerics: no contraction is left to the compiler (-fmad=false /
// -ffp-contract=off); where a fused multiply-add is wanted it is written as fmaf.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "device/hip_compat.h"
#include "device/kernels.h"

namespace parity::device {

// Storage types of checkpoint elements: raw bits, decoded exactly to float.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16_t x) {
  return __uint_as_float(uint32_t(x.bits) << 16);
}
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}
__device__ __forceinline__ float to_f32(f16_t x) {
  return f16_bits_to_f32(x.bits);
}

// Eight consecutive elements in their storage form (one 16-byte load; two for float), so that
// a kernel can issue several loads before decoding any: Raw8<W>, load_raw8, decode8.
template <typename W>
struct Raw8 {
  uint4 u;
};
template <>
struct Raw8<float> {
  float4 a, b;
};
template <typename W>
__device__ __forceinline__ Raw8<W> load_raw8(const W* p) {
  return Raw8<W>{*reinterpret_cast<const uint4*>(p)};
}
template <>
__device__ __forceinline__ Raw8<float> load_raw8(const float* p) {
  return Raw8<float>{*reinterpret_cast<const float4*>(p), *reinterpret_cast<const float4*>(p + 4)};
}
__device__ __forceinline__ void decode8(const Raw8<bf16_t>& r, float (&v)[8]) {
  const uint32_t w[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);  // little-endian: element 2i is the low half
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void decode8(const Raw8<f16_t>& r, float (&v)[8]) {
  const uint32_t w[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = f16_bits_to_f32(w[i] & 0xffffu);
    v[2 * i + 1] = f16_bits_to_f32(w[i] >> 16);
  }
}
__device__ __forceinline__ void decode8(const Raw8<float>& r, float (&v)[8]) {
  v[0] = r.a.x, v[1] = r.a.y, v[2] = r.a.z, v[3] = r.a.w;
  v[4] = r.b.x, v[5] = r.b.y, v[6] = r.b.z, v[7] = r.b.w;
}
// Eight consecutive elements as floats; p must be 16-byte aligned (32 for float).
template <typename W>
__device__ __forceinline__ void load8(const W* p, float (&v)[8]) {
  decode8(load_raw8(p), v);
}

// One warp's dot products of a matrix row wr (`in` elements, dtype W) with the input rows
// x0 + b ldx, b < nb <= RB: each lane's partial sums in acc (a butterfly finishes them). kVec
// (in % 8 == 0, wr and the rows 16-byte aligned): chunks of 8 at c = lane, lane + warp, ...,
// kChunks 16-byte weight loads in flight per lane before any is used, each chunk's 8 products
// added by fmaf in order; otherwise elements i = lane, lane + warp, ... The GEMV (linear.hip)
// and the router (router.hip) sum in this one order.
template <typename W, int RB, bool kVec>
__device__ __forceinline__ void warp_row_dots(const W* wr, const float* x0, int64_t ldx, int in,
                                              int nb, int lane, float (&acc)[RB]) {
  if constexpr (kVec) {
    constexpr int kChunks = 8;
    const int n8 = in / 8;
    for (int c0 = lane; c0 < n8; c0 += kChunks * kWarpSize) {
      Raw8<W> wq[kChunks];
#pragma unroll
      for (int u = 0; u < kChunks; ++u)
        if (c0 + u * kWarpSize < n8) wq[u] = load_raw8(wr + 8 * (c0 + u * kWarpSize));
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int c = c0 + u * kWarpSize;
        if (c < n8) {
          float wv[8];
          decode8(wq[u], wv);
#pragma unroll
          for (int b = 0; b < RB; ++b) {
            if (b < nb) {
              float xv[8];
              load8(x0 + int64_t(b) * ldx + 8 * c, xv);
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[b] = fmaf(wv[e], xv[e], acc[b]);
            }
          }
        }
      }
    }
  } else {
    for (int i = lane; i < in; i += kWarpSize) {
      const float wv = to_f32(wr[i]);
#pragma unroll
      for (int b = 0; b < RB; ++b)
        if (b < nb) acc[b] = fmaf(wv, x0[int64_t(b) * ldx + i], acc[b]);
    }
  }
}

// E8M0 scale byte -> 2^(s - 127) as a float, exactly (s = 0 is the subnormal 2^-127; the
// loader refuses 255).
__device__ __forceinline__ float e8m0_to_f32(uint32_t s) {
  return s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23);
}

// f(integral_constant<int, 0>{}), ..., f(integral_constant<int, N - 1>{}), in order (read the
// counter as decltype(arg)::value: nvcc has no device conversion operator for it): a loop
// unrolled without a pragma (clang declines to unroll loops whose bodies hold shuffles under a
// branch), so register arrays indexed by the counter stay in registers.
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// Sum over the warp by a butterfly; every lane ends with the same, order-fixed value.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o));
  return v;
}

// Block-wide sum / max (blockDim.x a multiple of the warp size, at most 1024 threads). Every
// thread of the block must call it; all get the same value. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// std::min / std::clamp semantics (a NaN input propagates, as in reference/swiglu.cpp), then
// gpt-oss SwiGLU: gate * sigmoid(alpha * gate) * (lin + 1).
__device__ __forceinline__ float swiglu_oai(float gate_in, float lin_in, float alpha, float limit) {
  const float gate = limit < gate_in ? limit : gate_in;
  const float lin = lin_in < -limit ? -limit : (limit < lin_in ? limit : lin_in);
  const float sig = 1.0f / (1.0f + expf(-alpha * gate));
  return gate * sig * (lin + 1.0f);
}

// Element type tag -> storage type.
template <WeightType T>
struct Storage;
template <>
struct Storage<WeightType::bf16> {
  using type = bf16_t;
};
template <>
struct Storage<WeightType::f16> {
  using type = f16_t;
};
template <>
struct Storage<WeightType::f32> {
  using type = float;
};

// Calls f.template operator()<StorageType>() for the runtime weight type.
template <typename F>
void dispatch_weight_type(WeightType t, F&& f) {
  switch (t) {
    case WeightType::bf16:
      f.template operator()<bf16_t>();
      return;
    case WeightType::f16:
      f.template operator()<f16_t>();
      return;
    case WeightType::f32:
      f.template operator()<float>();
      return;
  }
}

inline int ceil_div(int64_t a, int64_t b) {
  return int((a + b - 1) / b);
}

// Whether a pointer takes 16-byte (float4, uint4) loads and stores; null passes (an absent
// optional buffer).
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace parity::device
