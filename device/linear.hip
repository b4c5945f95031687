// Dense projections with bias for the BF16/F16/F32 weights (qkv, o_proj, router, lm_head):
//   y[b, col + j] = W[j, :] . x[b, :] + bias[j],  W [out, in] (PyTorch layout), x (B, in).
// Optional epilogue: resid_out = residual + y (o_proj -> resid_attn), the same single addition
// the unfused path does.
//
// BF16 weights with inputs in whole blocks of 32 run on BF16 MMA tiles with float32 accumulation
// (f32_bf16w_mma): x is split into three BF16 parts that sum to it exactly (split_inputs.hip), so
// every product on the tiles is exact and only float32 accumulations round, in the order of
// mma_tiles.h (each block of 32 inputs on its own tile, then one float32 add). A block computes 16
// MT rows by 8 NT batch rows (16 by 8 below 32 batch rows, 32 by 32 from there; on the bf16 path
// 16 by 32 from 32 to 64 batch rows), each of its four
// groups of 32 lanes over a quarter of the input; prefill's steps take 128 rows by 32 batch rows
// per block, each group 32 of the rows over the whole input (f32_bf16w_mma_wide); lane 4 g + t
// loads 8 consecutive weights (16 bytes) of rows g and g + 8 per block of 32 inputs and pairs
// them (8t+j, 8t+j+4) to match the split inputs' order. Tilings differ in which lanes
// compute an element, never in its sequence of MMA steps: a row's result does not depend on the
// batch. Other weights (F16, F32, inputs not in blocks of 32) take the GEMV: one warp per output
// row streams the row with 16-byte loads (8 elements per lane per step, 8 loads in flight per
// lane) and serves up to RB batch rows from it; fmaf in a fixed lane order, then a butterfly.
#include <algorithm>
#include <vector>

#include "device/device_math.h"
#include "device/mma_tiles.h"
#include "device/warpgroup_tiles.h"

namespace parity::device {
namespace {

constexpr int kMaxSegments = 3;
constexpr int kBlockThreads = 256;

template <typename W>
struct GemvArgs {
  const W* w[kMaxSegments];
  const float* bias[kMaxSegments];
  int row_end[kMaxSegments];  // cumulative output rows
  int y_col[kMaxSegments];
  int nseg;
  int in;
  const float* x;
  int ldx;
  int batch;
  float* y;
  int ldy;
  const float* residual;
  float* resid_out;
  int ld_res;
};

template <typename W, int RB, bool kVec>
__global__ void __launch_bounds__(kBlockThreads) f32_gemv_bias_w(const GemvArgs<W> a) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int row = int(blockIdx.x) * (int(blockDim.x) / kWarpSize) + int(threadIdx.x) / kWarpSize;
  if (row >= a.row_end[a.nseg - 1]) return;  // whole warps leave together
  // The segment holding this output row (at most three: q, k, v).
  const W* w = a.w[0];
  const float* bias = a.bias[0];
  int j = row, col = a.y_col[0];
  if (row >= a.row_end[0]) {
    if (row < a.row_end[1]) {
      w = a.w[1], bias = a.bias[1], j = row - a.row_end[0], col = a.y_col[1];
    } else {
      w = a.w[2], bias = a.bias[2], j = row - a.row_end[1], col = a.y_col[2];
    }
  }
  const W* wr = w + int64_t(j) * a.in;
  const int b0 = int(blockIdx.y) * RB;
  const int nb = min(RB, a.batch - b0);
  const float* x0 = a.x + int64_t(b0) * a.ldx;

  float acc[RB];
#pragma unroll
  for (int b = 0; b < RB; ++b) acc[b] = 0.0f;
  warp_row_dots<W, RB, kVec>(wr, x0, a.ldx, a.in, nb, lane, acc);
#pragma unroll
  for (int b = 0; b < RB; ++b) acc[b] = warp_sum(acc[b]);
  if (lane != 0) return;
  const float bj = bias != nullptr ? bias[j] : 0.0f;
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    if (b < nb) {
      const float v = bias != nullptr ? acc[b] + bj : acc[b];
      a.y[int64_t(b0 + b) * a.ldy + col + j] = v;
      if (a.resid_out != nullptr) {
        const int64_t at = int64_t(b0 + b) * a.ld_res + col + j;
        a.resid_out[at] = a.residual[at] + v;
      }
    }
  }
}

// ------------------------------------------------------------------------ BF16 on MMA ---

struct MmaArgs {
  const uint16_t* w[kMaxSegments];  // BF16 bits
  const float* bias[kMaxSegments];
  int row_end[kMaxSegments];  // cumulative output rows
  int y_col[kMaxSegments];
  int nseg;
  int in;
  int ldx;
  int batch;
  float* y;
  int ldy;
  const float* residual;
  float* resid_out;
  int ld_res;
};

