// Expert projections mlp1 (gate_up) and mlp2 (down) for the k experts each row selected, with
// the expert index read from device memory (topk_idx): y = W[e] x + b[e] (bias before the
// routing weight, gpt_oss/torch/model.py MLPBlock). mlp1 fuses SwiGLU into its epilogue: one
// warp computes the interleaved pair (gate 2i, linear 2i + 1) and also writes swiglu[i]; both
// stage outputs are written, so the tracer still sees mlp1 and swiglu.
//
// MXFP4 (OCP MX, gpt-oss-spec section 3): row j of W[e] is in/32 blocks of 16 bytes; byte b of
// block g holds element 32 g + 2 b in its low nibble and 32 g + 2 b + 1 in its high nibble, and
// the block's E8M0 scale byte multiplies by 2^(s - 127). One warp per kRowsPerWarp output
// rows: lane l takes whole blocks (one 16-byte load and one scale byte per row), decodes the
// FP4 codes through a 16-entry shared table, dots them with the block's 32 inputs (staged once
// per thread block in shared memory) in element order and applies the power-of-two scale to
// the block sum; the lanes' sums are combined by a fixed butterfly.
//
// Two MXFP4 paths give the same bits. Per pair (small steps): a thread block per (output tile,
// slot, row), so every (row, slot) pair streams its expert's whole matrix. Grouped (batched
// steps): a one-block kernel sorts the step's pairs by expert (stable counting sort into the
// routing workspace), then a thread block per (output tile, tile of up to kPairsPerTile pairs of
// one expert) loads each weight block once, decodes it once and applies it to every pair of the
// tile. Each output element still sees the same fmaf sequence (blocks g = lane, lane + warp,
// ... in order; within a block the 32 products in element order; then the scale, the butterfly,
// the bias and SwiGLU), so only which warp computes it changes.
//
// Dense (the layout transformers writes for a dequantized model): W[e] stored [in, out], so one
// thread per output column walks the input axis; neighbouring threads read neighbouring columns.
#include <algorithm>

#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kThreads = 256;

struct MoeArgs {
  const uint8_t* blocks;
  const uint8_t* scales;
  const void* dense;
  const float* bias;
  int experts, out, in;
  const int32_t* idx;
  int k;
  const float* x;
  int x_row_stride, x_slot_stride;
  float* y;
  float* act;
  float alpha, limit;
};

// FP4 E2M1 code -> value: [+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6].
__device__ __forceinline__ float fp4_e2m1_value(int code) {
  const int mag = code & 7;
  const float v =
      mag < 2 ? 0.5f * float(mag) : float(1 << ((mag >> 1) - 1)) * (1.0f + 0.5f * float(mag & 1));
  return code & 8 ? -v : v;
}

// Writes the outputs of one (row, slot, unit) when its expert index is invalid: NaN, visibly.
__device__ void write_invalid(const MoeArgs& a, int64_t row_slot, int j0, int unit, bool swiglu) {
  a.y[row_slot * a.out + j0] = NAN;
  if (swiglu) {
    a.y[row_slot * a.out + j0 + 1] = NAN;
    if (a.act != nullptr) a.act[row_slot * (a.out / 2) + unit] = NAN;
  }
}

__device__ void write_outputs(const MoeArgs& a, int e, int64_t row_slot, int j0, int unit,
                              bool swiglu, float acc0, float acc1) {
  const float h0 = acc0 + a.bias[int64_t(e) * a.out + j0];
  a.y[row_slot * a.out + j0] = h0;
  if (swiglu) {
    const float h1 = acc1 + a.bias[int64_t(e) * a.out + j0 + 1];
    a.y[row_slot * a.out + j0 + 1] = h1;
    if (a.act != nullptr)
      a.act[row_slot * (a.out / 2) + unit] = swiglu_oai(h0, h1, a.alpha, a.limit);
  }
}

// x rows live in shared memory with a 4-float pad after every 32 floats: a lane reads the 32
// inputs of one MXFP4 block as eight 16-byte loads, and the 8 lanes of a quarter-warp then
// touch 32 distinct banks (stride 144 bytes) instead of the same four (stride 128 bytes).
__host__ __device__ __forceinline__ int padded(int i) {
  return i + (i >> 5) * 4;
}

