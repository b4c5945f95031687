// The MoE combine and the residual adds:
//   moe_out[b][i] = sum over slots s = 0..k-1 (in order) of w[b][s] * mlp2[b][s][i]
//                   (acc = 0; acc += w * y, as reference/experts.cpp moe_sum)
//   resid_ffn[b][i] = resid_attn[b][i] + moe_out[b][i]   (fused; the same single addition)
// and a plain elementwise add for the residuals when a fused producer's output was overwritten.
#include "device/device_math.h"

namespace parity::device {
namespace {

__global__ void __launch_bounds__(256)
    f32_moe_weighted_sum_residual(const float* __restrict__ w, const float* __restrict__ expert_out,
                                  int k, int n, const float* __restrict__ residual,
                                  float* __restrict__ moe_out, float* __restrict__ resid_out) {
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (mlp2)
  allow_next_grid_start();
  const int r = int(blockIdx.y);
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (i >= n) return;
  const float* wr = w + int64_t(r) * k;
  const float* er = expert_out + int64_t(r) * k * n + i;
  float acc = 0.0f;
  for (int s = 0; s < k; ++s) acc += wr[s] * er[int64_t(s) * n];
  moe_out[int64_t(r) * n + i] = acc;
  if (resid_out != nullptr) resid_out[int64_t(r) * n + i] = residual[int64_t(r) * n + i] + acc;
}

__global__ void __launch_bounds__(256)
    f32_add(const float* __restrict__ a, const float* __restrict__ b, int64_t count,
            float* __restrict__ y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] = a[i] + b[i];
}

}  // namespace

void launch_f32_moe_weighted_sum_residual(const float* w, const float* expert_out, int batch, int k,
                                          int n, const float* residual, float* moe_out,
                                          float* resid_out, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(w != nullptr && expert_out != nullptr && moe_out != nullptr,
                        "launch_f32_moe_weighted_sum_residual: null pointer argument");
  PARITY_DEVICE_REQUIRE(
      (residual == nullptr) == (resid_out == nullptr),
      "launch_f32_moe_weighted_sum_residual: residual and its output go together");
  PARITY_DEVICE_REQUIRE(batch > 0 && k > 0 && n > 0, "launch_f32_moe_weighted_sum_residual: batch ",
                        batch, ", k ", k, ", n ", n, " must be positive");
  HIP_CHECK(launch_programmatic(&f32_moe_weighted_sum_residual,
                                dim3(unsigned(ceil_div(n, 256)), unsigned(batch)), dim3(256), 0,
                                stream, w, expert_out, k, n, residual, moe_out, resid_out));
  HIP_LAUNCH_CHECK("f32_moe_weighted_sum_residual", stream);
}

void launch_f32_add(const float* a, const float* b, int64_t count, float* y, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(a != nullptr && b != nullptr && y != nullptr && count > 0,
                        "launch_f32_add: null pointer or empty range");
  f32_add<<<ceil_div(count, 256), 256, 0, stream>>>(a, b, count, y);
  HIP_LAUNCH_CHECK("f32_add", stream);
}

}  // namespace parity::device