// Segment s's entry of a kernel-parameter array, selected without a runtime index (which would
// copy the array to the stack).
template <typename T>
__device__ __forceinline__ T pick(const T (&v)[kMaxSegments], int s) {
  return s == 0 ? v[0] : s == 1 ? v[1] : v[2];
}
// The segment of output row `row` (rows counted over the segments) and its row in it.
__device__ __forceinline__ int segment_of(const MmaArgs& a, int row, int& j) {
  const int s = row < a.row_end[0] ? 0 : row < a.row_end[1] ? 1 : 2;
  j = s == 0 ? row : s == 1 ? row - a.row_end[0] : row - a.row_end[1];
  return s;
}

// A warp's share of a tile's outputs, written with the bias (and the residual epilogue): lane
// (g, t) holds rows j0 + 16 m + {g, g + 8} and batch rows b0 + 8 jt + 2 t + {0, 1} (nb of the
// tile's batch rows live; rows past `rows` are not written).
template <int MT, int NT>
__device__ __forceinline__ void write_warp_rows(const MmaArgs& a, int rows, int j0, int b0, int nb,
                                                int g, int t, const float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = j0 + 16 * m + 8 * h + g;
      if (row >= rows) continue;
      int j;
      const int s = segment_of(a, row, j);
      const float* bias = pick(a.bias, s);
      const int col = pick(a.y_col, s) + j;
#pragma unroll
      for (int jt = 0; jt < NT; ++jt)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int n = 8 * jt + 2 * t + cc, i = 2 * h + cc;
          if (n >= nb) continue;
          const float sum = acc[m][jt][i];
          const float v = bias != nullptr ? sum + bias[j] : sum;
          a.y[int64_t(b0 + n) * a.ldy + col] = v;
          if (a.resid_out != nullptr) {
            const int64_t at = int64_t(b0 + n) * a.ld_res + col;
            a.resid_out[at] = a.residual[at] + v;
          }
        }
    }
}

// Block b of a chunk's weights (w[m][h][b]: the lane's weights 8t .. 8t+7 of row g + 8 h of row
// tile m) as the A fragments' pairs (8t+j, 8t+j+4), the split inputs' order.
template <int MT>
__device__ __forceinline__ void bf16_block_pairs(const uint4 (&w)[MT][2][2], int b,
                                                 uint32_t (&ar)[MT][2][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 q = w[m][h][b];
      ar[m][h][0] = (q.x & 0xffffu) | (q.z << 16);
      ar[m][h][1] = (q.x >> 16) | (q.z & 0xffff0000u);
      ar[m][h][2] = (q.y & 0xffffu) | (q.w << 16);
      ar[m][h][3] = (q.y >> 16) | (q.w & 0xffff0000u);
    }
}

// Blocks per SM the register budget is cut for: the small tiles three; the narrow ones (16 rows
// by 32 batch rows) four: 119 registers on the bf16 path, the only one that takes them unasked
// (at batch 64 qkv and o_proj took 36 and 31 us on them, 41 and 40 on the 32-row tiles, 200
// registers and two blocks a SM: docs/measurements.md); the 32-row large tiles one (their
// registers full).
template <int MT, int NT>
constexpr int kMmaBlocksPerSm = NT == 1   ? 3
                                : MT == 1 ? 4
                                          : 1;