// Output rows per warp (mlp1: two gate/linear pairs; mlp2: four rows) and blocks per lane in
// flight: a warp streams its rows' 16-byte blocks side by side (lane l takes block l of each
// row: 512 coalesced bytes per row per step), kInFlight steps of loads issued before any is
// used, and each lane's 32 inputs serve every row.
constexpr int kRowsPerWarp = 4;
constexpr int kInFlight = 3;

// Dot of one MXFP4 block (32 codes in a uint4; byte b: low nibble element 2b, high 2b + 1)
// with 32 inputs, in element order.
__device__ __forceinline__ float mxfp4_block_dot(const uint4 q, const float (&x)[32],
                                                 const float* lut) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float s = 0.0f;
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
    for (int bi = 0; bi < 4; ++bi) {
      const uint32_t byte = (w[wi] >> (8 * bi)) & 0xffu;
      const int e = 2 * (4 * wi + bi);
      s = fmaf(lut[byte & 0xfu], x[e], s);
      s = fmaf(lut[byte >> 4], x[e + 1], s);
    }
  }
  return s;
}

// grid (ceil(out / (warps per block * kRowsPerWarp)), k, B).
template <bool kSwiGLU>
__global__ void __launch_bounds__(kThreads) f32_mxfp4w_moe_gemv(const MoeArgs a) {
  extern __shared__ float xs[];  // padded(in) floats: this (row, slot)'s input
  __shared__ float lut[16];
  const int slot = int(blockIdx.y), r = int(blockIdx.z);
  const int64_t row_slot = int64_t(r) * a.k + slot;
  const float* xr = a.x + int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
  for (int i = int(threadIdx.x); i < a.in / 4; i += int(blockDim.x))
    *reinterpret_cast<float4*>(xs + padded(4 * i)) = *reinterpret_cast<const float4*>(xr + 4 * i);
  if (threadIdx.x < 16) lut[threadIdx.x] = fp4_e2m1_value(int(threadIdx.x));
  __syncthreads();

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = int(blockIdx.x) * (int(blockDim.x) / kWarpSize) + int(threadIdx.x) / kWarpSize;
  const int j0 = warp * kRowsPerWarp;  // first output row of this warp
  if (j0 >= a.out) return;             // whole warps leave together
  const int nrows = min(kRowsPerWarp, a.out - j0);
  const int e = a.idx[row_slot];
  if (e < 0 || e >= a.experts) {
    if (lane == 0)
      for (int t = 0; t < nrows; t += kSwiGLU ? 2 : 1)
        write_invalid(a, row_slot, j0 + t, (j0 + t) / 2, kSwiGLU);
    return;
  }
  const int groups = a.in / 32;
  const int64_t row0 = int64_t(e) * a.out + j0;
  const uint4* q0 = reinterpret_cast<const uint4*>(a.blocks + row0 * groups * 16);
  const uint8_t* sc0 = a.scales + row0 * groups;
  float acc[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) acc[t] = 0.0f;
  for (int g0 = lane; g0 < groups; g0 += kInFlight * kWarpSize) {
    uint4 q[kInFlight][kRowsPerWarp];
    uint32_t sb[kInFlight][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int g = g0 + u * kWarpSize;
#pragma unroll
      for (int t = 0; t < kRowsPerWarp; ++t) {
        const bool live = g < groups && t < nrows;
        q[u][t] = live ? q0[int64_t(t) * groups + g] : uint4{0, 0, 0, 0};
        sb[u][t] = live ? sc0[int64_t(t) * groups + g] : 127u;
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int g = g0 + u * kWarpSize;
      if (g >= groups) break;
      float xv[32];
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float4 f = *reinterpret_cast<const float4*>(xs + padded(32 * g) + 4 * v);
        xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
      }
#pragma unroll
      for (int t = 0; t < kRowsPerWarp; ++t)
        acc[t] = fmaf(mxfp4_block_dot(q[u][t], xv, lut), e8m0_to_f32(sb[u][t]), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) acc[t] = warp_sum(acc[t]);
  if (lane != 0) return;
  if constexpr (kSwiGLU) {
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; t += 2)
      if (t < nrows) write_outputs(a, e, row_slot, j0 + t, (j0 + t) / 2, true, acc[t], acc[t + 1]);
  } else {
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t)
      if (t < nrows) write_outputs(a, e, row_slot, j0 + t, j0 + t, false, acc[t], 0.0f);
  }
}

