// The warpgroup tiles (Hopper's warpgroup MMA, wgmma; the bf16 path only) shared by the expert
// and projection kernels (experts.hip, linear.hip): one warpgroup -- a block's four warps -- on
// 128 output rows by kWarpgroupCols columns (pairs of one expert, or batch rows). Each warp makes
// the A registers of its 32 rows (the experts decode MXFP4, the projections pair BF16 weights)
// exactly as the wide tiles do; the columns' inputs (the split's hi parts: the inputs rounded to
// BF16) are staged in shared memory as wgmma's B, in a ring of kWarpgroupStages chunks; each block
// of 32 inputs is two asynchronous products per 16-row tile (wgmma_bf16_m64n64k16), which run while
// the warps make the next chunk's A. The quarters and their sum are the wide tiles' (mma_quarter;
// WideQuartersShared), and a chain of wgmma on one accumulator gives the bits of the same chain of
// mma_bf16_16x8x16 (hip_compat.h): every element the bits of the other tilings. Included by .hip
// files only.
#pragma once
#include <cstdint>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/mma_tiles.h"

namespace parity::device {

inline constexpr int kWarpgroupCols = 64;
inline constexpr int kWarpgroupRowTiles = 2;                   // 16-row tiles per warp
inline constexpr int kWarpgroupColTiles = kWarpgroupCols / 8;  // 8-column tiles
// Chunks of the columns' inputs in shared memory: the one the products read, the next, and the
// one the products before them read (rewritten once every warp's products of it are done).
inline constexpr int kWarpgroupStages = 3;
// Bytes of one k step (16 inputs) of the tile's columns in shared memory: two cores of k by
// kWarpgroupCols / 8 of columns, 128 bytes each.
inline constexpr int kWarpgroupStepBytes = 32 * kWarpgroupCols;
// Blocks per SM the registers are cut for: two warpgroups (the accumulators, the quarters' first
// sums and a chunk's A take about 200 registers).
inline constexpr int kWarpgroupBlocksPerSm = 2;

struct WarpgroupShared {
  uint8_t staged[kWarpgroupStages][4 * kWarpgroupStepBytes];  // a chunk: two blocks, four k steps
  WideQuartersShared<kWarpgroupRowTiles, kWarpgroupColTiles> quarters;
};
inline constexpr int kWarpgroupSharedBytes = int(sizeof(WarpgroupShared));

using WarpgroupAcc = float[kWarpgroupRowTiles][kWarpgroupColTiles][4];

#if PARITY_DEVICE_WGMMA
// One thread's share of staging a chunk: lane (g, t) of warp w loads quad t (the hi words of lane
// t's inputs) of columns 8 r + g for r = w and w + 4 of the tile's kWarpgroupCols / 8 column
// groups, both blocks of the chunk (16-byte loads, up to two chunks ahead of the products), and
// stores word x of a quad to step 2 b's core of k 0..7, y to its core of k 8..15, z and w to step 2
// b + 1's (split_inputs.h: word j of quad t holds inputs 8 t + j and 8 t + j + 4, k 2 t and 2 t + 1
// of mma_bf16_16x8x16's B). A warp's 32 stores of one word fill one core's 128 bytes: no bank
// conflict. (Four-byte asynchronous copies straight into the cores were measured slower:
// docs/measurements.md.) A block past the input stages zeros, never read.
struct WarpgroupStager {
  const uint4* src[2];  // the two columns' split at block 0, quad t
  int g, t, warp;
  uint4 regs[2][2];  // [column][block]
  // col_split(n): column n's split words at block 0 (a column past the tile's gives its first).
  template <class ColumnSplit>
  __device__ __forceinline__ WarpgroupStager(int warp_, int lane, ColumnSplit col_split)
      : g(lane / 4), t(lane % 4), warp(warp_) {
#pragma unroll
    for (int u = 0; u < 2; ++u) src[u] = col_split(8 * (warp + 4 * u) + g) + t;
  }
  __device__ __forceinline__ void load(int c, int chunks, int groups) {
    if (c >= chunks) return;
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int b = 0; b < 2; ++b)
        regs[u][b] =
            2 * c + b < groups ? src[u][(2 * c + b) * kSplitQuadsPerBlock] : uint4{0, 0, 0, 0};
  }
  __device__ __forceinline__ void store(WarpgroupShared& sh, int c, int chunks) const {
    if (c >= chunks) return;
    uint8_t* const stage = sh.staged[c % kWarpgroupStages];
    constexpr int kc1 = kWarpgroupStepBytes / 2;
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        uint8_t* const at = stage + (warp + 4 * u) * 128 + g * 16 + t * 4;
        const uint4 q = regs[u][b];
        const int s0 = (2 * b) * kWarpgroupStepBytes, s1 = (2 * b + 1) * kWarpgroupStepBytes;
        *reinterpret_cast<uint32_t*>(at + s0) = q.x;
        *reinterpret_cast<uint32_t*>(at + s0 + kc1) = q.y;
        *reinterpret_cast<uint32_t*>(at + s1) = q.z;
        *reinterpret_cast<uint32_t*>(at + s1 + kc1) = q.w;
      }
    fence_proxy_async_shared();  // the tensor cores read what these stores wrote
  }
  __device__ __forceinline__ void take(const WarpgroupStager& other) {
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int b = 0; b < 2; ++b) regs[u][b] = other.regs[u][b];
  }
};

