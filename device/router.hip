// MoE router decision on the device (gpt_oss/torch/model.py MLPBlock): the k largest biased
// router logits (torch.topk, sorted; ties: lowest expert index, as reference/router.cpp), then
// w = softmax over the k selected logits only. The expert indices stay in device memory for
// the expert GEMVs: nothing leaves the device during a step.
#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kMaxPerLane = 8;  // experts per lane: E <= 8 * warp size
constexpr int kMaxTopK = 32;

// (value, expert) a ranks before b: larger value, then lower index; NaN ranks after every
// number, so the order stays total and every lane agrees. `none` marks no candidate.
__device__ __forceinline__ bool ranks_before(float av, int ae, float bv, int be, int none) {
  if (ae == none) return false;
  if (be == none) return true;
  const bool a_nan = av != av, b_nan = bv != bv;
  if (a_nan != b_nan) return b_nan;
  if (a_nan) return ae < be;
  return av > bv || (av == bv && ae < be);
}

// One warp per row.
__global__ void f32_router_topk_softmax(const float* __restrict__ logits, int n_experts, int k,
                                        bool select, int32_t* __restrict__ idx,
                                        float* __restrict__ w) {
  __shared__ float sel_v[kMaxTopK];
  __shared__ int sel_e[kMaxTopK];
  const int r = int(blockIdx.x), lane = int(threadIdx.x);
  const float* g = logits + int64_t(r) * n_experts;
  int32_t* idx_r = idx + int64_t(r) * k;
  if (select) {
    float v[kMaxPerLane];
    unsigned taken = 0;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
      const int e = lane + u * kWarpSize;
      v[u] = e < n_experts ? g[e] : 0.0f;
    }
    for (int s = 0; s < k; ++s) {
      float bv = 0.0f;
      int be = n_experts;  // none
#pragma unroll
      for (int u = 0; u < kMaxPerLane; ++u) {
        const int e = lane + u * kWarpSize;
        if (e < n_experts && !((taken >> u) & 1u) && ranks_before(v[u], e, bv, be, n_experts))
          bv = v[u], be = e;
      }
#pragma unroll
      for (int o = kWarpSize / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor(bv, o);
        const int oe = __shfl_xor(be, o);
        if (ranks_before(ov, oe, bv, be, n_experts)) bv = ov, be = oe;
      }
      // Every lane holds the same winner; its owner marks it taken.
      if (be % kWarpSize == lane) taken |= 1u << (be / kWarpSize);
      if (lane == 0) sel_v[s] = bv, sel_e[s] = be;
    }
  } else if (lane == 0) {  // topk_idx was overwritten (fault injection): recompute w only
    for (int s = 0; s < k; ++s) {
      const int e = idx_r[s];
      sel_e[s] = e;
      sel_v[s] = e >= 0 && e < n_experts ? g[e] : NAN;
    }
  }
  __syncthreads();
  if (lane != 0) return;
  float m = sel_v[0];
  for (int s = 1; s < k; ++s) m = m < sel_v[s] ? sel_v[s] : m;  // std::max
  float z = 0.0f;
  for (int s = 0; s < k; ++s) z += expf(sel_v[s] - m);
  for (int s = 0; s < k; ++s) {
    if (select) idx_r[s] = sel_e[s];
    w[int64_t(r) * k + s] = expf(sel_v[s] - m) / z;
  }
}

}  // namespace

void launch_f32_router_topk_softmax(const float* logits, int batch, int n_experts, int k,
                                    bool select, int32_t* idx, float* w, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(logits != nullptr && idx != nullptr && w != nullptr && batch > 0,
                        "launch_f32_router_topk_softmax: null pointer or empty batch");
  const int warp = device_warp_size();
  PARITY_DEVICE_REQUIRE(n_experts > 0 && n_experts <= kMaxPerLane * warp,
                        "launch_f32_router_topk_softmax: ", n_experts, " experts (supported: 1..",
                        kMaxPerLane * warp, ")");
  PARITY_DEVICE_REQUIRE(k > 0 && k <= n_experts && k <= kMaxTopK,
                        "launch_f32_router_topk_softmax: k ", k, " must be in 1..min(", n_experts,
                        ", ", kMaxTopK, ")");
  f32_router_topk_softmax<<<batch, warp, 0, stream>>>(logits, n_experts, k, select, idx, w);
  HIP_LAUNCH_CHECK("f32_router_topk_softmax", stream);
}

}  // namespace parity::device