// ------------------------------------------------------------------- grouped by expert ---

// Pairs sharing one weight load in the grouped kernel: their padded input rows are staged in
// shared memory, 3 x 12,960 bytes at in = 2880, under the 48 KiB a block gets without opt-in.
constexpr int kPairsPerTile = 3;
// Steps of at most this many (row, slot) pairs (batch 2 at k = 4) take the per-pair kernel: with
// more experts than pairs few pairs share an expert, and the sort would cost more than it saves.
constexpr int kPerPairMaxPairs = 8;
// The sort kernel: one block; experts <= kMaxRoutedExperts (a bucket each, plus one for
// invalid indices).
constexpr int kRouteThreads = 1024;
constexpr int kMaxRoutedExperts = 256;

// Routing workspace (int32), for `experts` experts (bucket `experts` gathers invalid indices):
//   [0, experts + 2)              bucket_start: bucket b's first sorted position; last: pairs
//   [experts + 2, 2 experts + 4)  tile_start: bucket b's first pair tile; last: the tiles
//   [2 experts + 4, + pairs)      sorted: the pair indices r k + slot by bucket, ascending within
template <typename I>
struct RoutingView {
  I* bucket_start;
  I* tile_start;
  I* sorted;
};
template <typename I>
__device__ __forceinline__ RoutingView<I> routing_view(I* routing, int experts) {
  return {routing, routing + experts + 2, routing + 2 * (experts + 2)};
}

// Stable counting sort of the pairs by expert, deterministic: each warp owns a contiguous segment
// of the pairs; (1) counts per (warp, bucket) (integer atomics: the totals do not depend on their
// order); (2) bucket starts and each warp's first position in each bucket by fixed scans; (3) each
// warp walks its segment a warp of pairs at a time and places pair i at its warp's cursor plus
// the number of lower lanes with the same bucket (found by exchanging buckets with every lane).
__global__ void __launch_bounds__(kRouteThreads)
    moe_route_pairs_by_expert(const int32_t* idx, int pairs, int experts, int32_t* routing) {
  constexpr int kMaxWarps = kRouteThreads / kWarpSize;
  __shared__ int32_t cursor[kMaxWarps][kMaxRoutedExperts + 1];
  __shared__ int32_t total[kMaxRoutedExperts + 1];
  const int buckets = experts + 1;
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  const RoutingView<int32_t> rv = routing_view(routing, experts);
  for (int i = int(threadIdx.x); i < warps * buckets; i += int(blockDim.x))
    cursor[i / buckets][i % buckets] = 0;
  __syncthreads();
  const int per_warp = (pairs + warps * kWarpSize - 1) / (warps * kWarpSize) * kWarpSize;
  const int begin = warp * per_warp;
  const auto bucket_of = [&](int i) {
    if (i >= pairs) return -1;
    const int e = idx[i];
    return e < 0 || e >= experts ? experts : e;
  };
  for (int c = 0; c < per_warp; c += kWarpSize) {
    const int b = bucket_of(begin + c + lane);
    if (b >= 0) atomicAdd(&cursor[warp][b], 1);
  }
  __syncthreads();
  for (int b = int(threadIdx.x); b < buckets; b += int(blockDim.x)) {
    int n = 0;
    for (int w = 0; w < warps; ++w) {
      const int c = cursor[w][b];
      cursor[w][b] = n;  // position within the bucket, made absolute below
      n += c;
    }
    total[b] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int start = 0, tiles = 0;
    for (int b = 0; b < buckets; ++b) {
      rv.bucket_start[b] = start;
      rv.tile_start[b] = tiles;
      start += total[b];
      tiles += (total[b] + kPairsPerTile - 1) / kPairsPerTile;
    }
    rv.bucket_start[buckets] = start;
    rv.tile_start[buckets] = tiles;
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < warps * buckets; i += int(blockDim.x))
    cursor[i / buckets][i % buckets] += rv.bucket_start[i % buckets];
  __syncthreads();
  for (int c = 0; c < per_warp; c += kWarpSize) {  // the same trip count in every warp
    const int i = begin + c + lane;
    const int b = bucket_of(i);
    int before = 0, after = 0;
#pragma unroll
    for (int m = 1; m < kWarpSize; ++m) {
      const int other = __shfl_xor(b, m);
      if (other == b) ((lane ^ m) < lane ? before : after) += 1;
    }
    const int at = b >= 0 ? cursor[warp][b] + before : 0;
    __syncthreads();  // every lane has read its cursor before the last of a bucket moves it
    if (b >= 0) {
      rv.sorted[at] = i;
      if (after == 0) cursor[warp][b] = at + 1;
    }
    __syncthreads();
  }
}