// grid (ceil(rows / 16 MT), min(ceil(batch / 8 NT), 65535)): the row tiles along x; with
// kTilesAlongX (ceil(batch / 8 NT), ceil(rows / 16 MT)): the batch tiles along x. x varies
// fastest in the launch order, so the tiles along x run together: at decode the few batch tiles
// of a row tile take its weights from DRAM once (along y, lm_head's second batch tile read its
// 1.2 GB again after every first one had passed); at prefill the row tiles share each batch
// tile's inputs (launch_mma picks; docs/measurements.md). A block walks the batch tiles along its
// axis, + the grid's size there. Loads need no predicates: a row past the last reads the last row,
// a batch row past the batch reads the first of the tile (their results are never written, and a
// row's and a batch row's results depend on nothing else). kPartsAsColumns (batch 1): the split
// inputs' three parts in the tile's columns (mma_block_parts_as_columns), each lane loading one.
// P: the parts the products use (precision_parts; mma_block).
template <int P, int MT, int NT, bool kTilesAlongX, bool kPartsAsColumns = false>
__global__ void __launch_bounds__(kMmaThreads, (kMmaBlocksPerSm<MT, NT>))
    f32_bf16w_mma(const MmaArgs a, const uint4* split) {
  constexpr int kRows = 16 * MT, kCols = 8 * NT;
  static_assert(!kPartsAsColumns || NT == 1, "the parts as columns take one batch row");
  constexpr int kParts = kPartsAsColumns ? 1 : P;
  // Chunks of weights (and split inputs) in flight per group beyond the one in use: the small
  // tiles are latency-bound (few warps per SM); two measured best at batch 1 (one and three,
  // which spills, slower: docs/measurements.md); the large tiles' registers are full.
  constexpr int kDepth = NT == 1 ? 2 : 1;
  const int lane = int(threadIdx.x) % kMmaLanes, group = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int rows = pick(a.row_end, a.nseg - 1);
  const int j0 = int(kTilesAlongX ? blockIdx.y : blockIdx.x) * kRows;
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  const MmaQuarter quarter = mma_quarter(chunks, group);
  const int c_begin = quarter.begin, c_end = quarter.end;
  __shared__ MmaPartials<MT, NT> partial;
  // A: 16 bytes (weights 8t .. 8t+7 of a block) of rows j0 + 16 m + 8 h + g.
  const uint4* ap0[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int j;
      const int s = segment_of(a, min(j0 + 16 * m + 8 * h + g, rows - 1), j);
      ap0[m][h] = reinterpret_cast<const uint4*>(pick(a.w, s) + int64_t(j) * a.in) +
                  4 * 2 * c_begin + t;
    }
  const int tiles = (a.batch + kCols - 1) / kCols;
  const int tile0 = int(kTilesAlongX ? blockIdx.x : blockIdx.y);
  const int tile_step = int(kTilesAlongX ? gridDim.x : gridDim.y);
  for (int tile = tile0; tile < tiles; tile += tile_step) {  // block-uniform
    const int b0 = tile * kCols, nb = min(kCols, a.batch - b0);
    const uint4* bp[NT];
#pragma unroll
    for (int jt = 0; jt < NT; ++jt) {
      const int n = 8 * jt + g < nb ? 8 * jt + g : 0;
      bp[jt] = split + (int64_t(b0 + n) * (a.ldx / 32) + 2 * c_begin) * 12 + t +
               (kPartsAsColumns ? 4 * mma_part_column<P>(g) : 0);
    }
    const uint4* ap[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ap[m][h] = ap0[m][h];
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int jt = 0; jt < NT; ++jt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][jt][i] = 0.0f;
    // kDepth chunks (two blocks each) of weights in flight, walked as a ring: chunk c + kDepth
    // is loaded into the slot chunk c leaves. The chunks are still summed in order.
    // Small tiles load a chunk's split inputs (B) with its weights; large tiles (their registers
    // full) load B where it is used.
    constexpr bool kPrefetchB = NT == 1;
    uint4 wq[kDepth][MT][2][2];
    uint4 bq[kPrefetchB ? kDepth : 1][2][kParts][NT];
    int next_a = c_begin, next_b = c_begin;  // the chunks the next loads of A and B read
    const auto load_a = [&](uint4(&w)[MT][2][2]) {
      const bool live = next_a < c_end, live1 = live && 2 * next_a + 1 < groups;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (live) {
            w[m][h][0] = ap[m][h][0];
            w[m][h][1] = live1 ? ap[m][h][4] : uint4{0, 0, 0, 0};
          }
          ap[m][h] += 8;
        }
      ++next_a;
    };
    const auto load_b = [&](uint4(&bx)[2][kParts][NT]) {
      if constexpr (kPrefetchB) {
        const bool live = next_b < c_end, live1 = live && 2 * next_b + 1 < groups;
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int q = 0; q < kParts; ++q)
#pragma unroll
            for (int jt = 0; jt < NT; ++jt)
              if (b == 0 ? live : live1) bx[b][q][jt] = bp[jt][12 * b + 4 * q];
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) bp[jt] += 24;
        ++next_b;
      }
    };
    const auto load = [&](uint4(&w)[MT][2][2], uint4(&bx)[2][kParts][NT]) {
      load_a(w);
      load_b(bx);
    };
    // The first chunks' weights, then (launched by launch_programmatic) the wait for the kernel
    // before, which writes the split inputs: the weights' loads overlap its end.
    static_for<kDepth>([&](auto d_) { load_a(wq[decltype(d_)::value]); });
    wait_for_previous_grid();
    allow_next_grid_start();  // the kernel after it (q_rope, a norm) may start meanwhile
    static_for<kDepth>([&](auto d_) {
      constexpr int d = decltype(d_)::value;
      load_b(bq[kPrefetchB ? d : 0]);
    });
    for (int c0 = c_begin; c0 < c_end; c0 += kDepth) {
      static_for<kDepth>([&](auto d_) {
        constexpr int d = decltype(d_)::value;
        const int c = c0 + d;
        if (c >= c_end) return;  // group-uniform
        uint4 w[MT][2][2], bx[2][kParts][NT];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int b = 0; b < 2; ++b) w[m][h][b] = wq[d][m][h][b];
        if constexpr (kPrefetchB) {
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int q = 0; q < kParts; ++q)
#pragma unroll
              for (int jt = 0; jt < NT; ++jt) bx[b][q][jt] = bq[d][b][q][jt];
        }
        load(wq[d], bq[kPrefetchB ? d : 0]);
        static_for<2>([&](auto b_) {
          constexpr int b = decltype(b_)::value;
          if (2 * c + b >= groups) return;  // group-uniform
          if constexpr (!kPrefetchB) {
#pragma unroll
            for (int q = 0; q < kParts; ++q)
#pragma unroll
              for (int jt = 0; jt < NT; ++jt) bx[b][q][jt] = bp[jt][12 * b + 4 * q];
          }
          uint32_t ar[MT][2][4];
          bf16_block_pairs(w, b, ar);
          if constexpr (kPartsAsColumns)
            mma_block_parts_as_columns<P>(acc, ar, bx[b][0][0]);
          else
            mma_block(acc, ar, bx[b]);
        });
        if constexpr (!kPrefetchB) {
#pragma unroll
          for (int jt = 0; jt < NT; ++jt) bp[jt] += 24;
        }
      });
    }

    // The quarters' partial sums, then group 0 writes the tile.
    partial.store(group, lane, acc);
    __syncthreads();
    if (group == 0) {
      // Lane holds rows j0 + 16 m + {g, g + 8}, batch rows b0 + 8 jt + 2 t + {0, 1}.
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = j0 + 16 * m + 8 * h + g;
          if (row >= rows) continue;
          int j;
          const int s = segment_of(a, row, j);
          const float* bias = pick(a.bias, s);
          const int col = pick(a.y_col, s) + j;
#pragma unroll
          for (int jt = 0; jt < NT; ++jt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int n = 8 * jt + 2 * t + c, i = 2 * h + c;
              if (n >= nb) continue;
              const float sum = partial.sum(m, jt, i, lane);
              const float v = bias != nullptr ? sum + bias[j] : sum;
              a.y[int64_t(b0 + n) * a.ldy + col] = v;
              if (a.resid_out != nullptr) {
                const int64_t at = int64_t(b0 + n) * a.ld_res + col;
                a.resid_out[at] = a.residual[at] + v;
              }
            }
        }
    }
    __syncthreads();  // the partial sums are read before the next tile writes them
  }
}

