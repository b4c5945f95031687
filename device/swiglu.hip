// gpt-oss SwiGLU as its own kernel (gpt_oss/torch/model.py swiglu; alpha 1.702, limit 7): used
// when mlp1's output was overwritten after the fused mlp1 + SwiGLU kernel ran (fault injection),
// and by the kernel tests. Interleaved input: even = gate, odd = linear.
//   gate = min(h[2i], limit)            (upper clamp only)
//   lin  = clamp(h[2i + 1], -limit, limit)
//   a[i] = gate * sigmoid(alpha * gate) * (lin + 1)
#include "device/device_math.h"

namespace parity::device {
namespace {

__global__ void __launch_bounds__(256)
    f32_swiglu_oai(const float* __restrict__ h, int64_t count, float alpha, float limit,
                   float* __restrict__ a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) a[i] = swiglu_oai(h[2 * i], h[2 * i + 1], alpha, limit);
}

}  // namespace

void launch_f32_swiglu(const float* h, int n, int inter, float alpha, float limit, float* a,
                       hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(h != nullptr && a != nullptr, "launch_f32_swiglu: null pointer argument");
  PARITY_DEVICE_REQUIRE(n > 0 && inter > 0, "launch_f32_swiglu: rows ", n, " and intermediate ",
                        inter, " must be positive");
  PARITY_DEVICE_REQUIRE(limit > 0, "launch_f32_swiglu: limit ", limit, " must be positive");
  const int64_t count = int64_t(n) * inter;  // rows of 2I inputs are rows of I outputs
  f32_swiglu_oai<<<ceil_div(count, 256), 256, 0, stream>>>(h, count, alpha, limit, a);
  HIP_LAUNCH_CHECK("f32_swiglu_oai", stream);
}

}  // namespace parity::device