// grid (ceil(out / (warps per block * kRowsPerWarp)), min(pair tiles bound, 65535)); a block walks
// the pair tiles blockIdx.y, + gridDim.y, ... (the count is read from the routing workspace). A
// tile is up to kPairsPerTile pairs of one bucket; the bucket of tile t is the last b with
// tile_start[b] <= t.
template <bool kSwiGLU>
__global__ void __launch_bounds__(kThreads)
    f32_mxfp4w_moe_gemv_grouped(const MoeArgs a, const int32_t* routing) {
  extern __shared__ float xs[];  // kPairsPerTile x padded(in) floats: the tile's inputs
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = fp4_e2m1_value(int(threadIdx.x));
  const RoutingView<const int32_t> rv = routing_view(routing, a.experts);
  const int tiles = rv.tile_start[a.experts + 1];
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = int(blockIdx.x) * (int(blockDim.x) / kWarpSize) + int(threadIdx.x) / kWarpSize;
  const int j0 = warp * kRowsPerWarp;  // first output row of this warp
  const int nrows = min(kRowsPerWarp, a.out - j0);
  const int groups = a.in / 32;
  const int x_stride = padded(a.in);
  for (int tile = int(blockIdx.y); tile < tiles; tile += int(gridDim.y)) {  // block-uniform
    int lo = 0, hi = a.experts;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (rv.tile_start[mid] <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int bucket = lo;
    const int first = rv.bucket_start[bucket] + (tile - rv.tile_start[bucket]) * kPairsPerTile;
    const int np = min(kPairsPerTile, rv.bucket_start[bucket + 1] - first);
    int64_t row_slot[kPairsPerTile];
#pragma unroll
    for (int p = 0; p < kPairsPerTile; ++p) row_slot[p] = p < np ? rv.sorted[first + p] : 0;

    __syncthreads();  // the previous tile's inputs are no longer read
    for (int p = 0; p < np; ++p) {
      const int r = int(row_slot[p] / a.k), slot = int(row_slot[p] % a.k);
      const float* xr = a.x + int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
      float* xp = xs + p * x_stride;
      for (int i = int(threadIdx.x); i < a.in / 4; i += int(blockDim.x))
        *reinterpret_cast<float4*>(xp + padded(4 * i)) =
            *reinterpret_cast<const float4*>(xr + 4 * i);
    }
    __syncthreads();
    if (j0 >= a.out) continue;  // whole warps skip together; they still meet the barriers
    if (bucket == a.experts) {  // invalid expert indices
      if (lane == 0)
        for (int p = 0; p < np; ++p)
          for (int t = 0; t < nrows; t += kSwiGLU ? 2 : 1)
            write_invalid(a, row_slot[p], j0 + t, (j0 + t) / 2, kSwiGLU);
      continue;
    }
    const int e = bucket;
    const int64_t row0 = int64_t(e) * a.out + j0;
    const uint4* q0 = reinterpret_cast<const uint4*>(a.blocks + row0 * groups * 16);
    const uint8_t* sc0 = a.scales + row0 * groups;
    float acc[kRowsPerWarp][kPairsPerTile];
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t)
#pragma unroll
      for (int p = 0; p < kPairsPerTile; ++p) acc[t][p] = 0.0f;
    for (int g0 = lane; g0 < groups; g0 += kInFlight * kWarpSize) {
      uint4 q[kInFlight][kRowsPerWarp];
      uint32_t sb[kInFlight][kRowsPerWarp];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int g = g0 + u * kWarpSize;
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; ++t) {
          const bool live = g < groups && t < nrows;
          q[u][t] = live ? q0[int64_t(t) * groups + g] : uint4{0, 0, 0, 0};
          sb[u][t] = live ? sc0[int64_t(t) * groups + g] : 127u;
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int g = g0 + u * kWarpSize;
        if (g >= groups) continue;  // (a break is not unrolled by every compiler)
        // The block dot of mxfp4_block_dot, one 32-bit word (8 elements) at a time: each row's
        // 8 codes are decoded once and serve every pair; s[t][p] runs the same fmaf chain.
        float s[kRowsPerWarp][kPairsPerTile];
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; ++t)
#pragma unroll
          for (int p = 0; p < kPairsPerTile; ++p) s[t][p] = 0.0f;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          float wv[kRowsPerWarp][8];
#pragma unroll
          for (int t = 0; t < kRowsPerWarp; ++t) {
            const uint32_t word = wi == 0   ? q[u][t].x
                                  : wi == 1 ? q[u][t].y
                                  : wi == 2 ? q[u][t].z
                                            : q[u][t].w;
#pragma unroll
            for (int bi = 0; bi < 4; ++bi) {
              const uint32_t byte = (word >> (8 * bi)) & 0xffu;
              wv[t][2 * bi] = lut[byte & 0xfu];
              wv[t][2 * bi + 1] = lut[byte >> 4];
            }
          }
#pragma unroll
          for (int p = 0; p < kPairsPerTile; ++p) {
            if (p >= np) continue;  // warp-uniform
            const float* xb = xs + p * x_stride + padded(32 * g) + 8 * wi;
            const float4 f0 = *reinterpret_cast<const float4*>(xb);
            const float4 f1 = *reinterpret_cast<const float4*>(xb + 4);
            const float xv[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
            for (int t = 0; t < kRowsPerWarp; ++t)
#pragma unroll
              for (int i = 0; i < 8; ++i) s[t][p] = fmaf(wv[t][i], xv[i], s[t][p]);
          }
        }
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; ++t) {
          const float scale = e8m0_to_f32(sb[u][t]);
#pragma unroll
          for (int p = 0; p < kPairsPerTile; ++p) acc[t][p] = fmaf(s[t][p], scale, acc[t][p]);
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kPairsPerTile; ++p) {
      if (p >= np) continue;  // warp-uniform
#pragma unroll
      for (int t = 0; t < kRowsPerWarp; ++t) acc[t][p] = warp_sum(acc[t][p]);
    }
    if (lane != 0) continue;
#pragma unroll
    for (int p = 0; p < kPairsPerTile; ++p) {
      if (p >= np) continue;
      if constexpr (kSwiGLU) {
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; t += 2)
          if (t < nrows)
            write_outputs(a, e, row_slot[p], j0 + t, (j0 + t) / 2, true, acc[t][p], acc[t + 1][p]);
      } else {
#pragma unroll
        for (int t = 0; t < kRowsPerWarp; ++t)
          if (t < nrows) write_outputs(a, e, row_slot[p], j0 + t, j0 + t, false, acc[t][p], 0.0f);
      }
    }
  }
}