// Wide tiles: four groups on 128 rows by 32 batch rows, the batch rows' split inputs shared
// through shared memory (mma_tiles.h, "wide tiles"); a group's rows, weights and MMA steps as in
// f32_bf16w_mma. grid (ceil(rows / 128), min(ceil(batch / 32), 65535)), the block walking the
// batch tiles along y.
template <int P>
__global__ void __launch_bounds__(kMmaThreads, 1)
    f32_bf16w_mma_wide(const MmaArgs a, const uint4* split) {
  constexpr int MT = 2, NT = 4, kCols = 8 * NT;
  const int lane = int(threadIdx.x) % kMmaLanes, group = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int rows = pick(a.row_end, a.nseg - 1);
  const int j0 = int(blockIdx.x) * kWideRows + 32 * group;  // the group's first row
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  __shared__ WideStaged<kCols, P> staged;
  __shared__ WideQuarters<MT, NT> quarters;
  // A: 16 bytes (weights 8t .. 8t+7 of a block) of rows j0 + 16 m + 8 h + g.
  const uint4* ap0[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int j;
      const int s = segment_of(a, min(j0 + 16 * m + 8 * h + g, rows - 1), j);
      ap0[m][h] = reinterpret_cast<const uint4*>(pick(a.w, s) + int64_t(j) * a.in) + t;
    }
  const int tiles = (a.batch + kCols - 1) / kCols;
  for (int tile = int(blockIdx.y); tile < tiles; tile += int(gridDim.y)) {  // block-uniform
    const int b0 = tile * kCols, nb = min(kCols, a.batch - b0);
    const uint4* ap[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ap[m][h] = ap0[m][h];
    // One chunk of weights in flight beyond the one in use (as the quarter tiles).
    uint4 wq[MT][2][2];
    int next = 0;
    const auto load_a = [&](uint4(&w)[MT][2][2]) {
      const bool live = next < chunks, live1 = live && 2 * next + 1 < groups;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (live) {
            w[m][h][0] = ap[m][h][0];
            w[m][h][1] = live1 ? ap[m][h][4] : uint4{0, 0, 0, 0};
          }
          ap[m][h] += 8;
        }
      ++next;
    };
    load_a(wq);
    // The kernel before writes the split inputs (launch_programmatic): the weights' loads overlap
    // its end.
    wait_for_previous_grid();
    allow_next_grid_start();
    // The staging (WideStager): a batch row past the batch stages the tile's first.
    using Stager = WideStager<kCols, P>;
    const int col = int(threadIdx.x) / Stager::kThreadsPerCol;
    Stager stager(int(threadIdx.x),
                  split + int64_t(b0 + (col < nb ? col : 0)) * (a.ldx / 32) * kSplitQuadsPerBlock);
    stager.load(0, chunks, groups);
    stager.store(staged, 0, chunks);
    __syncthreads();

    float acc[MT][NT][4], s01[MT][NT][4];
    int c = 0;
    for (int quarter = 0; quarter < kMmaGroups; ++quarter) {
      const MmaQuarter qr = mma_quarter(chunks, quarter);
      zero_tiles(acc);
      for (; c < qr.end; ++c) {  // block-uniform
        stager.load(c + 1, chunks, groups);
        uint4 w[MT][2][2];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int b = 0; b < 2; ++b) w[m][h][b] = wq[m][h][b];
        load_a(wq);
        static_for<2>([&](auto b_) {
          constexpr int b = decltype(b_)::value;
          if (2 * c + b >= groups) return;  // block-uniform
          uint4 bx[P][NT];
          wide_b_fragments(staged, c, b, g, t, bx);
          uint32_t ar[MT][2][4];
          bf16_block_pairs(w, b, ar);
          mma_block(acc, ar, bx);
        });
        stager.store(staged, c + 1, chunks);
        __syncthreads();  // chunk c + 1 staged, chunk c read by every group
      }
      quarters.fold(quarter, group, lane, acc, s01);
    }

    write_warp_rows(a, rows, j0, b0, nb, g, t, acc);
  }
}

