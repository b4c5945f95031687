// Greedy sampling on the device: the argmax of each row's logits (reference/sampled.cpp): the
// largest value, the lowest index among equals; NaN never wins unless every value is NaN (then
// index 0). The token stays in device memory; the host reads it only when it is traced or
// needed (generation).
#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kThreads = 1024;

// (value, index) a ranks before b: a number before NaN, then larger, then lower index.
__device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi) {
  const bool a_nan = av != av, b_nan = bv != bv;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && av != bv) return av > bv;
  return ai < bi;
}

// The row's (value, index) pairs are totally ordered by ranks_before, so the winner does not
// depend on the order a thread or the block visits them: each thread keeps its best over a
// strided slice, kLoads loads in flight at a time (16-byte loads when the row allows), then a warp
// and a block reduction. One block per row.
constexpr int kLoads = 8;

__device__ __forceinline__ void keep_best(float x, int i, float& v, int& idx, int none) {
  if (idx == none || ranks_before(x, i, v, idx)) v = x, idx = i;
}

__global__ void __launch_bounds__(kThreads)
    f32_argmax(const float* __restrict__ logits, int vocab, bool vec, int32_t* __restrict__ token) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float v = NAN;
  int idx = vocab;  // none
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  if (vec) {  // vocab % 4 == 0, the rows 16-byte aligned
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int n4 = vocab / 4;
    for (int base = t; base < n4; base += kLoads * threads) {
      float4 x[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = base + u * threads;
        if (i < n4) x[u] = row4[i];
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = base + u * threads;
        if (i < n4) {
          keep_best(x[u].x, 4 * i, v, idx, vocab);
          keep_best(x[u].y, 4 * i + 1, v, idx, vocab);
          keep_best(x[u].z, 4 * i + 2, v, idx, vocab);
          keep_best(x[u].w, 4 * i + 3, v, idx, vocab);
        }
      }
    }
  } else {
    for (int base = t; base < vocab; base += kLoads * threads) {
      float x[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = base + u * threads;
        if (i < vocab) x[u] = row[i];
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = base + u * threads;
        if (i < vocab) keep_best(x[u], i, v, idx, vocab);
      }
    }
  }
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor(v, o);
    const int oi = __shfl_xor(idx, o);
    if (oi != vocab && (idx == vocab || ranks_before(ov, oi, v, idx))) v = ov, idx = oi;
  }
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  if (lane == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < int(blockDim.x) / kWarpSize; ++w)
    if (best_i[w] != vocab && (idx == vocab || ranks_before(best_v[w], best_i[w], v, idx)))
      v = best_v[w], idx = best_i[w];
  token[blockIdx.x] = (idx == vocab || v != v) ? 0 : idx;
}

}  // namespace

void launch_f32_argmax(const float* logits, int batch, int vocab, int32_t* token,
                       hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(logits != nullptr && token != nullptr && batch > 0 && vocab > 0,
                        "launch_f32_argmax: null pointer, empty batch or vocabulary");
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  f32_argmax<<<batch, kThreads, 0, stream>>>(logits, vocab, vec, token);
  HIP_LAUNCH_CHECK("f32_argmax", stream);
}

}  // namespace parity::device