// grid (ceil(units / 256), k, B); one thread per unit.
template <typename W, bool kSwiGLU>
__global__ void __launch_bounds__(kThreads) f32_dense_moe_gemv_w(const MoeArgs a) {
  const int unit = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  const int units = kSwiGLU ? a.out / 2 : a.out;
  if (unit >= units) return;
  const int slot = int(blockIdx.y), r = int(blockIdx.z);
  const int64_t row_slot = int64_t(r) * a.k + slot;
  const int e = a.idx[row_slot];
  const int j0 = kSwiGLU ? 2 * unit : unit;
  if (e < 0 || e >= a.experts) {
    write_invalid(a, row_slot, j0, unit, kSwiGLU);
    return;
  }
  const W* we = static_cast<const W*>(a.dense) + int64_t(e) * a.in * a.out + j0;
  const float* xr = a.x + int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int i = 0; i < a.in; ++i) {
    const float xi = xr[i];
    acc0 = fmaf(to_f32(we[int64_t(i) * a.out]), xi, acc0);
    if constexpr (kSwiGLU) acc1 = fmaf(to_f32(we[int64_t(i) * a.out + 1]), xi, acc1);
  }
  write_outputs(a, e, row_slot, j0, unit, kSwiGLU, acc0, acc1);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The checks every launcher of the expert GEMV makes, and its arguments.