// ----------------------------------------------------- warpgroup tiles (wgmma, bf16) ---
// Batched steps on the bf16 path where the GPU has Hopper's warpgroup MMA
// (warpgroup_mma_available; detail::gemv_warpgroup says when): 128 rows by kWarpgroupCols batch
// rows per block (device/warpgroup_tiles.h), a warp pairing its 32 rows' BF16 weights into A
// registers as the wide tiles do, one chunk ahead. grid (ceil(rows / 128), min(ceil(batch /
// kWarpgroupCols), 65535)), the block walking the batch tiles along y.
#if PARITY_DEVICE_WGMMA
struct Bf16WarpgroupA {
  static constexpr int MT = kWarpgroupRowTiles;
  const uint4* ap[MT][2];
  int next_chunk, chunks, groups;
  uint4 wq[MT][2][2], w[MT][2][2];
  // ap0[m][h]: weights 8t .. 8t+7 of block 0 of row j0 + 16 m + 8 h + g.
  __device__ __forceinline__ Bf16WarpgroupA(const uint4* const (&ap0)[MT][2], int chunks_,
                                            int groups_)
      : next_chunk(0), chunks(chunks_), groups(groups_) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ap[m][h] = ap0[m][h];
    load(wq);
  }
  __device__ __forceinline__ void load(uint4 (&wl)[MT][2][2]) {
    const bool live = next_chunk < chunks, live1 = live && 2 * next_chunk + 1 < groups;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (live) {
          wl[m][h][0] = ap[m][h][0];
          wl[m][h][1] = live1 ? ap[m][h][4] : uint4{0, 0, 0, 0};
        }
        ap[m][h] += 8;
      }
    ++next_chunk;
  }
  __device__ __forceinline__ void next() {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int b = 0; b < 2; ++b) w[m][h][b] = wq[m][h][b];
    load(wq);
  }
  template <int b>
  __device__ __forceinline__ void block(uint32_t (&ar)[MT][2][4]) const {
    bf16_block_pairs(w, b, ar);
  }
};
#endif  // PARITY_DEVICE_WGMMA

__global__ void __launch_bounds__(kMmaThreads, kWarpgroupBlocksPerSm)
    f32_bf16w_wgmma(const MmaArgs a, const uint4* split) {
#if PARITY_DEVICE_WGMMA
  constexpr int MT = kWarpgroupRowTiles, NT = kWarpgroupColTiles, kCols = kWarpgroupCols;
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  WarpgroupShared& sh = *reinterpret_cast<WarpgroupShared*>(shared_bytes);
  const int lane = int(threadIdx.x) % kMmaLanes, warp = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int rows = pick(a.row_end, a.nseg - 1);
  const int j0 = int(blockIdx.x) * kWideRows + 32 * warp;  // the warp's first row
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  const uint4* ap0[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int j;
      const int s = segment_of(a, min(j0 + 16 * m + 8 * h + g, rows - 1), j);
      ap0[m][h] = reinterpret_cast<const uint4*>(pick(a.w, s) + int64_t(j) * a.in) + t;
    }
  const int tiles = (a.batch + kCols - 1) / kCols;
  bool first_tile = true;
  for (int tile = int(blockIdx.y); tile < tiles; tile += int(gridDim.y)) {  // block-uniform
    const int b0 = tile * kCols, nb = min(kCols, a.batch - b0);
    Bf16WarpgroupA a_src(ap0, chunks, groups);
    if (first_tile) {
      // The kernel before writes the split inputs (launch_programmatic): the weights' first
      // loads overlap its end.
      wait_for_previous_grid();
      allow_next_grid_start();
      first_tile = false;
    }
    __syncthreads();  // every warp's products of the tile before have read their stages
    // The staging: a batch row past the batch stages the tile's first (never written).
    const WarpgroupStager stager(warp, lane, [&](int n) {
      return split + int64_t(b0 + (n < nb ? n : 0)) * (a.ldx / 32) * kSplitQuadsPerBlock;
    });
    float acc[MT][NT][4];
    warpgroup_tile_products<1>(sh, stager, chunks, groups, warp, lane, a_src, acc);

    write_warp_rows(a, rows, j0, b0, nb, g, t, acc);
  }
#else
  (void)a, (void)split;  // not built for this target; never launched here
#endif
}

