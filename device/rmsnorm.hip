// RMSNorm (gpt_oss/torch/model.py RMSNorm, in float32): one block per row;
//   y = (x * (1 / sqrt(mean(x^2) + eps))) * weight   -- the order of reference/rmsnorm.cpp.
#include "device/device_math.h"

namespace parity::device {
namespace {

template <typename W>
__global__ void __launch_bounds__(256)
    f32_rmsnorm_w(const float* __restrict__ x, const W* __restrict__ weight, int n, float eps,
                  float* __restrict__ y) {
  __shared__ float scratch[32];
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x))
    yr[i] = xr[i] * inv * to_f32(weight[i]);
}

}  // namespace

void launch_f32_rmsnorm(const float* x, WeightType weight_type, const void* weight, int batch,
                        int n, float eps, float* y, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(x != nullptr && weight != nullptr && y != nullptr,
                        "launch_f32_rmsnorm: null pointer argument");
  PARITY_DEVICE_REQUIRE(batch > 0 && n > 0, "launch_f32_rmsnorm: batch ", batch, " and n ", n,
                        " must be positive");
  PARITY_DEVICE_REQUIRE(eps > 0, "launch_f32_rmsnorm: eps ", eps, " must be positive");
  dispatch_weight_type(weight_type, [&]<typename W>() {
    f32_rmsnorm_w<W><<<batch, 256, 0, stream>>>(x, static_cast<const W*>(weight), n, eps, y);
  });
  HIP_LAUNCH_CHECK("f32_rmsnorm_w", stream);
}

}  // namespace parity::device