MoeArgs moe_args(const ExpertWeights& w, const int32_t* idx, int batch, int k, const float* x,
                 int x_row_stride, int x_slot_stride, float* y, float* act, float alpha,
                 float limit) {
  PARITY_DEVICE_REQUIRE(idx != nullptr && x != nullptr && y != nullptr && w.bias != nullptr,
                        "launch_f32_moe_gemv: null idx, x, y or bias");
  PARITY_DEVICE_REQUIRE(batch > 0 && k > 0, "launch_f32_moe_gemv: batch ", batch, " and k ", k,
                        " must be positive");
  PARITY_DEVICE_REQUIRE(w.experts > 0 && w.out > 0 && w.in > 0, "launch_f32_moe_gemv: experts ",
                        w.experts, ", out ", w.out, ", in ", w.in, " must be positive");
  PARITY_DEVICE_REQUIRE(x_row_stride >= 0 && x_slot_stride >= 0, "launch_f32_moe_gemv: strides");
  PARITY_DEVICE_REQUIRE(act == nullptr || w.out % 2 == 0,
                        "launch_f32_moe_gemv: the fused SwiGLU needs an "
                        "even output (interleaved gate/linear), got ",
                        w.out);
  return MoeArgs{w.blocks, w.scales, w.dense,      w.bias,        w.experts, w.out, w.in,  idx,
                 k,        x,        x_row_stride, x_slot_stride, y,         act,   alpha, limit};
}

void require_mxfp4(const ExpertWeights& w, const float* x, int x_row_stride, int x_slot_stride) {
  PARITY_DEVICE_REQUIRE(w.blocks != nullptr && w.scales != nullptr,
                        "launch_f32_moe_gemv: null MXFP4 blocks or scales");
  PARITY_DEVICE_REQUIRE(w.in % 32 == 0, "launch_f32_moe_gemv: MXFP4 input ", w.in,
                        " is not a multiple of 32");
  PARITY_DEVICE_REQUIRE(
      aligned16(w.blocks) && aligned16(x) && x_row_stride % 4 == 0 && x_slot_stride % 4 == 0,
      "launch_f32_moe_gemv: MXFP4 blocks and x rows must be 16-byte aligned");
}

constexpr size_t kMaxStaticShared = 48 * 1024;

size_t per_pair_shared(int in) {
  return size_t(padded(in)) * sizeof(float);
}
size_t grouped_shared(int in) {
  return size_t(kPairsPerTile) * size_t(padded(in)) * sizeof(float);
}

}  // namespace

size_t moe_routing_ints(int64_t pairs, int experts) {
  return size_t(pairs) + 2 * (size_t(experts) + 2);
}