void launch_wgmma(const MmaArgs& a, const uint4* split, hipStream_t stream) {
  const int rows = a.row_end[a.nseg - 1];
  const auto kernel = &f32_bf16w_wgmma;
  HIP_CHECK(hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                hipFuncAttributeMaxDynamicSharedMemorySize, kWarpgroupSharedBytes));
  const dim3 grid(unsigned(ceil_div(rows, kWideRows)),
                  unsigned(std::min(ceil_div(a.batch, kWarpgroupCols), 65535)));
  HIP_CHECK(launch_programmatic(kernel, grid, dim3(kMmaThreads), kWarpgroupSharedBytes, stream, a,
                                split));
  HIP_LAUNCH_CHECK("f32_bf16w_wgmma", stream);
}

// When the large tiles (batch 32 and more) go wide (f32_bf16w_mma_wide): prefill's steps of 1,024
// rows and more (32 batch tiles), whose blocks of 128 rows fill the GPU several times over, and
// any launch of at least kMinWideBlocks blocks of 128 rows (lm_head at decode: 1,571 row blocks
// per batch tile). The quarter tiles read a batch tile's split inputs once per 32 rows of the
// output, at lm_head three times its weight bytes. Launches of fewer blocks keep the quarter
// tiles, four times as many blocks (at batch 256 the wide launch of qkv is 320 blocks, about a
// wave and a fifth; the step measured the same either way). Below batch 32, wide blocks of 8
// batch rows gave lm_head nothing at batch 1 and 8 (docs/measurements.md).
constexpr int kMinWideBatchTiles = 32;
// The warpgroup tiles (bf16 on Hopper) from kWarpgroupCols batch rows where the launch has at
// least this many blocks of 128 rows by kWarpgroupCols: half of an H100's SMs (below, the quarter
// tiles' four times as many blocks keep more of the GPU busy: qkv and o_proj at batch 64).
constexpr int64_t kMinWarpgroupBlocks = 64;
constexpr int64_t kMinWideBlocks = 512;

// Batch tiles up to which they go along x (kTilesAlongX): measured at batch 1 and 64 (one and
// two tiles); prefill's many tiles were faster along y.
constexpr int kMaxTilesAlongX = 2;

template <int P, int MT, int NT>
void launch_mma(const MmaArgs& a, const uint4* split, bool wide, hipStream_t stream) {
  const int rows = a.row_end[a.nseg - 1];
  const int row_tiles = ceil_div(rows, 16 * MT), batch_tiles = ceil_div(a.batch, 8 * NT);
  // Launched to overlap the end of the kernel before (wait_for_previous_grid in the kernel).
  if constexpr (MT == 2 && NT == 4) {
    if (wide) {
      const dim3 grid(unsigned(ceil_div(rows, kWideRows)),
                      unsigned(std::min(batch_tiles, 65535)));
      HIP_CHECK(launch_programmatic(&f32_bf16w_mma_wide<P>, grid, dim3(kMmaThreads), 0, stream, a,
                                    split));
      HIP_LAUNCH_CHECK("f32_bf16w_mma_wide", stream);
      return;
    }
  }
  if constexpr (NT == 1) {
    if (a.batch == 1 && row_tiles <= 65535) {
      HIP_CHECK(launch_programmatic(&f32_bf16w_mma<P, MT, NT, true, true>,
                                    dim3(1, unsigned(row_tiles)), dim3(kMmaThreads), 0, stream, a,
                                    split));
      HIP_LAUNCH_CHECK("f32_bf16w_mma", stream);
      return;
    }
  }
  if (batch_tiles <= kMaxTilesAlongX && row_tiles <= 65535) {  // y holds up to 65535
    HIP_CHECK(launch_programmatic(&f32_bf16w_mma<P, MT, NT, true>,
                                  dim3(unsigned(batch_tiles), unsigned(row_tiles)),
                                  dim3(kMmaThreads), 0, stream, a, split));
    HIP_LAUNCH_CHECK("f32_bf16w_mma", stream);
    return;
  }
  const dim3 grid(unsigned(row_tiles), unsigned(std::min(batch_tiles, 65535)));
  HIP_CHECK(launch_programmatic(&f32_bf16w_mma<P, MT, NT, false>, grid, dim3(kMmaThreads), 0,
                                stream, a, split));
  HIP_LAUNCH_CHECK("f32_bf16w_mma", stream);
}

