// The MMA tile arithmetic shared by the expert and projection kernels (experts.hip, linear.hip):
// the one definition of the order in which a dot product's terms meet on the tiles, so that both
// kernels, and every tiling of each, give an output element the same sequence of operations.
//
// A product is computed by a group of 32 lanes (a warp on NVIDIA, half a wavefront on CDNA) in
// mma_bf16_16x8x16's fragment layout (device/hip_compat.h); a block's four groups take a quarter
// of the input each. Per block of 32 inputs the A registers of lane 4 g + t hold the BF16 pairs
// (8t + r, 8t + r + 4), r = 0 .. 3, of rows g and g + 8, and its B fragments the split inputs in
// the same order (device/split_inputs.hip): r = 0, 1 make k step 0, r = 2, 3 k step 1.
#pragma once
#include "device/device_math.h"

namespace parity::device {

inline constexpr int kMmaLanes = 32;
inline constexpr int kMmaThreads = 128;
inline constexpr int kMmaGroups = kMmaThreads / kMmaLanes;

// The chunks [begin, end) of `chunks` that group `group` takes.
struct MmaQuarter {
  int begin, end;
};
__device__ __forceinline__ MmaQuarter mma_quarter(int chunks, int group) {
  return {group * chunks / kMmaGroups, (group + 1) * chunks / kMmaGroups};
}

// One block of 32 inputs into acc[m][j] (row tile m, column tile j): ar[m][h] the A pairs of rows
// g (h = 0) and g + 8 (h = 1) of row tile m; bf[q][j] lane t's 16 bytes of part q (0 hi, 1 mid,
// 2 lo) of column tile j. Per tile and part: both k steps on a fresh accumulator (three
// independent chains of two MMA steps), then the parts added in float32, (lo + mid) + hi (the
// small parts meet before the large one), then one float32 add into acc: the tensor cores' own
// accumulation, coarser than round-to-nearest, spans one part of one block only.
// P is the parts the products use (precision_parts: 3 for fp32, exact; 1 for bf16, the hi part
// alone, which is the input rounded to nearest even). With one part the products accumulate on the
// tensor cores into acc itself, one chain of MMA steps over the group's quarter of the input (as
// every BF16 engine accumulates): the accumulation of a part of a block was kept apart only so
// that the three exact parts stay exact, and one chain is what Hopper's warpgroup MMA runs
// asynchronously (the warpgroup tiles give the same bits: hip_compat.h). Every tiling of one
// precision gives an element the same operations.
__device__ __forceinline__ float mma_parts_sum(float lo, float mid, float hi) {
  return (lo + mid) + hi;
}
template <int MT>
__device__ __forceinline__ void mma_a_fragments(const uint32_t (&ar)[MT][2][4],
                                                uint32_t (&af)[MT][2][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      af[m][step][0] = ar[m][0][2 * step], af[m][step][1] = ar[m][1][2 * step];
      af[m][step][2] = ar[m][0][2 * step + 1], af[m][step][3] = ar[m][1][2 * step + 1];
    }
}
template <int MT, int NT, int P>
__device__ __forceinline__ void mma_block(float (&acc)[MT][NT][4], const uint32_t (&ar)[MT][2][4],
                                          const uint4 (&bf)[P][NT]) {
  static_assert(P == kSplitParts || P == 1, "three parts (fp32) or the hi part (bf16)");
  uint32_t af[MT][2][4];
  mma_a_fragments(ar, af);
  // Part q's two k steps on a fresh accumulator.
  const auto chain = [&](int m, int j, int q, float(&part)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) part[i] = 0.0f;
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      const uint32_t b[2] = {step == 0 ? bf[q][j].x : bf[q][j].z,
                             step == 0 ? bf[q][j].y : bf[q][j].w};
      mma_bf16_16x8x16(part, af[m][step], b);
    }
  };
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if constexpr (P == 1) {
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const uint32_t b[2] = {step == 0 ? bf[0][j].x : bf[0][j].z,
                                 step == 0 ? bf[0][j].y : bf[0][j].w};
          mma_bf16_16x8x16(acc[m][j], af[m][step], b);
        }
      } else {
        float lo[4], mid[4], hi[4];
        chain(m, j, 2, lo);
        chain(m, j, 1, mid);
        chain(m, j, 0, hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][j][i] += mma_parts_sum(lo[i], mid[i], hi[i]);
      }
    }
}