namespace detail {

void launch_f32_mxfp4w_moe_gemv_per_pair(const ExpertWeights& w, const int32_t* idx, int batch,
                                         int k, const float* x, int x_row_stride,
                                         int x_slot_stride, float* y, float* act, float alpha,
                                         float limit, hipStream_t stream) {
  const MoeArgs a =
      moe_args(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act, alpha, limit);
  require_mxfp4(w, x, x_row_stride, x_slot_stride);
  const int rows_per_block = kThreads / device_warp_size() * kRowsPerWarp;
  const dim3 grid(unsigned(ceil_div(w.out, rows_per_block)), unsigned(k), unsigned(batch));
  const size_t shared = per_pair_shared(w.in);
  PARITY_DEVICE_REQUIRE(shared <= kMaxStaticShared, "launch_f32_moe_gemv: MXFP4 input ", w.in,
                        " exceeds the kernel's shared-memory row of 48 KiB");
  if (act != nullptr)
    f32_mxfp4w_moe_gemv<true><<<grid, kThreads, shared, stream>>>(a);
  else
    f32_mxfp4w_moe_gemv<false><<<grid, kThreads, shared, stream>>>(a);
  HIP_LAUNCH_CHECK("f32_mxfp4w_moe_gemv", stream);
}

void launch_f32_mxfp4w_moe_gemv_grouped(const ExpertWeights& w, const int32_t* idx, int batch,
                                        int k, const float* x, int x_row_stride,
                                        int x_slot_stride, float* y, float* act, float alpha,
                                        float limit, std::span<int32_t> routing,
                                        hipStream_t stream) {
  const MoeArgs a =
      moe_args(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act, alpha, limit);
  require_mxfp4(w, x, x_row_stride, x_slot_stride);
  const int64_t pairs = int64_t(batch) * k;
  PARITY_DEVICE_REQUIRE(pairs <= int64_t(1) << 30, "launch_f32_moe_gemv: ", pairs,
                        " (row, slot) pairs exceed the grouped kernel's int32 pair index");
  PARITY_DEVICE_REQUIRE(w.experts <= kMaxRoutedExperts, "launch_f32_moe_gemv: ", w.experts,
                        " experts exceed the routing kernel's ", kMaxRoutedExperts);
  PARITY_DEVICE_REQUIRE(routing.data() != nullptr &&
                            routing.size() >= moe_routing_ints(pairs, w.experts),
                        "launch_f32_moe_gemv: the routing workspace holds ", routing.size(),
                        " int32, the step needs ", moe_routing_ints(pairs, w.experts),
                        " (moe_routing_ints)");
  const size_t shared = grouped_shared(w.in);
  PARITY_DEVICE_REQUIRE(shared <= kMaxStaticShared, "launch_f32_moe_gemv: MXFP4 input ", w.in,
                        " exceeds the grouped kernel's shared memory (", kPairsPerTile,
                        " rows in 48 KiB)");
  moe_route_pairs_by_expert<<<1, kRouteThreads, 0, stream>>>(idx, int(pairs), w.experts,
                                                             routing.data());
  HIP_LAUNCH_CHECK("moe_route_pairs_by_expert", stream);
  // Pair tiles: at most one per pair, and at most ceil(n_b / P) per bucket (experts + 1 of them).
  const int64_t max_tiles =
      std::min(pairs, (pairs + int64_t(w.experts + 1) * (kPairsPerTile - 1)) / kPairsPerTile);
  const int rows_per_block = kThreads / device_warp_size() * kRowsPerWarp;
  const dim3 grid(unsigned(ceil_div(w.out, rows_per_block)),
                  unsigned(std::min<int64_t>(max_tiles, 65535)));
  if (act != nullptr)
    f32_mxfp4w_moe_gemv_grouped<true><<<grid, kThreads, shared, stream>>>(a, routing.data());
  else
    f32_mxfp4w_moe_gemv_grouped<false><<<grid, kThreads, shared, stream>>>(a, routing.data());
  HIP_LAUNCH_CHECK("f32_mxfp4w_moe_gemv_grouped", stream);
}

}  // namespace detail

void launch_f32_moe_gemv(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                         const float* x, int x_row_stride, int x_slot_stride, float* y, float* act,
                         float alpha, float limit, std::span<int32_t> routing,
                         hipStream_t stream) {
  const MoeArgs a =
      moe_args(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act, alpha, limit);
  const bool swiglu = act != nullptr;
  if (w.mxfp4) {
    require_mxfp4(w, x, x_row_stride, x_slot_stride);
    const bool grouped = int64_t(batch) * k > kPerPairMaxPairs &&
                         w.experts <= kMaxRoutedExperts && grouped_shared(w.in) <= kMaxStaticShared;
    if (grouped)
      detail::launch_f32_mxfp4w_moe_gemv_grouped(w, idx, batch, k, x, x_row_stride, x_slot_stride,
                                                 y, act, alpha, limit, routing, stream);
    else
      detail::launch_f32_mxfp4w_moe_gemv_per_pair(w, idx, batch, k, x, x_row_stride,
                                                  x_slot_stride, y, act, alpha, limit, stream);
    return;
  }
  PARITY_DEVICE_REQUIRE(w.dense != nullptr, "launch_f32_moe_gemv: null dense expert weights");
  const int units = swiglu ? w.out / 2 : w.out;
  const dim3 grid(unsigned(ceil_div(units, kThreads)), unsigned(k), unsigned(batch));
  dispatch_weight_type(w.dense_type, [&]<typename W>() {
    if (swiglu)
      f32_dense_moe_gemv_w<W, true><<<grid, kThreads, 0, stream>>>(a);
    else
      f32_dense_moe_gemv_w<W, false><<<grid, kThreads, 0, stream>>>(a);
  });
  HIP_LAUNCH_CHECK("f32_dense_moe_gemv_w", stream);
}

}  // namespace parity::device
