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
// 2 lo) of column tile j. Per tile: lo, then mid, then hi, each over both k steps, on a fresh
// accumulator (the small parts meet it before the large ones), then one float32 add into acc: the
// tensor cores' own accumulation, coarser than round-to-nearest, spans one block only.
template <int MT, int NT>
__device__ __forceinline__ void mma_block(float (&acc)[MT][NT][4], const uint32_t (&ar)[MT][2][4],
                                          const uint4 (&bf)[3][NT]) {
  uint32_t af[MT][2][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      af[m][step][0] = ar[m][0][2 * step], af[m][step][1] = ar[m][1][2 * step];
      af[m][step][2] = ar[m][0][2 * step + 1], af[m][step][3] = ar[m][1][2 * step + 1];
    }
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int q = 2; q >= 0; --q)
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const uint32_t b[2] = {step == 0 ? bf[q][j].x : bf[q][j].z,
                                 step == 0 ? bf[q][j].y : bf[q][j].w};
          mma_bf16_16x8x16(part, af[m][step], b);
        }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][j][i] += part[i];
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

}  // namespace parity::device