template <typename W, int RB>
void launch_rb(const GemvArgs<W>& a, bool vec, int grid_x, hipStream_t stream) {
  const dim3 grid(unsigned(grid_x), unsigned(ceil_div(a.batch, RB)));
  if (vec)
    f32_gemv_bias_w<W, RB, true><<<grid, kBlockThreads, 0, stream>>>(a);
  else
    f32_gemv_bias_w<W, RB, false><<<grid, kBlockThreads, 0, stream>>>(a);
}

}  // namespace

namespace detail {

bool gemv_warpgroup(int rows, int batch) {
  return batch >= kWarpgroupCols &&
         int64_t(ceil_div(rows, kWideRows)) * ceil_div(batch, kWarpgroupCols) >=
             kMinWarpgroupBlocks;
}

bool gemv_narrow(int batch, Precision precision) {
  return precision == Precision::bf16 && batch >= 32 && ceil_div(batch, 32) <= kMaxTilesAlongX;
}

bool gemv_wide(int rows, int batch) {
  if (batch < 32) return false;
  const int64_t batch_tiles = ceil_div(batch, 32);
  return batch_tiles >= kMinWideBatchTiles ||
         int64_t(ceil_div(rows, kWideRows)) * batch_tiles >= kMinWideBlocks;
}

void launch_f32_gemv_bias_tiled(std::span<const GemvSegment> segments, const float* x, int ldx,
                                int batch, float* y, int ldy, GemvResidual residual,
                                SplitInput split, GemvTiling tiling, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(!segments.empty(), "launch_f32_gemv_bias: no segments");
  PARITY_DEVICE_REQUIRE(x != nullptr && y != nullptr, "launch_f32_gemv_bias: null x or y");
  PARITY_DEVICE_REQUIRE(batch > 0, "launch_f32_gemv_bias: batch ", batch, " must be positive");
  PARITY_DEVICE_REQUIRE(residual.residual == nullptr || segments.size() == 1,
                        "launch_f32_gemv_bias: the residual epilogue takes one segment");
  PARITY_DEVICE_REQUIRE((residual.residual == nullptr) == (residual.out == nullptr),
                        "launch_f32_gemv_bias: residual and its output go together");
  const int in = segments[0].w.cols;
  bool same_type = segments.size() <= size_t(kMaxSegments);
  for (const auto& s : segments) {
    PARITY_DEVICE_REQUIRE(s.w.data != nullptr && s.w.rows > 0 && s.w.cols == in,
                          "launch_f32_gemv_bias: segment [", s.w.rows, ", ", s.w.cols,
                          "] does not take inputs of ", in);
    PARITY_DEVICE_REQUIRE(s.y_col >= 0 && s.y_col + s.w.rows <= ldy,
                          "launch_f32_gemv_bias: segment columns [", s.y_col, ", ",
                          s.y_col + s.w.rows, ") outside the output row of ", ldy);
    same_type = same_type && s.w.type == segments[0].w.type;
  }
  PARITY_DEVICE_REQUIRE(in > 0 && ldx >= in, "launch_f32_gemv_bias: ldx ", ldx, " < in ", in);
  PARITY_DEVICE_REQUIRE(
      residual.residual == nullptr || residual.ld >= segments[0].y_col + segments[0].w.rows,
      "launch_f32_gemv_bias: residual row of ", residual.ld, " too short");
  if (!same_type) {  // mixed dtypes (never in practice): one launch per segment
    for (const auto& s : segments)
      launch_f32_gemv_bias_tiled(std::span<const GemvSegment>(&s, 1), x, ldx, batch, y, ldy,
                                 residual, split, tiling, stream);
    return;
  }
  // BF16 weights with inputs in whole blocks of 32: MMA tiles (for every batch size alike).
  bool mma = segments[0].w.type == WeightType::bf16 && in % 32 == 0 && ldx % 32 == 0 &&
             aligned16(x);
  for (const auto& s : segments) mma = mma && aligned16(s.w.data);
  if (mma) {
    const int64_t floats = int64_t(batch - 1) * ldx + in;
    PARITY_DEVICE_REQUIRE(split.words.size() >= split_bf16x3_words(floats),
                          "launch_f32_gemv_bias: the split workspace holds ", split.words.size(),
                          " words, the step needs ", split_bf16x3_words(floats),
                          " (split_bf16x3_words)");
    if (!split.ready) launch_split_bf16x3(x, floats, split.words, stream);
    MmaArgs a{};
    int rows = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      a.w[i] = static_cast<const uint16_t*>(segments[i].w.data);
      a.bias[i] = segments[i].bias;
      rows += segments[i].w.rows;
      a.row_end[i] = rows;
      a.y_col[i] = segments[i].y_col;
    }
    for (size_t i = segments.size(); i < size_t(kMaxSegments); ++i)
      a.w[i] = a.w[0], a.bias[i] = a.bias[0], a.row_end[i] = rows, a.y_col[i] = 0;
    a.nseg = int(segments.size());
    a.in = in;
    a.ldx = ldx;
    a.batch = batch;
    a.y = y;
    a.ldy = ldy;
    a.residual = residual.residual;
    a.resid_out = residual.out;
    a.ld_res = residual.ld;
    const uint4* sp = reinterpret_cast<const uint4*>(split.words.data());
    const bool bf16 = split.precision == Precision::bf16;
    if (tiling == GemvTiling::warpgroup ||
        (tiling == GemvTiling::automatic && bf16 && warpgroup_mma_available() &&
         detail::gemv_warpgroup(rows, batch))) {
      PARITY_DEVICE_REQUIRE(bf16 && warpgroup_mma_available(),
                            "launch_f32_gemv_bias: the warpgroup tiles take the bf16 precision on "
                            "a GPU with warpgroup MMA (sm_90a built, compute capability 9.0)");
      launch_wgmma(a, sp, stream);
      return;
    }
    // 32 rows by 32 batch rows per block; small batches 16 by 8, so that o_proj's 2,880 rows
    // still make 180 blocks; either wide (128 rows a block) where detail::gemv_wide says, or
    // narrow (16 by 32) where detail::gemv_narrow says (the bf16 path at batch 32 to 64).
    const bool wide = tiling == GemvTiling::automatic ? detail::gemv_wide(rows, batch)
                                                      : tiling == GemvTiling::wide;
    const bool narrow = tiling == GemvTiling::automatic
                            ? !wide && detail::gemv_narrow(batch, split.precision)
                            : tiling == GemvTiling::narrow;
    PARITY_DEVICE_REQUIRE((!wide && !narrow) || batch >= 32, "launch_f32_gemv_bias: the ",
                          wide ? "wide" : "narrow", " tiles take 32 batch rows and more, got ",
                          batch);
    const auto launch = [&]<int P>() {
      if (narrow)
        launch_mma<P, 1, 4>(a, sp, false, stream);
      else if (batch >= 32)
        launch_mma<P, 2, 4>(a, sp, wide, stream);
      else
        launch_mma<P, 1, 1>(a, sp, false, stream);
    };
    if (bf16)
      launch.template operator()<1>();
    else
      launch.template operator()<kSplitParts>();
    return;
  }
  dispatch_weight_type(segments[0].w.type, [&]<typename W>() {
    GemvArgs<W> a{};
    int rows = 0;
    bool vec = in % 8 == 0 && ldx % 4 == 0 && aligned16(x);
    for (size_t i = 0; i < segments.size(); ++i) {
      a.w[i] = static_cast<const W*>(segments[i].w.data);
      a.bias[i] = segments[i].bias;
      rows += segments[i].w.rows;
      a.row_end[i] = rows;
      a.y_col[i] = segments[i].y_col;
      vec = vec && aligned16(a.w[i]);
    }
    for (size_t i = segments.size(); i < size_t(kMaxSegments); ++i) {
      a.w[i] = a.w[0], a.bias[i] = a.bias[0], a.row_end[i] = rows, a.y_col[i] = 0;
    }
    a.nseg = int(segments.size());
    a.in = in;
    a.x = x;
    a.ldx = ldx;
    a.batch = batch;
    a.y = y;
    a.ldy = ldy;
    a.residual = residual.residual;
    a.resid_out = residual.out;
    a.ld_res = residual.ld;
    const int rows_per_block = kBlockThreads / device_warp_size();
    const int grid_x = ceil_div(rows, rows_per_block);
    if (batch == 1)
      launch_rb<W, 1>(a, vec, grid_x, stream);
    else if (batch == 2)
      launch_rb<W, 2>(a, vec, grid_x, stream);
    else if (batch <= 4)
      launch_rb<W, 4>(a, vec, grid_x, stream);
    else
      launch_rb<W, 8>(a, vec, grid_x, stream);
  });
  HIP_LAUNCH_CHECK("f32_gemv_bias_w", stream);
}

}  // namespace detail

void launch_f32_gemv_bias(std::span<const GemvSegment> segments, const float* x, int ldx, int batch,
                          float* y, int ldy, GemvResidual residual, SplitInput split,
                          hipStream_t stream) {
  detail::launch_f32_gemv_bias_tiled(segments, x, ldx, batch, y, ldy, residual, split,
                                     detail::GemvTiling::automatic, stream);
}

}  // namespace parity::device