// The same block for one column (batch 1's projections, the experts' pair mode) with the three
// parts as the tile's columns: lane (g, t) holds part mma_part_column(g) of that column in bq, so
// one MMA chain of two steps computes all three parts, column q part q (an MMA output element
// depends only on its own row, column and accumulator: the same bits as the three chains of
// mma_block). Lane t = 0 then holds hi and mid of rows g and g + 8 in part[0..3] and lane t = 1
// lo in part[0] and part[2]; lane t = 0's acc[m][0][0] and acc[m][0][2] (column 0) receive the
// sum, the other lanes' acc hold nothing of use. With one part (P = 1, bf16) every column holds
// hi and the steps accumulate into acc as in mma_block<P = 1> (column 0 is the one read).
template <int P>
__device__ __forceinline__ int mma_part_column(int g) {
  return P == 1 || g >= 3 ? 0 : g;
}
template <int P, int MT>
__device__ __forceinline__ void mma_block_parts_as_columns(float (&acc)[MT][1][4],
                                                           const uint32_t (&ar)[MT][2][4],
                                                           const uint4& bq) {
  uint32_t af[MT][2][4];
  mma_a_fragments(ar, af);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const uint32_t b0[2] = {bq.x, bq.y}, b1[2] = {bq.z, bq.w};
    if constexpr (P == 1) {
      mma_bf16_16x8x16(acc[m][0], af[m][0], b0);
      mma_bf16_16x8x16(acc[m][0], af[m][1], b1);
    } else {
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_bf16_16x8x16(part, af[m][0], b0);
      mma_bf16_16x8x16(part, af[m][1], b1);
      const float lo_g = __shfl_xor(part[0], 1), lo_g8 = __shfl_xor(part[2], 1);
      acc[m][0][0] += mma_parts_sum(lo_g, part[1], part[0]);
      acc[m][0][2] += mma_parts_sum(lo_g8, part[3], part[2]);
    }
  }
}

// The four groups' partial sums of a block's tiles, in shared memory: each group stores its own,
// then (after a barrier) sum() adds them in a fixed order, (p0 + p1) + (p2 + p3).
template <int MT, int NT>
struct MmaPartials {
  float v[kMmaGroups][MT][NT][4][kMmaLanes];

  __device__ __forceinline__ void store(int group, int lane, const float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[group][m][j][i][lane] = acc[m][j][i];
  }
  __device__ __forceinline__ float sum(int m, int j, int i, int lane) const {
    return (v[0][m][j][i][lane] + v[1][m][j][i][lane]) + (v[2][m][j][i][lane] + v[3][m][j][i][lane]);
  }
};

// ---------------------------------------------------------------------------- wide tiles ---
// The large tiles (f32_mxfp4w_moe_mma_wide, f32_bf16w_mma_wide: prefill, batched decode): a
// block's four groups take four 32-row slices (kWideRows rows) of the same 8, 16 or 32 columns,
// each over the whole input, instead of a quarter of the input of the same 32 rows each. The block
// loads a chunk (two blocks of 32 inputs) of its columns' split inputs -- per chunk three times a
// group's weight bytes of MXFP4, three quarters of BF16 -- once into shared memory and the four
// groups read it there, where the quarter tiles loaded it once per group from L2 and again for
// every 32 rows of the output. A group walks the input quarter by quarter (mma_quarter's chunks, in
// order), each quarter on fresh accumulators, and adds the quarters as MmaPartials::sum does, (p0 +
// p1) + (p2 + p3): every output element sees the same operations in every tiling.
inline constexpr int kWideRows = 32 * kMmaGroups;
// A column's chunk as staged, in 16-byte units: the P parts the products use (mma_block) of its two
// blocks of 32 inputs (part q of block b at 4 P b + 4 q); bf16 stages the hi parts alone.
template <int P>
inline constexpr int kWideQuadsPerCol = 2 * 4 * P;
// Padded: the eight columns a group's lanes read at once fall in different banks.
template <int P>
inline constexpr int kWideColStride = kWideQuadsPerCol<P> + 1;

// Two chunks of kCols columns' split inputs in turn (chunk c in slot c % 2).
template <int kCols, int P>
struct WideStaged {
  uint4 slot[2][kCols * kWideColStride<P>];
};

