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

// Top-k and softmax of one row's logits g by one warp (sel_v, sel_e: k entries of shared memory
// of that warp). select = false: idx_r was overwritten (fault injection); it is read and w only
// is recomputed.
__device__ __forceinline__ void topk_softmax_row(const float* g, int n_experts, int k, bool select,
                                                 int32_t* __restrict__ idx_r,
                                                 float* __restrict__ w_r, float* sel_v,
                                                 int* sel_e, int lane) {
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
  } else if (lane == 0) {
    for (int s = 0; s < k; ++s) {
      const int e = idx_r[s];
      sel_e[s] = e;
      sel_v[s] = e >= 0 && e < n_experts ? g[e] : NAN;
    }
  }
  if (lane != 0) return;  // lane 0 wrote sel_v and sel_e: it alone reads them
  float m = sel_v[0];
  for (int s = 1; s < k; ++s) m = m < sel_v[s] ? sel_v[s] : m;  // std::max
  float z = 0.0f;
  for (int s = 0; s < k; ++s) z += expf(sel_v[s] - m);
  for (int s = 0; s < k; ++s) {
    if (select) idx_r[s] = sel_e[s];
    w_r[s] = expf(sel_v[s] - m) / z;
  }
}

// One warp per row.
__global__ void f32_router_topk_softmax(const float* __restrict__ logits, int n_experts, int k,
                                        bool select, int32_t* __restrict__ idx,
                                        float* __restrict__ w) {
  __shared__ float sel_v[kMaxTopK];
  __shared__ int sel_e[kMaxTopK];
  const int r = int(blockIdx.x), lane = int(threadIdx.x);
  topk_softmax_row(logits + int64_t(r) * n_experts, n_experts, k, select, idx + int64_t(r) * k,
                   w + int64_t(r) * k, sel_v, sel_e, lane);
}

// Router logits and decision. Block (x, y) takes rows RB x .. RB x + RB - 1 and the experts
// y W .. y W + W - 1 of its W warps, its rows' inputs first staged in shared memory (one load
// each). Warp u computes expert y W + u: lane-strided chunks of 8 weights (16-byte loads, 8 in
// flight per lane) summed by fmaf in chunk order c = lane, lane + 32, ... (the GEMV's order), a
// butterfly, then + bias. The experts are spread over gridDim.y blocks at small batches (a row's
// dot products on many multiprocessors instead of one); the last block of a row group to finish
// (a ticket, counted with an atomic and reset by that block) reads the others' logits and takes
// the decision: warp b takes row b's from the logits in shared memory with topk_softmax_row, the
// one-warp kernel's selection (k rounds of a warp's arg-max under ranks_before), maximum, sum
// order and weights.
constexpr int kRouterThreads = 1024;
constexpr int kRouterSpreadThreads = 128;  // blocks of the spread launch: 4 experts each
constexpr int kRouterSpreadMaxRows = 16;   // batches up to this many rows spread their experts
constexpr int kRouterMaxExperts = kMaxPerLane * 32;  // topk_softmax_row's bound on any warp size
constexpr int kRouterMaxRows = 2;
constexpr size_t kRouterStagedBytes = kRouterMaxInputs * sizeof(float);  // dynamic shared
template <typename W, int RB, bool kVec>
__global__ void __launch_bounds__(kRouterThreads)
    f32_router_logits_topk(const W* __restrict__ weight, const float* __restrict__ bias,
                           const float* __restrict__ x, int in, int batch, int n_experts, int k,
                           float* __restrict__ logits, int32_t* __restrict__ idx,
                           float* __restrict__ w, int32_t* __restrict__ tickets) {
  extern __shared__ float4 xs4[];  // [RB][in]
  float* xs = reinterpret_cast<float*>(xs4);
  __shared__ float g[RB][kRouterMaxExperts];
  __shared__ float sel_v[RB][kMaxTopK];
  __shared__ int sel_e[RB][kMaxTopK];
  __shared__ bool last;
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (ffn_norm)
  allow_next_grid_start();
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  const int r0 = int(blockIdx.x) * RB, nb = min(RB, batch - r0);
  const int e_begin = int(blockIdx.y) * warps, e_end = min(n_experts, e_begin + warps);
  const float* x0 = x + int64_t(r0) * in;
  if constexpr (kVec) {
    for (int i = int(threadIdx.x); i < nb * in / 4; i += int(blockDim.x))
      xs4[i] = reinterpret_cast<const float4*>(x0)[i];
  } else {
    for (int i = int(threadIdx.x); i < nb * in; i += int(blockDim.x)) xs[i] = x0[i];
  }
  __syncthreads();
  for (int e = e_begin + warp; e < e_end; e += warps) {  // warp-uniform
    const W* wr = weight + int64_t(e) * in;
    float acc[RB];
#pragma unroll
    for (int b = 0; b < RB; ++b) acc[b] = 0.0f;
    warp_row_dots<W, RB, kVec>(wr, xs, in, in, nb, lane, acc);
#pragma unroll
    for (int b = 0; b < RB; ++b) {
      const float sum = warp_sum(acc[b]);
      const float v = bias != nullptr ? sum + bias[e] : sum;
      if (lane == 0 && b < nb) {
        g[b][e] = v;
        logits[int64_t(r0 + b) * n_experts + e] = v;
      }
    }
  }
  if (gridDim.y > 1) {  // the last block of the row group takes the decision
    __threadfence();    // this block's logits are visible before its ticket counts
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(&tickets[blockIdx.x], 1) == int(gridDim.y) - 1;
      if (last) tickets[blockIdx.x] = 0;  // zero again for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float* lg = logits + int64_t(r0) * n_experts;  // around the L1: other blocks'
    for (int i = int(threadIdx.x); i < nb * n_experts; i += int(blockDim.x)) {
      const int b = i / n_experts, e = i % n_experts;
      if (e < e_begin || e >= e_end) g[b][e] = lg[i];
    }
  }
  __syncthreads();
  if (warp >= nb) return;
  const int b = warp;
  topk_softmax_row(g[b], n_experts, k, true, idx + int64_t(r0 + b) * k, w + int64_t(r0 + b) * k,
                   sel_v[b], sel_e[b], lane);
}