// The products of one tile over the whole input: acc ends holding the quarters' sum, (p0 + p1) +
// (p2 + p3). `a` makes the A registers: a.next() makes the next chunk current (and loads ahead),
// a.template block<b>(ar) gives block b of the current chunk as the A pairs ar[m][h] of rows g
// (h = 0) and g + 8 of row tile m (mma_tiles.h). kAhead: how many chunks ahead of the products
// the columns' inputs are loaded, 2 (the experts, whose A takes few registers) or 1 (BF16 A, a
// chunk of which takes 32 registers). Every warp's products of the tile before must have read
// their stages (a barrier) before the call.
template <int kAhead, class ASource>
__device__ __forceinline__ void warpgroup_tile_products(WarpgroupShared& sh, WarpgroupStager stager,
                                                        int chunks, int groups, int warp, int lane,
                                                        ASource& a, WarpgroupAcc& acc) {
  static_assert(kAhead == 1 || kAhead == 2);
  constexpr int MT = kWarpgroupRowTiles, NT = kWarpgroupColTiles;
  WarpgroupStager ahead = stager;  // chunk c + 2's loads while chunk c + 1 waits in stager
  stager.load(0, chunks, groups);
  if constexpr (kAhead == 2) ahead.load(1, chunks, groups);
  stager.store(sh, 0, chunks);
  if constexpr (kAhead == 2) stager.take(ahead);
  __syncthreads();
  int c = 0;
  for (int quarter = 0; quarter < kMmaGroups; ++quarter) {
    const MmaQuarter qr = mma_quarter(chunks, quarter);
    zero_tiles(acc);
    for (; c < qr.end; ++c) {  // block-uniform
      if constexpr (kAhead == 2)
        ahead.load(c + 2, chunks, groups);
      else
        stager.load(c + 1, chunks, groups);
      a.next();
      const uint8_t* const stage = sh.staged[c % kWarpgroupStages];
      static_for<2>([&](auto b_) {
        constexpr int b = decltype(b_)::value;
        if (2 * c + b >= groups) return;  // block-uniform
        uint32_t ar[MT][2][4], af[MT][2][4];
        a.template block<b>(ar);
        mma_a_fragments(ar, af);
#pragma unroll
        for (int m = 0; m < MT; ++m)
          wgmma_fence_operands(reinterpret_cast<float(&)[4 * NT]>(acc[m]));
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const uint64_t desc = wgmma_smem_desc(stage + (2 * b + step) * kWarpgroupStepBytes,
                                                kWarpgroupStepBytes / 2, 128);
#pragma unroll
          for (int m = 0; m < MT; ++m)
            wgmma_bf16_m64n64k16(reinterpret_cast<float(&)[4 * NT]>(acc[m]), af[m][step], desc);
        }
      });
      wgmma_commit_group();
      // This warp's products of chunk c - 1 are done; every warp's products of chunk c - 2 were
      // done before the barrier of the chunk before, so its stage (= c + 1 modulo three) may be
      // written.
      wgmma_wait_group<1>();
      stager.store(sh, c + 1, chunks);
      if constexpr (kAhead == 2) stager.take(ahead);
      __syncthreads();
    }
    wgmma_wait_group<0>();
#pragma unroll
    for (int m = 0; m < MT; ++m) wgmma_fence_operands(reinterpret_cast<float(&)[4 * NT]>(acc[m]));
    sh.quarters.fold(quarter, warp, lane, acc);
  }
}
#endif  // PARITY_DEVICE_WGMMA

}  // namespace parity::device