// One thread's share of staging a chunk of kCols columns: column thread / kThreadsPerCol, staged
// quads quad, quad + kThreadsPerCol, ... of it (staged quad v is quad v % 4 P of block v / 4 P's
// split words: all of them for P = 3), loaded into registers while the chunk before is summed,
// stored after it. A block past the input (odd block counts) stages zeros, never read.
template <int kCols, int P>
struct WideStager {
  static constexpr int kThreadsPerCol = kMmaThreads / kCols;
  static constexpr int kColQuads = kWideQuadsPerCol<P>;
  static constexpr int kQuads = (kColQuads + kThreadsPerCol - 1) / kThreadsPerCol;
  static_assert(kMmaThreads % kCols == 0);
  const uint4* src;  // the column's split inputs at block 0
  int col, quad;
  uint4 regs[kQuads];
  __device__ __forceinline__ WideStager(int thread, const uint4* col_split)
      : src(col_split), col(thread / kThreadsPerCol), quad(thread % kThreadsPerCol) {}
  // Whether the thread's u-th quad lies within a column's chunk.
  __device__ __forceinline__ bool owns(int u) const {
    return kColQuads % kThreadsPerCol == 0 || quad + kThreadsPerCol * u < kColQuads;
  }
  __device__ __forceinline__ void load(int c, int chunks, int groups) {
    if (c >= chunks) return;
#pragma unroll
    for (int u = 0; u < kQuads; ++u)
      if (owns(u)) {
        const int v = quad + kThreadsPerCol * u, b = v / (4 * P);
        // Three parts: the chunk's quads are contiguous in the split words.
        const int at = P == kSplitParts ? v : b * kSplitQuadsPerBlock + v % (4 * P);
        regs[u] = 2 * c + b < groups ? src[2 * c * kSplitQuadsPerBlock + at] : uint4{0, 0, 0, 0};
      }
  }
  __device__ __forceinline__ void store(WideStaged<kCols, P>& st, int c, int chunks) const {
    if (c >= chunks) return;
    uint4* const to = st.slot[c % 2] + col * kWideColStride<P> + quad;
#pragma unroll
    for (int u = 0; u < kQuads; ++u)
      if (owns(u)) to[kThreadsPerCol * u] = regs[u];
  }
};

// Lane (g, t)'s B fragments of block b of chunk c: part q < P of column 8 j + g.
template <int P, int NT>
__device__ __forceinline__ void wide_b_fragments(const WideStaged<8 * NT, P>& st, int c, int b,
                                                 int g, int t, uint4 (&bx)[P][NT]) {
  const uint4* const s = st.slot[c % 2];
#pragma unroll
  for (int q = 0; q < P; ++q)
#pragma unroll
    for (int j = 0; j < NT; ++j)
      bx[q][j] = s[(8 * j + g) * kWideColStride<P> + 4 * P * b + 4 * q + t];
}

// One element's quarter folded in: after quarter 3, acc holds (p0 + p1) + (p2 + p3), sum01 and
// kept holding p0 + p1 and p2 in between (registers or shared memory).
__device__ __forceinline__ void fold_quarter(int quarter, float& acc, float& sum01, float& kept) {
  if (quarter == 0)
    sum01 = acc;
  else if (quarter == 1)
    sum01 = sum01 + acc;
  else if (quarter == 2)
    kept = acc;
  else
    acc = sum01 + (kept + acc);
}

// The quarters of a group's tile added as MmaPartials::sum adds them: after quarter 3, acc holds
// (p0 + p1) + (p2 + p3). p2 waits in shared memory (its registers would spill).
template <int MT, int NT>
struct WideQuarters {
  float p2[kMmaGroups][MT * NT * 4][kMmaLanes];
  __device__ __forceinline__ void fold(int quarter, int group, int lane, float (&acc)[MT][NT][4],
                                       float (&s01)[MT][NT][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          fold_quarter(quarter, acc[m][j][i], s01[m][j][i], p2[group][(m * NT + j) * 4 + i][lane]);
  }
};

// The same fold with the first two quarters' sum in shared memory too, for tiles whose registers
// hold wide accumulators (the warpgroup tiles): the same operations, in the same order.
template <int MT, int NT>
struct WideQuartersShared {
  float s01[kMmaGroups][MT * NT * 4][kMmaLanes];
  float p2[kMmaGroups][MT * NT * 4][kMmaLanes];
  __device__ __forceinline__ void fold(int quarter, int group, int lane, float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int at = (m * NT + j) * 4 + i;
          fold_quarter(quarter, acc[m][j][i], s01[group][at][lane], p2[group][at][lane]);
        }
  }
};

template <int MT, int NT>
__device__ __forceinline__ void zero_tiles(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][j][i] = 0.0f;
}

}  // namespace parity::device