// The fused router's launch: small steps take a block per row and a few experts (the row's
// experts spread over blocks); larger ones every expert in one block (as many as its warps
// cover), which two rows share from 64 rows on (each weight load then serves both).
struct RouterLaunch {
  int rows_per_block, threads, expert_blocks;
};
RouterLaunch router_launch(int batch, int n_experts, int in) {
  const bool spread = batch <= kRouterSpreadMaxRows;
  const int rb =
      batch >= 64 && size_t(kRouterMaxRows) * in * sizeof(float) <= kRouterStagedBytes ? 2 : 1;
  const int threads = spread ? kRouterSpreadThreads : kRouterThreads;
  return {rb, threads, ceil_div(n_experts, threads / device_warp_size())};
}

}  // namespace

void launch_f32_router(const Matrix& weight, const float* bias, const float* x, int batch, int k,
                       float* logits, int32_t* idx, float* w, std::span<int32_t> tickets,
                       hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(weight.data != nullptr && x != nullptr && logits != nullptr &&
                            idx != nullptr && w != nullptr && batch > 0,
                        "launch_f32_router: null pointer or empty batch");
  const int n_experts = weight.rows, in = weight.cols;
  PARITY_DEVICE_REQUIRE(n_experts > 0 && n_experts <= kRouterMaxExperts && in > 0,
                        "launch_f32_router: ", n_experts, " experts of ", in,
                        " inputs (supported: 1..", kRouterMaxExperts, " experts)");
  PARITY_DEVICE_REQUIRE(k > 0 && k <= n_experts && k <= kMaxTopK && k <= device_warp_size(),
                        "launch_f32_router: k ", k, " must be in 1..min(", n_experts, ", ",
                        kMaxTopK, ")");
  PARITY_DEVICE_REQUIRE(size_t(in) * sizeof(float) <= kRouterStagedBytes, "launch_f32_router: ",
                        in, " inputs exceed the kernel's staged row of ",
                        kRouterStagedBytes / sizeof(float));
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = in % 8 == 0 && aligned16(x) && aligned16(weight.data);
  const RouterLaunch l = router_launch(batch, n_experts, in);
  const size_t tickets_needed = router_tickets(batch, n_experts, in);
  PARITY_DEVICE_REQUIRE(tickets_needed == 0 ||
                            (tickets.data() != nullptr && tickets.size() >= tickets_needed),
                        "launch_f32_router: ", tickets_needed, " zeroed tickets needed, ",
                        tickets.size(), " given");
  const int rb = l.rows_per_block, threads = l.threads, expert_blocks = l.expert_blocks;
  const size_t smem = size_t(rb) * in * sizeof(float);
  dispatch_weight_type(weight.type, [&]<typename W>() {
    const W* wt = static_cast<const W*>(weight.data);
    const auto launch = [&]<int RB>() {
      const dim3 grid(unsigned(ceil_div(batch, RB)), unsigned(expert_blocks));
      int32_t* const t = tickets.data();
      if (vec)
        HIP_CHECK(launch_programmatic(&f32_router_logits_topk<W, RB, true>, grid,
                                      dim3(unsigned(threads)), smem, stream, wt, bias, x, in, batch,
                                      n_experts, k, logits, idx, w, t));
      else
        HIP_CHECK(launch_programmatic(&f32_router_logits_topk<W, RB, false>, grid,
                                      dim3(unsigned(threads)), smem, stream, wt, bias, x, in, batch,
                                      n_experts, k, logits, idx, w, t));
    };
    if (rb == 1)
      launch.template operator()<1>();
    else
      launch.template operator()<kRouterMaxRows>();
  });
  HIP_LAUNCH_CHECK("f32_router_logits_topk", stream);
}

size_t router_tickets(int batch, int n_experts, int in) {
  const RouterLaunch l = router_launch(batch, n_experts, in);
  return l.expert_blocks > 1 ? size_t(ceil_div(batch, l.rows_per_block)) : 0;
}

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
