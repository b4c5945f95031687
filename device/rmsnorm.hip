// RMSNorm (gpt_oss/torch/model.py RMSNorm, in float32): one block per row;
//   y = (x * (1 / sqrt(mean(x^2) + eps))) * weight   -- the order of reference/rmsnorm.cpp.
// launch_f32_rmsnorm_split also writes y split into BF16 parts (device/split_inputs.h) for the
// MMA kernel that reads it next (qkv, mlp1, lm_head), which then launches no split of its own:
// the same y, the same split, one launch fewer. Both are launched to overlap the end of the kernel
// before (launch_programmatic): the vector form loads its weights, then waits for that kernel.
#include "device/device_math.h"
#include "device/split_inputs.h"

namespace parity::device {
namespace {

constexpr int kNormThreads = 256;
constexpr int kNormChunksPerThread = kRmsNormMaxSplitN / (8 * kNormThreads);  // one-pass rows

// Rows in chunks of 8 (n % 8 == 0, 16-byte aligned): thread t holds chunks t, t + 256, ... of x
// and of the weight in registers, loaded together before the reduction, so a row costs one
// round of loads; sum of squares by fmaf over its chunks in order, then the block's tree.
template <typename W, bool kSplit>
__global__ void __launch_bounds__(kNormThreads)
    f32_rmsnorm_w_vec(const float* __restrict__ x, const W* __restrict__ weight, int n, float eps,
                      float* __restrict__ y, uint32_t* __restrict__ split) {
  __shared__ float scratch[32];
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  const int n8 = n / 8, t = int(threadIdx.x);
  Raw8<float> xq[kNormChunksPerThread];
  Raw8<W> wq[kNormChunksPerThread];
#pragma unroll
  for (int u = 0; u < kNormChunksPerThread; ++u) {
    const int c = t + u * kNormThreads;
    if (c < n8) wq[u] = load_raw8(weight + 8 * c);
  }
  wait_for_previous_grid();  // x is the kernel before's output
  allow_next_grid_start();   // the projection after it may load its weights meanwhile
#pragma unroll
  for (int u = 0; u < kNormChunksPerThread; ++u) {
    const int c = t + u * kNormThreads;
    if (c < n8) xq[u] = load_raw8(xr + 8 * c);
  }
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kNormChunksPerThread; ++u) {
    if (t + u * kNormThreads < n8) {
      float v[8];
      decode8(xq[u], v);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(v[e], v[e], ss);
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
#pragma unroll
  for (int u = 0; u < kNormChunksPerThread; ++u) {
    const int c = t + u * kNormThreads;
    if (c < n8) {
      float v[8], wv[8];
      decode8(xq[u], v);
      decode8(wq[u], wv);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = v[e] * inv * wv[e];
      *reinterpret_cast<float4*>(yr + 8 * c) = float4{v[0], v[1], v[2], v[3]};
      *reinterpret_cast<float4*>(yr + 8 * c + 4) = float4{v[4], v[5], v[6], v[7]};
      if constexpr (kSplit)  // n % 32 == 0: chunk c is lane c % 4 of block c / 4 of the row
        split_bf16x3_write8(v, split + (int64_t(blockIdx.x) * (n / 32) + c / 4) *
                                           kSplitWordsPerBlock, c % 4);
    }
  }
}

// Any row: y by a strided loop (no split).
template <typename W>
__global__ void __launch_bounds__(kNormThreads)
    f32_rmsnorm_w(const float* __restrict__ x, const W* __restrict__ weight, int n, float eps,
                  float* __restrict__ y) {
  wait_for_previous_grid();
  allow_next_grid_start();  // the projection after it may load its weights meanwhile
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

bool one_pass(const float* x, const void* weight, int n, const float* y) {
  return n % 8 == 0 && n <= 8 * kNormThreads * kNormChunksPerThread && aligned16(x) &&
         aligned16(weight) && aligned16(y);
}

void check_args(const char* launcher, const float* x, const void* weight, int batch, int n,
                float eps, const float* y) {
  PARITY_DEVICE_REQUIRE(x != nullptr && weight != nullptr && y != nullptr, launcher,
                        ": null pointer argument");
  PARITY_DEVICE_REQUIRE(batch > 0 && n > 0, launcher, ": batch ", batch, " and n ", n,
                        " must be positive");
  PARITY_DEVICE_REQUIRE(eps > 0, launcher, ": eps ", eps, " must be positive");
}

}  // namespace

void launch_f32_rmsnorm(const float* x, WeightType weight_type, const void* weight, int batch,
                        int n, float eps, float* y, hipStream_t stream) {
  check_args("launch_f32_rmsnorm", x, weight, batch, n, eps, y);
  const bool vec = one_pass(x, weight, n, y);
  dispatch_weight_type(weight_type, [&]<typename W>() {
    const W* w = static_cast<const W*>(weight);
    uint32_t* const no_split = nullptr;
    if (vec)
      HIP_CHECK(launch_programmatic(&f32_rmsnorm_w_vec<W, false>, dim3(unsigned(batch)),
                                    dim3(kNormThreads), 0, stream, x, w, n, eps, y, no_split));
    else
      HIP_CHECK(launch_programmatic(&f32_rmsnorm_w<W>, dim3(unsigned(batch)), dim3(kNormThreads), 0,
                                    stream, x, w, n, eps, y));
  });
  HIP_LAUNCH_CHECK("f32_rmsnorm_w", stream);
}

void launch_f32_rmsnorm_split(const float* x, WeightType weight_type, const void* weight,
                              int batch, int n, float eps, float* y, std::span<uint32_t> split,
                              hipStream_t stream) {
  check_args("launch_f32_rmsnorm_split", x, weight, batch, n, eps, y);
  PARITY_DEVICE_REQUIRE(rmsnorm_writes_split(n) && one_pass(x, weight, n, y),
                        "launch_f32_rmsnorm_split: n ", n, " must be a multiple of 32 up to ",
                        kRmsNormMaxSplitN, ", and x, the weight and y 16-byte aligned");
  const int64_t floats = int64_t(batch) * n;
  PARITY_DEVICE_REQUIRE(split.data() != nullptr && aligned16(split.data()) &&
                            split.size() >= split_bf16x3_words(floats),
                        "launch_f32_rmsnorm_split: the split workspace holds ", split.size(),
                        " words (16-byte aligned), the rows need ", split_bf16x3_words(floats));
  dispatch_weight_type(weight_type, [&]<typename W>() {
    HIP_CHECK(launch_programmatic(&f32_rmsnorm_w_vec<W, true>, dim3(unsigned(batch)),
                                  dim3(kNormThreads), 0, stream, x, static_cast<const W*>(weight),
                                  n, eps, y, split.data()));
  });
  HIP_LAUNCH_CHECK("f32_rmsnorm_w_vec", stream);
}

}  // namespace parity::device
