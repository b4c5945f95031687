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

// One block per row: each thread scans a strided slice, then a warp and a block reduction.
__global__ void __launch_bounds__(kThreads)
    f32_argmax(const float* __restrict__ logits, int vocab, int32_t* __restrict__ token) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float v = NAN;
  int idx = vocab;  // none
  for (int i = int(threadIdx.x); i < vocab; i += int(blockDim.x)) {
    const float x = row[i];
    if (idx == vocab || ranks_before(x, i, v, idx)) v = x, idx = i;
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
  f32_argmax<<<batch, kThreads, 0, stream>>>(logits, vocab, token);
  HIP_LAUNCH_CHECK("f32_argmax", stream);
}

}  // namespace parity::device
