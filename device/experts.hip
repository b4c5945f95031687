// Expert projections mlp1 (gate_up) and mlp2 (down) for the k experts each row selected, with
// the expert index read from device memory (topk_idx): y = W[e] x + b[e] (bias before the
// routing weight, gpt_oss/torch/model.py MLPBlock). mlp1 fuses SwiGLU into its epilogue (the
// lanes holding gate 2i and linear 2i + 1 exchange them and write swiglu[i]); both stage outputs
// are written, so the tracer still sees mlp1 and swiglu.
//
// MXFP4 (OCP MX, gpt-oss-spec section 3): row j of W[e] is in/32 blocks of 16 bytes; byte b of
// block g holds element 32 g + 2 b in its low nibble and 32 g + 2 b + 1 in its high nibble, and
// the block's E8M0 scale byte multiplies by 2^(s - 127). On the device the blocks and scales are
// packed once, at upload (u8_mxfp4_pack_*, the layout of Mxfp4Packing in kernel_types.h), in the
// order the lanes of a tile read them: one 16-byte load per lane and chunk of two blocks, 512
// contiguous bytes per warp, where the checkpoint's order took eight 4-byte loads, each touching
// eight rows. The kernel runs on BF16 MMA tiles with
// float32 accumulation and keeps float32 accuracy: every weight times its scale is exact in BF16
// (decoded in registers by bit placement and one BF16 multiply, mxfp4_word_to_bf16), and x is
// split into three BF16 parts that sum to it exactly (split_inputs.hip), so each product on the
// tiles is exact and the only roundings are the float32 accumulations -- a float32 dot product in
// another order. One launch: (1) steps of more than a few pairs sort their (row, slot) pairs by
// expert (a stable counting sort into the routing workspace) so that a tile's pairs share one
// expert and its weights are read once per tile; (2) x is split; (3) a block computes a tile of
// one expert's rows by its pairs: in pair mode and in grouped steps of few pairs per expert 32
// rows by one pair or 8 pairs, each of its four groups of 32 lanes over a quarter of the inputs
// (f32_mxfp4w_moe_mma); in larger steps 128 rows by 8 or 16 pairs, each group 32 of the rows
// over all of the inputs, the pairs' inputs staged once per block (f32_mxfp4w_moe_mma_wide;
// moe_tiling picks). Tilings differ in which lanes compute an element, never in its sequence of
// MMA steps, so the results are the same bits for any step size.
//
// Dense (the layout transformers writes for a dequantized model): W[e] stored [in, out], so one
// thread per output column walks the input axis; neighbouring threads read neighbouring columns.
#include <algorithm>

#include "device/device_math.h"
#include "device/mma_tiles.h"
#include "device/split_inputs.h"
#include "device/warpgroup_tiles.h"

namespace parity::device {
namespace {

constexpr int kThreads = 256;

struct MoeArgs {
  const uint8_t* blocks;  // packed (Mxfp4Packing)
  const uint8_t* scales;  // packed (Mxfp4Packing)
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
  uint32_t* act_split;  // act's split into BF16 parts (MoeWorkspace::act_split), or null
  bool idx_settled = false;  // MoeWorkspace::idx_settled (launch_f32_mxfp4w_moe_mma sets it)
};

// act[p][unit] = value, and its split when asked for (the flat index of mlp2's input).
__device__ __forceinline__ void write_act(const MoeArgs& a, int64_t row_slot, int unit,
                                          float value) {
  const int64_t f = row_slot * (a.out / 2) + unit;
  a.act[f] = value;
  if (a.act_split != nullptr) split_bf16x3_write1(value, a.act_split, f);
}

// Writes the outputs of one (row, slot, unit) when its expert index is invalid: NaN, visibly.
__device__ void write_invalid(const MoeArgs& a, int64_t row_slot, int j0, int unit, bool swiglu) {
  a.y[row_slot * a.out + j0] = NAN;
  if (swiglu) {
    a.y[row_slot * a.out + j0 + 1] = NAN;
    if (a.act != nullptr) write_act(a, row_slot, unit, NAN);
  }
}

__device__ void write_outputs(const MoeArgs& a, int e, int64_t row_slot, int j0, int unit,
                              bool swiglu, float acc0, float acc1) {
  const float h0 = acc0 + a.bias[int64_t(e) * a.out + j0];
  a.y[row_slot * a.out + j0] = h0;
  if (swiglu) {
    const float h1 = acc1 + a.bias[int64_t(e) * a.out + j0 + 1];
    a.y[row_slot * a.out + j0 + 1] = h1;
    if (a.act != nullptr) write_act(a, row_slot, unit, swiglu_oai(h0, h1, a.alpha, a.limit));
  }
}

// ------------------------------------------------------------------- MXFP4 on MMA tiles ---

// Chunks (two MXFP4 blocks of a group's rows) of weight loads each lane keeps in flight beyond
// the one in use: one with one 8-pair tile (which also loads the next chunk's split inputs; two
// chunks spilled and were slower at batch 1: docs/measurements.md), two with four (many pairs:
// bound by the MMA tiles, and the registers hold the larger B fragments).
template <int NT>
constexpr int kPrefetch = NT == 1 ? 1 : 2;
// Blocks per SM the register budget is cut for (__launch_bounds__): pair mode (batch 1 and 2)
// was fastest at 3 (the registers of the ring unspilled), grouped 8-pair tiles at 4, the large
// tiles hold one (measured on the H100, docs/measurements.md).
template <bool kGrouped, int NT>
constexpr int kMoeBlocksPerSm = NT == 1 ? (kGrouped ? 4 : 3) : 1;
// Steps of at most this many (row, slot) pairs (batch 2 at k = 4) take one pair per tile in pair
// order; larger steps sort the pairs by expert first.
constexpr int kPairModeMaxPairs = 8;
// The sort kernel: one block; experts <= kMaxRoutedExperts (a bucket each, plus one for
// invalid indices).
constexpr int kRouteThreads = 1024;
constexpr int kMaxRoutedExperts = 256;

// Word t of an MXFP4 block (codes 8t .. 8t+7; byte j: code 8t+2j in the low nibble, 8t+2j+1 in
// the high) times the block's E8M0 scale 2^(s - 127), as four BF16 pairs r[j] = (8t+j, 8t+j+4).
// A code's bits s e1 e0 m placed at BF16 bits 15, 8..7 and 6 read as the code's value times
// 2^-126 (code 1, 0.5, becomes the subnormal 2^-127), so one BF16 multiply by 2^126 2^(s-127) =
// 2^(s-1) gives value * scale, exactly: the products have at most two significant bits and
// BF16 has float32's exponent range (scales below 2^-125 give exact subnormals; 2^(s-1) above
// BF16's largest power of two, s > 128, takes two multiplies; the E8M0 NaN, s = 255, gives NaN).
__device__ __forceinline__ void mxfp4_word_place(uint32_t w, uint32_t (&r)[4]) {
  r[0] = ((w & 0x00070007u) << 6) | ((w & 0x00080008u) << 12);
  r[1] = ((w & 0x00700070u) << 2) | ((w & 0x00800080u) << 8);
  r[2] = ((w >> 2) & 0x01c001c0u) | ((w << 4) & 0x80008000u);
  r[3] = ((w >> 6) & 0x01c001c0u) | (w & 0x80008000u);
}
__device__ __forceinline__ void mxfp4_word_to_bf16(uint32_t w, uint32_t s, uint32_t (&r)[4]) {
  mxfp4_word_place(w, r);
  // 2^(s-1), or 2^127 and then 2^(s-128) (the second multiply predicated, not branched).
  const uint32_t m1 = s <= 128u ? (s + 126u) << 7 : 254u << 7;
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = bf16x2_mul(r[j], m1 | m1 << 16);
  if (s > 128u) {
    const uint32_t m2 = s == 255u ? 0x7fc0u : (s - 1u) << 7;  // 2^(s-128), or NaN
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = bf16x2_mul(r[j], m2 | m2 << 16);
  }
}

// Nonzero when a byte of the four E8M0 scales s4 exceeds 128 (a scale above 2^1, which
// mxfp4_word_to_bf16 applies in two multiplies).
__device__ __forceinline__ uint32_t e8m0_any_above_128(uint32_t s4) {
  return s4 & 0x80808080u & ((s4 & 0x7f7f7f7fu) + 0x7f7f7f7fu);
}
// The multipliers 2^(s-1) of scale bytes b and b + 2 of s4 (every byte at most 128), each as a
// BF16 pair for bf16x2_mul: m[0] from byte b, m[1] from byte b + 2 -- what mxfp4_word_to_bf16's
// one multiply uses, two scales at a time in 16-bit halves.
template <int b>
__device__ __forceinline__ void e8m0_pair_multipliers(uint32_t s4, uint32_t (&m)[2]) {
  const uint32_t x = __byte_perm(s4, 0u, b == 0 ? 0x4240u : 0x4341u);  // s_b | s_(b+2) << 16
  const uint32_t e = (x + 0x007e007eu) << 7;  // (s + 126) << 7 per half: at most 254 << 7
  m[0] = __byte_perm(e, 0u, 0x1010u);
  m[1] = __byte_perm(e, 0u, 0x3232u);
}

// Word i of a 16-byte load (i a compile-time constant after unrolling).
__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// Whether a group's scales of one chunk (s[m]: the lane's four scale bytes of row tile m) are all
// at most 2^1, as every practical checkpoint's: then each word takes one multiply, the multipliers
// built two at a time (the same BF16 multiply as mxfp4_word_to_bf16's). Group-uniform.
template <int MT>
__device__ __forceinline__ bool mxfp4_small_scales(const uint32_t (&s)[MT]) {
  uint32_t above = 0;
#pragma unroll
  for (int m = 0; m < MT; ++m) above |= e8m0_any_above_128(s[m]);
  return !__any(above != 0u);
}

// Block b of a chunk's weights (w[m], s[m]: the lane's 16 bytes and scale bytes of row tile m)
// as the A fragments' BF16 pairs ar[m][h] of rows g and g + 8.
template <int b, int MT>
__device__ __forceinline__ void mxfp4_chunk_block(const uint4 (&w)[MT], const uint32_t (&s)[MT],
                                                  bool small_scales, uint32_t (&ar)[MT][2][4]) {
  if (small_scales) {  // group-uniform
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t mult[2];
      e8m0_pair_multipliers<b>(s[m], mult);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mxfp4_word_place(word_of(w[m], 2 * h + b), ar[m][h]);
#pragma unroll
        for (int j = 0; j < 4; ++j) ar[m][h][j] = bf16x2_mul(ar[m][h][j], mult[h]);
      }
    }
  } else {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mxfp4_word_to_bf16(word_of(w[m], 2 * h + b), (s[m] >> (8 * (2 * h + b))) & 0xffu, ar[m][h]);
  }
}

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
// Tiles hold up to tile_pairs pairs of one bucket.
__global__ void __launch_bounds__(kRouteThreads) moe_route_pairs_by_expert(
    const int32_t* idx, int pairs, int experts, int tile_pairs, int32_t* routing) {
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
      tiles += (total[b] + tile_pairs - 1) / tile_pairs;
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

// Expert linear on MMA tiles. grid (ceil(out / (16 MT rows)), min(tiles bound, 65535)); a block
// walks the pair tiles blockIdx.y, + gridDim.y, ... A tile is up to 8 NT pairs of one expert: with
// `routing` (kGrouped), consecutive pairs of one bucket of the sorted order (the bucket of tile t
// is the last b with tile_start[b] <= t); without, pair t alone (pair mode). The block's four
// groups take the same 16 MT rows and pairs and a quarter of the input each (chunks
// [w C / 4, (w + 1) C / 4) of the C chunks of two blocks), so that a step of few pairs still has
// many short chains of dependent MMA steps in flight; their partial sums meet in shared memory as
// (p0 + p1) + (p2 + p3).
//
// Lane 4 g + t of a group holds rows g and g + 8 of each of its MT 16-row tiles, and for each
// chunk of two MXFP4 blocks loads word t of both rows' two blocks (codes 8t .. 8t+7 of each; one
// 16-byte load from the packed blocks) and the four scales (one 32-bit load), kPrefetch chunks
// ahead; the decoded pairs are its A fragments for the block's two k steps
// (k step 0: codes 8t+{0,4} and 8t+{1,5}, step 1: 8t+{2,6} and 8t+{3,7}); its B fragments are
// the matching split inputs of column g of each 8-pair tile (one 16-byte load per part); each
// block of 32 inputs goes through mma_block (device/mma_tiles.h: a fresh tile per part, the parts
// added, then one float32 add), in pair mode through mma_block_parts_as_columns (the pair's three
// parts as the tile's columns: one load per lane, two MMA steps instead of six, the same bits).
// Every output element sees the same sequence of operations whatever MT, NT and the
// tile's other pairs are: a row's result does not depend on the batch. P: the parts the products
// use (precision_parts; mma_block).
template <int P, bool kSwiGLU, bool kGrouped, int MT, int NT>
__global__ void __launch_bounds__(kMmaThreads, (kMoeBlocksPerSm<kGrouped, NT>))
    f32_mxfp4w_moe_mma(const MoeArgs a, int pairs, const int32_t* routing, const uint4* split) {
  constexpr int kRows = 16 * MT, kCols = 8 * NT;
  const int lane = int(threadIdx.x) % kMmaLanes, group = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int j0 = int(blockIdx.x) * kRows;  // the block's first row
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  const MmaQuarter quarter = mma_quarter(chunks, group);
  const int c_begin = quarter.begin, c_end = quarter.end;
  __shared__ MmaPartials<MT, NT> partial;
  const int k = a.k, x_row_stride = a.x_row_stride, x_slot_stride = a.x_slot_stride;
  const uint4* const packed_blocks = reinterpret_cast<const uint4*>(a.blocks);
  const uint32_t* const packed_scales = reinterpret_cast<const uint32_t*>(a.scales);
  const Mxfp4Packing pk(a.out, a.in);
  const RoutingView<const int32_t> rv = routing_view(routing, a.experts);
  const int tiles = kGrouped ? rv.tile_start[a.experts + 1] : pairs;
  // Pair mode (one pair a tile) puts the split inputs' three parts in the tile's columns
  // (mma_block_parts_as_columns): each lane loads one part, one MMA chain computes all three.
  constexpr bool kPartsAsColumns = !kGrouped;
  static_assert(kGrouped || NT == 1, "pair mode takes one pair a tile");
  constexpr int kParts = kPartsAsColumns ? 1 : P;
  // Pair mode is launched to overlap the end of the kernel before (launch_programmatic): it waits
  // for that kernel before reading what it may write (the expert indices unless a.idx_settled,
  // the split inputs) and before writing anything; with settled indices its first tile's first
  // weights are loaded before the wait. The kernel after it may then start (and load its own
  // weights): a block allows it once past the wait. Block-uniform; grouped tiles (launched after
  // the pair sort in the same stream, plainly) need none of it.
  bool settled = kGrouped;
  const auto settle = [&] {
    if (settled) return;
    wait_for_previous_grid();
    allow_next_grid_start();
    settled = true;
  };
  if (!a.idx_settled) settle();
  for (int tile = int(blockIdx.y); tile < tiles; tile += int(gridDim.y)) {  // block-uniform
    int bucket, first, np;
    if constexpr (kGrouped) {
      int lo = 0, hi = a.experts;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (rv.tile_start[mid] <= tile)
          lo = mid;
        else
          hi = mid - 1;
      }
      bucket = lo;
      first = rv.bucket_start[bucket] + (tile - rv.tile_start[bucket]) * kCols;
      np = min(kCols, rv.bucket_start[bucket + 1] - first);
    } else {
      const int e = a.idx[tile];
      bucket = e < 0 || e >= a.experts ? a.experts : e;
      first = tile, np = 1;
    }
    const auto pair_at = [&](int n) { return kGrouped ? rv.sorted[first + n] : first + n; };
    if (bucket == a.experts) {  // invalid expert indices: NaN for every output of the tile
      settle();
      for (int i = int(threadIdx.x); i < np * kRows; i += kMmaThreads) {  // each output once
        const int n = i / kRows, j = j0 + i % kRows;
        if (j < a.out && (!kSwiGLU || j % 2 == 0)) write_invalid(a, pair_at(n), j, j / 2, kSwiGLU);
      }
      continue;
    }
    const int e = bucket;

    // A row tile past the last reads the last, a padding row reads zeros, and a column past the
    // tile's pairs reads its first pair: their results are never written, and a row's and a
    // column's results depend on nothing else. The loads walk pointers forward a chunk at a time
    // (no per-load address arithmetic).
    // B: column 8 j + g's split inputs (uint4 units: 12 per block), lane t's 16 bytes; in pair mode
    // part mma_part_column(g) of the pair's.
    const uint4* bp[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int n = 8 * j + g < np ? 8 * j + g : 0;
      const int p = pair_at(n), r = p / k, slot = p % k;
      const int64_t v = int64_t(r) * x_row_stride + int64_t(slot) * x_slot_stride;
      bp[j] = split + (v / 32 + 2 * c_begin) * 12 + t +
              (kPartsAsColumns ? 4 * mma_part_column<P>(g) : 0);
    }
    // A: the lane's 16 bytes of each chunk of row tiles j0 / 16 + m (Mxfp4Packing: words t of
    // rows g and g + 8, blocks 2c and 2c + 1) and its 4 scale bytes (the same rows and blocks).
    const uint4* ap[MT];
    const uint32_t* sp[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int64_t tile_chunk =
          (int64_t(e) * pk.row_tiles + min(int64_t(j0 / 16 + m), pk.row_tiles - 1)) * pk.chunks +
          c_begin;
      ap[m] = packed_blocks + tile_chunk * kMmaLanes + lane;
      sp[m] = packed_scales + tile_chunk * 8 + g;
    }
    // The weights in flight, a ring of chunks: chunk c + kPrefetch is loaded while chunk c is
    // summed (the chunks are still summed in order). Pair mode keeps kPrefetch + 1 slots, the
    // loop unrolled over them, so that chunk c is summed from its slot while chunk c + kPrefetch
    // goes into the slot chunk c - 1 left: every slot a fixed set of registers, no chunk copied
    // (the copies were a fifth of its instructions; 10 % of its time at batch 1 on the H100).
    // Grouped tiles keep kPrefetch slots and copy chunk c out before its slot is loaded again:
    // with the extra slot they spilled and were slower (docs/measurements.md). Small tiles also
    // load the next chunk's split inputs (B) while the current one is summed, so that no MMA
    // waits on a load issued just before it; large tiles (their registers full) load B where it
    // is used.
    constexpr bool kCopyRing = kGrouped;
    constexpr int kSlots = kCopyRing ? kPrefetch<NT> : kPrefetch<NT> + 1;
    constexpr bool kPrefetchB = NT == 1;
    // B's ring: two slots in pair mode; one otherwise (unused, or copied out like the weights).
    constexpr int kSlotsB = kPrefetchB && !kCopyRing ? 2 : 1;
    uint4 wq[kSlots][MT];
    uint32_t sq[kSlots][MT];
    uint4 bq[kSlotsB][2][kParts][NT];
    int next = c_begin;  // the chunk the next load() reads
    const auto load = [&](uint4(&w)[MT], uint32_t(&s)[MT]) {
      const bool live = next < c_end;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (live) {
          w[m] = *ap[m];
          s[m] = *sp[m];
        }
        ap[m] += kMmaLanes;
        sp[m] += 8;
      }
      ++next;
    };
    // B of chunk c, then the pointers move on to chunk c + 1.
    const auto load_b = [&](int c, uint4(&bx)[2][kParts][NT]) {
      const bool live = c < c_end, live1 = live && 2 * c + 1 < groups;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int q = 0; q < kParts; ++q)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            if (b == 0 ? live : live1) bx[b][q][j] = bp[j][12 * b + 4 * q];
#pragma unroll
      for (int j = 0; j < NT; ++j) bp[j] += 24;
    };
#pragma unroll
    for (int u = 0; u < kPrefetch<NT>; ++u) load(wq[u], sq[u]);
    settle();
    if constexpr (kPrefetchB) load_b(c_begin, bq[0]);

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][j][i] = 0.0f;

    for (int c0 = c_begin; c0 < c_end; c0 += kSlots) {
      static_for<kSlots>([&](auto u_) {
        constexpr int u = decltype(u_)::value;
        const int c = c0 + u;
        if (c >= c_end) return;
        uint4 wc[MT], bc[2][kParts][NT];  // copies of chunk c (copy ring), or B where used
        uint32_t sc[MT];
        if constexpr (kCopyRing) {
#pragma unroll
          for (int m = 0; m < MT; ++m) wc[m] = wq[u][m], sc[m] = sq[u][m];
        }
        const uint4(&w)[MT] = kCopyRing ? wc : wq[u];
        const uint32_t(&s)[MT] = kCopyRing ? sc : sq[u];
        const bool small_scales = mxfp4_small_scales(s);
        constexpr int to = kCopyRing ? u : (u + kPrefetch<NT>) % kSlots;  // chunk c + kPrefetch
        load(wq[to], sq[to]);
        if constexpr (kPrefetchB) {
          if constexpr (kCopyRing) {
#pragma unroll
            for (int b = 0; b < 2; ++b)
#pragma unroll
              for (int q = 0; q < kParts; ++q)
#pragma unroll
                for (int j = 0; j < NT; ++j) bc[b][q][j] = bq[0][b][q][j];
          }
          load_b(c + 1, bq[(u + 1) % kSlotsB]);
        }
        uint4(&bx)[2][kParts][NT] = kSlotsB == 2 ? bq[u % kSlotsB] : bc;
        static_for<2>([&](auto b_) {
          constexpr int b = decltype(b_)::value;
          if (2 * c + b >= groups) return;  // group-uniform
          if constexpr (!kPrefetchB) {
#pragma unroll
            for (int q = 0; q < kParts; ++q)
#pragma unroll
              for (int j = 0; j < NT; ++j) bx[b][q][j] = bp[j][12 * b + 4 * q];
          }
          uint32_t ar[MT][2][4];
          mxfp4_chunk_block<b>(w, s, small_scales, ar);
          if constexpr (kPartsAsColumns)
            mma_block_parts_as_columns<P>(acc, ar, bx[b][0][0]);
          else
            mma_block(acc, ar, bx[b]);
        });
        if constexpr (!kPrefetchB) {
#pragma unroll
          for (int j = 0; j < NT; ++j) bp[j] += 24;
        }
      });
    }

    // The quarters' partial sums, then group 0 writes the tile.
    partial.store(group, lane, acc);
    __syncthreads();
    if (group == 0) {
      // Lane holds rows j0 + 16 m + {g, g + 8}, columns 8 j + 2 t + {0, 1}.
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = j0 + 16 * m + 8 * h + g;
            const float bias = row < a.out ? a.bias[int64_t(e) * a.out + row] : 0.0f;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int n = 8 * j + 2 * t + c, i = 2 * h + c;
              const float v = partial.sum(m, j, i, lane) + bias;
              const bool live = row < a.out && n < np;
              const int64_t p = live ? pair_at(n) : 0;
              if (live) a.y[p * a.out + row] = v;
              if constexpr (kSwiGLU) {
                // Gate 2i and linear 2i + 1 sit in lanes g and g + 1 (lane + 4).
                const float lin = __shfl_xor(v, 4);
                if (live && g % 2 == 0 && a.act != nullptr)
                  write_act(a, p, row / 2, swiglu_oai(v, lin, a.alpha, a.limit));
              }
            }
          }
    }
    __syncthreads();  // the partial sums are read before the next tile writes them
  }
}

// The wide tiles' blocks per SM the register budget is cut for, and the chunks of weights each
// lane keeps in flight beyond the one in use: the 8-pair tiles four blocks and one chunk (128
// registers; at five blocks, 96 registers, the three parts' separate chains spill 108 bytes, and
// batch 64 took 1 % longer; at four blocks and two chunks mlp2 took 9 % longer), the 16-pair tiles
// four and one (128 registers, spilling; at three blocks, 168 registers, batch 128 and 256 took 2
// % longer). With 32-pair tiles (255 registers, one block per SM, two chunks ahead) prefill's mlp1
// took 13 % longer than with the 16-pair ones and batch 512's step 11 % (docs/measurements.md).
constexpr int kWideMoeBlocksPerSm = 4;

// Wide tiles: four groups on 128 rows of one expert by 8 NT pairs, the pairs' split inputs shared
// through shared memory (mma_tiles.h, "wide tiles"); a group's rows, weights and MMA steps as in
// f32_mxfp4w_moe_mma. 16 and 8 pairs from about 16 and 8 per expert (batched decode, prefill;
// moe_tiling).
template <int P, bool kSwiGLU, int NT>
__global__ void __launch_bounds__(kMmaThreads, kWideMoeBlocksPerSm)
    f32_mxfp4w_moe_mma_wide(const MoeArgs a, const int32_t* routing, const uint4* split) {
  constexpr int MT = 2, kCols = 8 * NT;
  using Stager = WideStager<kCols, P>;
  const int lane = int(threadIdx.x) % kMmaLanes, warp = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int j0 = int(blockIdx.x) * kWideRows + 32 * warp;  // the warp's first row
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  __shared__ WideStaged<kCols, P> staged;
  __shared__ WideQuarters<MT, NT> quarters;
  const int k = a.k;
  const uint4* const packed_blocks = reinterpret_cast<const uint4*>(a.blocks);
  const uint32_t* const packed_scales = reinterpret_cast<const uint32_t*>(a.scales);
  const Mxfp4Packing pk(a.out, a.in);
  const RoutingView<const int32_t> rv = routing_view(routing, a.experts);
  const int tiles = rv.tile_start[a.experts + 1];
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
    const int first = rv.bucket_start[bucket] + (tile - rv.tile_start[bucket]) * kCols;
    const int np = min(kCols, rv.bucket_start[bucket + 1] - first);
    const auto pair_at = [&](int n) { return rv.sorted[first + n]; };
    if (bucket == a.experts) {  // invalid expert indices: NaN for every output of the tile
      const int j_block = int(blockIdx.x) * kWideRows;
      for (int i = int(threadIdx.x); i < np * kWideRows; i += kMmaThreads) {  // each output once
        const int n = i / kWideRows, j = j_block + i % kWideRows;
        if (j < a.out && (!kSwiGLU || j % 2 == 0)) write_invalid(a, pair_at(n), j, j / 2, kSwiGLU);
      }
      continue;
    }
    const int e = bucket;

    // The staging (WideStager): a pair past the tile's stages its first pair.
    Stager stager = [&] {
      const int n = int(threadIdx.x) / Stager::kThreadsPerCol;
      const int p = pair_at(n < np ? n : 0), r = p / k, slot = p % k;
      const int64_t v = int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
      return Stager(int(threadIdx.x), split + (v / 32) * kSplitQuadsPerBlock);
    }();

    // A: the warp's rows, the lane's 16 bytes and 4 scale bytes of each chunk (as in
    // f32_mxfp4w_moe_mma), one chunk ahead, walked over the whole input.
    const uint4* ap[MT];
    const uint32_t* sp[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int64_t tile_chunk =
          (int64_t(e) * pk.row_tiles + min(int64_t(j0 / 16 + m), pk.row_tiles - 1)) * pk.chunks;
      ap[m] = packed_blocks + tile_chunk * kMmaLanes + lane;
      sp[m] = packed_scales + tile_chunk * 8 + g;
    }
    uint4 wq[MT];
    uint32_t sq[MT];
    int next = 0;
    const auto load = [&](uint4(&w)[MT], uint32_t(&s)[MT]) {
      const bool live = next < chunks;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (live) {
          w[m] = *ap[m];
          s[m] = *sp[m];
        }
        ap[m] += kMmaLanes;
        sp[m] += 8;
      }
      ++next;
    };
    load(wq, sq);
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
        uint4 w[MT];
        uint32_t s[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) w[m] = wq[m], s[m] = sq[m];
        load(wq, sq);
        const bool small_scales = mxfp4_small_scales(s);
        static_for<2>([&](auto b_) {
          constexpr int b = decltype(b_)::value;
          if (2 * c + b >= groups) return;  // block-uniform
          uint4 bx[P][NT];
          wide_b_fragments(staged, c, b, g, t, bx);
          uint32_t ar[MT][2][4];
          mxfp4_chunk_block<b>(w, s, small_scales, ar);
          mma_block(acc, ar, bx);
        });
        stager.store(staged, c + 1, chunks);
        __syncthreads();  // chunk c + 1 staged, chunk c read by every group
      }
      quarters.fold(quarter, warp, lane, acc, s01);
    }

    // The warp writes its rows: lane holds rows j0 + 16 m + {g, g + 8}, columns 8 j + 2 t + {0, 1}.
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = j0 + 16 * m + 8 * h + g;
          const float bias = row < a.out ? a.bias[int64_t(e) * a.out + row] : 0.0f;
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int n = 8 * j + 2 * t + cc, i = 2 * h + cc;
            const float v = acc[m][j][i] + bias;
            const bool live = row < a.out && n < np;
            const int64_t p = live ? pair_at(n) : 0;
            if (live) a.y[p * a.out + row] = v;
            if constexpr (kSwiGLU) {
              // Gate 2i and linear 2i + 1 sit in lanes g and g + 1 (lane + 4).
              const float lin = __shfl_xor(v, 4);
              if (live && g % 2 == 0 && a.act != nullptr)
                write_act(a, p, row / 2, swiglu_oai(v, lin, a.alpha, a.limit));
            }
          }
        }
  }
}

// ------------------------------------------------------ warpgroup tiles (wgmma, bf16) ---
// Steps of 64 or more pairs per expert (prefill; batches of 512 and more) on the bf16 path where
// the GPU has Hopper's warpgroup MMA (warpgroup_mma_available): 128 rows of one expert by
// kWarpgroupCols pairs (device/warpgroup_tiles.h), a warp decoding its 32 rows' MXFP4 into A
// registers as the wide tiles do, two chunks of weights in flight.
// Pairs per expert from which a step takes the warpgroup tiles (moe_tiling): full tiles.
constexpr int kWarpgroupMinPairs = kWarpgroupCols;

#if PARITY_DEVICE_WGMMA
// A of the warpgroup tiles: the warp's MXFP4 rows (as in f32_mxfp4w_moe_mma_wide), the weights of
// chunks c + 1 and c + 2 in flight while chunk c is decoded.
struct Mxfp4WarpgroupA {
  static constexpr int MT = kWarpgroupRowTiles;
  const uint4* ap[MT];
  const uint32_t* sp[MT];
  int next_chunk, chunks;
  uint4 wq[2][MT], w[MT];
  uint32_t sq[2][MT], s[MT];
  bool small_scales;
  __device__ __forceinline__ Mxfp4WarpgroupA(const MoeArgs& a, int e, int j0, int lane, int chunks_)
      : next_chunk(0), chunks(chunks_) {
    const Mxfp4Packing pk(a.out, a.in);
    const int g = lane / 4;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int64_t tile_chunk =
          (int64_t(e) * pk.row_tiles + min(int64_t(j0 / 16 + m), pk.row_tiles - 1)) * pk.chunks;
      ap[m] = reinterpret_cast<const uint4*>(a.blocks) + tile_chunk * kMmaLanes + lane;
      sp[m] = reinterpret_cast<const uint32_t*>(a.scales) + tile_chunk * 8 + g;
    }
    load(wq[0], sq[0]);
    load(wq[1], sq[1]);
  }
  __device__ __forceinline__ void load(uint4 (&wl)[MT], uint32_t (&sl)[MT]) {
    const bool live = next_chunk < chunks;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (live) {
        wl[m] = *ap[m];
        sl[m] = *sp[m];
      }
      ap[m] += kMmaLanes;
      sp[m] += 8;
    }
    ++next_chunk;
  }
  __device__ __forceinline__ void next() {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      w[m] = wq[0][m], s[m] = sq[0][m];
      wq[0][m] = wq[1][m], sq[0][m] = sq[1][m];
    }
    load(wq[1], sq[1]);
    small_scales = mxfp4_small_scales(s);
  }
  template <int b>
  __device__ __forceinline__ void block(uint32_t (&ar)[MT][2][4]) const {
    mxfp4_chunk_block<b>(w, s, small_scales, ar);
  }
};
#endif  // PARITY_DEVICE_WGMMA

template <bool kSwiGLU>
__global__ void __launch_bounds__(kMmaThreads, kWarpgroupBlocksPerSm)
    f32_mxfp4w_moe_wgmma(const MoeArgs a, const int32_t* routing, const uint4* split) {
#if PARITY_DEVICE_WGMMA
  constexpr int MT = kWarpgroupRowTiles, NT = kWarpgroupColTiles, kCols = kWarpgroupCols;
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  WarpgroupShared& sh = *reinterpret_cast<WarpgroupShared*>(shared_bytes);
  const int lane = int(threadIdx.x) % kMmaLanes, warp = int(threadIdx.x) / kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  const int j0 = int(blockIdx.x) * kWideRows + 32 * warp;  // the warp's first row
  const int groups = a.in / 32, chunks = (groups + 1) / 2;
  const int k = a.k;
  const RoutingView<const int32_t> rv = routing_view(routing, a.experts);
  const int tiles = rv.tile_start[a.experts + 1];
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
    const int first = rv.bucket_start[bucket] + (tile - rv.tile_start[bucket]) * kCols;
    const int np = min(kCols, rv.bucket_start[bucket + 1] - first);
    const auto pair_at = [&](int n) { return rv.sorted[first + n]; };
    if (bucket == a.experts) {  // invalid expert indices: NaN for every output of the tile
      const int j_block = int(blockIdx.x) * kWideRows;
      for (int i = int(threadIdx.x); i < np * kWideRows; i += kMmaThreads) {  // each output once
        const int n = i / kWideRows, j = j_block + i % kWideRows;
        if (j < a.out && (!kSwiGLU || j % 2 == 0)) write_invalid(a, pair_at(n), j, j / 2, kSwiGLU);
      }
      continue;
    }
    const int e = bucket;
    __syncthreads();  // every warp's products of the tile before have read their stages

    // The staging: a column past the tile's pairs stages its first pair (never written).
    const WarpgroupStager stager(warp, lane, [&](int n) {
      const int p = pair_at(n < np ? n : 0), r = p / k, slot = p % k;
      const int64_t v = int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
      return split + (v / 32) * kSplitQuadsPerBlock;
    });
    Mxfp4WarpgroupA a_src(a, e, j0, lane, chunks);
    float acc[MT][NT][4];
    warpgroup_tile_products<2>(sh, stager, chunks, groups, warp, lane, a_src, acc);

    // The warp writes its rows: lane holds rows j0 + 16 m + {g, g + 8}, columns 8 j + 2 t + {0, 1}.
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = j0 + 16 * m + 8 * h + g;
          const float bias = row < a.out ? a.bias[int64_t(e) * a.out + row] : 0.0f;
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int n = 8 * j + 2 * t + cc, i = 2 * h + cc;
            const float v = acc[m][j][i] + bias;
            const bool live = row < a.out && n < np;
            const int64_t p = live ? pair_at(n) : 0;
            if (live) a.y[p * a.out + row] = v;
            if constexpr (kSwiGLU) {
              const float lin = __shfl_xor(v, 4);
              if (live && g % 2 == 0 && a.act != nullptr)
                write_act(a, p, row / 2, swiglu_oai(v, lin, a.alpha, a.limit));
            }
          }
        }
  }
#else
  (void)a, (void)routing, (void)split;  // not built for this target; never launched here
#endif
}

// ------------------------------------------------------------- MXFP4 packing (upload) ---

// Packs `experts` experts' checkpoint blocks (uint32 words [E][out][groups][4]) into
// Mxfp4Packing's order: packed word i = ((tile chunk) 32 + lane) 4 + 2 h + b. Grid-stride.
__global__ void __launch_bounds__(kThreads)
    u8_mxfp4_pack_blocks(const uint32_t* raw, int64_t experts, int out, int groups, Mxfp4Packing pk,
                         uint32_t* packed) {
  const int64_t total = pk.tile_chunks(experts) * kMmaLanes * 4;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int hb = int(i % 4), lane = int(i / 4 % kMmaLanes);
    const Mxfp4Packing::Source src = pk.source(i / (4 * kMmaLanes), lane / 4, hb / 2, hb % 2);
    packed[i] = src.row < out && src.block < groups
                    ? raw[((src.e * out + src.row) * groups + src.block) * 4 + lane % 4]
                    : 0u;
  }
}

// The scales (uint8 [E][out][groups]) likewise: packed byte i = ((tile chunk) 8 + g) 4 + 2 h + b.
__global__ void __launch_bounds__(kThreads)
    u8_mxfp4_pack_scales(const uint8_t* raw, int64_t experts, int out, int groups, Mxfp4Packing pk,
                         uint8_t* packed) {
  const int64_t total = pk.scale_bytes(experts);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int hb = int(i % 4);
    const Mxfp4Packing::Source src = pk.source(i / 32, int(i / 4 % 8), hb / 2, hb % 2);
    packed[i] = src.row < out && src.block < groups
                    ? raw[(src.e * out + src.row) * groups + src.block]
                    : uint8_t(0);
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

// The checks every launcher of the expert linear makes, and its arguments.
MoeArgs moe_args(const ExpertWeights& w, const int32_t* idx, int batch, int k, const float* x,
                 int x_row_stride, int x_slot_stride, float* y, float* act, float alpha,
                 float limit, const MoeWorkspace& ws) {
  PARITY_DEVICE_REQUIRE(idx != nullptr && x != nullptr && y != nullptr && w.bias != nullptr,
                        "launch_f32_moe_linear: null idx, x, y or bias");
  PARITY_DEVICE_REQUIRE(batch > 0 && k > 0, "launch_f32_moe_linear: batch ", batch, " and k ", k,
                        " must be positive");
  PARITY_DEVICE_REQUIRE(w.experts > 0 && w.out > 0 && w.in > 0,
                        "launch_f32_moe_linear: experts ", w.experts, ", out ", w.out, ", in ",
                        w.in, " must be positive");
  PARITY_DEVICE_REQUIRE(x_row_stride >= 0 && x_slot_stride >= 0,
                        "launch_f32_moe_linear: strides");
  PARITY_DEVICE_REQUIRE(act == nullptr || w.out % 2 == 0,
                        "launch_f32_moe_linear: the fused SwiGLU needs an "
                        "even output (interleaved gate/linear), got ",
                        w.out);
  const bool act_split = act != nullptr && !ws.act_split.empty();
  if (act_split)
    PARITY_DEVICE_REQUIRE(moe_writes_act_split(w.out) && aligned16(ws.act_split.data()) &&
                              ws.act_split.size() >=
                                  split_bf16x3_words(int64_t(batch) * k * (w.out / 2)),
                          "launch_f32_moe_linear: the activation's split needs out / 2 (",
                          w.out / 2, ") a multiple of 32 and ",
                          split_bf16x3_words(int64_t(batch) * k * (w.out / 2)),
                          " words (16-byte aligned); the scratch holds ", ws.act_split.size());
  return MoeArgs{w.packed_blocks, w.packed_scales, w.dense, w.bias,
                 w.experts,       w.out,           w.in,    idx,
                 k,               x,               x_row_stride, x_slot_stride,
                 y,               act,             alpha,   limit,
                 act_split ? ws.act_split.data() : nullptr};
}

// Floats of x the step reads: the last pair's vector ends there.
int64_t moe_x_floats(int batch, int k, int x_row_stride, int x_slot_stride, int in) {
  return int64_t(batch - 1) * x_row_stride + int64_t(k - 1) * x_slot_stride + in;
}

void require_mxfp4(const ExpertWeights& w, const float* x, int x_row_stride, int x_slot_stride) {
  PARITY_DEVICE_REQUIRE(w.packed_blocks != nullptr && w.packed_scales != nullptr,
                        "launch_f32_moe_linear: null MXFP4 blocks or scales");
  PARITY_DEVICE_REQUIRE(w.in % 32 == 0 && x_row_stride % 32 == 0 && x_slot_stride % 32 == 0,
                        "launch_f32_moe_linear: MXFP4 input ", w.in, " and x strides ",
                        x_row_stride, ", ", x_slot_stride, " must be multiples of 32");
  PARITY_DEVICE_REQUIRE(aligned16(w.packed_blocks) && aligned16(w.packed_scales) && aligned16(x),
                        "launch_f32_moe_linear: MXFP4 blocks, scales and x must be 16-byte "
                        "aligned");
}

template <int P, bool kSwiGLU, int MT, int NT>
void launch_mma(const MoeArgs& a, int pairs, const int32_t* routing, const uint4* split,
                int64_t tiles_bound, bool wide, hipStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.out, 16 * MT)),
                  unsigned(std::min<int64_t>(tiles_bound, 65535)));
  if constexpr (NT == 1) {  // pair mode takes one pair per tile
    if (routing == nullptr) {
      HIP_CHECK(launch_programmatic(&f32_mxfp4w_moe_mma<P, kSwiGLU, false, MT, NT>, grid,
                                    dim3(kMmaThreads), 0, stream, a, pairs, routing, split));
      HIP_LAUNCH_CHECK("f32_mxfp4w_moe_mma", stream);
      return;
    }
  }
  if constexpr (NT == 1) {  // grouped 8-pair tiles: 32 rows a block, or wide
    if (!wide) {
      f32_mxfp4w_moe_mma<P, kSwiGLU, true, MT, NT>
          <<<grid, kMmaThreads, 0, stream>>>(a, pairs, routing, split);
      HIP_LAUNCH_CHECK("f32_mxfp4w_moe_mma", stream);
      return;
    }
  }
  if constexpr (NT == kWarpgroupColTiles) {  // one warpgroup on 128 rows of 64 pairs
    static_assert(P == 1, "the warpgroup tiles take the bf16 path's one part");
    const auto kernel = &f32_mxfp4w_moe_wgmma<kSwiGLU>;
    HIP_CHECK(hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                  hipFuncAttributeMaxDynamicSharedMemorySize,
                                  kWarpgroupSharedBytes));
    const dim3 wg_grid(unsigned(ceil_div(a.out, kWideRows)), grid.y);
    kernel<<<wg_grid, kMmaThreads, kWarpgroupSharedBytes, stream>>>(a, routing, split);
    HIP_LAUNCH_CHECK("f32_mxfp4w_moe_wgmma", stream);
  } else {
    // Four warps on 128 rows of 8 NT pairs (16-pair tiles are always wide).
    const dim3 wide_grid(unsigned(ceil_div(a.out, kWideRows)), grid.y);
    f32_mxfp4w_moe_mma_wide<P, kSwiGLU, NT>
        <<<wide_grid, kMmaThreads, 0, stream>>>(a, routing, split);
    HIP_LAUNCH_CHECK("f32_mxfp4w_moe_mma_wide", stream);
  }
}

}  // namespace

namespace {
void require_packable(const char* launcher, const void* raw, int experts, int out, int in,
                      const void* packed) {
  PARITY_DEVICE_REQUIRE(raw != nullptr && packed != nullptr, launcher, ": null raw or packed");
  PARITY_DEVICE_REQUIRE(experts > 0 && out > 0 && in > 0 && in % 32 == 0, launcher, ": experts ",
                        experts, ", out ", out, ", in ", in,
                        " must be positive, in a multiple of 32");
}
unsigned pack_grid(int64_t total) {
  return unsigned(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
}
}  // namespace

void launch_u8_mxfp4_pack_blocks(const uint8_t* raw_blocks, int experts, int out, int in,
                                 uint8_t* packed_blocks, hipStream_t stream) {
  require_packable("launch_u8_mxfp4_pack_blocks", raw_blocks, experts, out, in, packed_blocks);
  PARITY_DEVICE_REQUIRE(aligned16(raw_blocks) && aligned16(packed_blocks),
                        "launch_u8_mxfp4_pack_blocks: raw and packed blocks must be 16-byte "
                        "aligned");
  const Mxfp4Packing pk(out, in);
  u8_mxfp4_pack_blocks<<<pack_grid(pk.block_bytes(experts) / 4), kThreads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(raw_blocks), experts, out, in / 32, pk,
      reinterpret_cast<uint32_t*>(packed_blocks));
  HIP_LAUNCH_CHECK("u8_mxfp4_pack_blocks", stream);
}

void launch_u8_mxfp4_pack_scales(const uint8_t* raw_scales, int experts, int out, int in,
                                 uint8_t* packed_scales, hipStream_t stream) {
  require_packable("launch_u8_mxfp4_pack_scales", raw_scales, experts, out, in, packed_scales);
  const Mxfp4Packing pk(out, in);
  u8_mxfp4_pack_scales<<<pack_grid(pk.scale_bytes(experts)), kThreads, 0, stream>>>(
      raw_scales, experts, out, in / 32, pk, packed_scales);
  HIP_LAUNCH_CHECK("u8_mxfp4_pack_scales", stream);
}

size_t moe_routing_ints(int64_t pairs, int experts) {
  return size_t(pairs) + 2 * (size_t(experts) + 2);
}

namespace detail {

MoeTiling moe_tiling(int64_t pairs, int experts, Precision precision, bool warpgroup) {
  if (pairs <= kPairModeMaxPairs) return {false, 2, 1, false};
  // About kWarpgroupMinPairs per expert or more, where the warpgroup tiles run (bf16 on Hopper):
  // 128 rows by 64 pairs (from 12 and 24 per expert they made batch 128 and 256 slower than the
  // 16-pair tiles: docs/measurements.md).
  if (warpgroup && pairs >= kWarpgroupMinPairs * int64_t(experts))
    return {true, 2, kWarpgroupColTiles, true, true};
  // About 16 pairs per expert or more (8 on the bf16 path): 128-row by 16-pair tiles (prefill's
  // 512 per expert too); 8 or more, 128 by 8; fewer, 32 by 8, the four warps of a block on a
  // quarter of the input each (at 1-4 pairs per expert the wide blocks were 3-9 % slower: too
  // few blocks). The bf16 path's one part makes a tile's MMA steps a third of the fp32 path's,
  // so at 8 per expert the 16-pair tiles, which read most experts' weights once where the 8-pair
  // tiles read them about 1.5 times, took mlp1 and mlp2 from 213 and 115 to 185 and 100 us at
  // batch 64 (docs/measurements.md).
  const int64_t wide16 = precision == Precision::bf16 ? 8 : 16;
  if (pairs >= wide16 * int64_t(experts)) return {true, 2, 2, true};
  if (pairs >= 8 * int64_t(experts)) return {true, 2, 1, true};
  return {true, 2, 1, false};
}

void launch_f32_mxfp4w_moe_mma(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                               const float* x, int x_row_stride, int x_slot_stride, float* y,
                               float* act, float alpha, float limit, const MoeWorkspace& ws,
                               MoeTiling tiling, hipStream_t stream) {
  MoeArgs a = moe_args(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act, alpha, limit, ws);
  a.idx_settled = ws.idx_settled;
  require_mxfp4(w, x, x_row_stride, x_slot_stride);
  const int64_t pairs = int64_t(batch) * k;
  PARITY_DEVICE_REQUIRE(pairs <= int64_t(1) << 30, "launch_f32_moe_linear: ", pairs,
                        " (row, slot) pairs exceed the kernel's int32 pair index");
  const int mt = tiling.m_tiles, nt = tiling.n_tiles;
  if (tiling.warpgroup) {
    PARITY_DEVICE_REQUIRE(mt == 2 && nt == kWarpgroupColTiles && tiling.grouped && tiling.wide,
                          "launch_f32_moe_linear: the warpgroup tiles are 2 x 16 rows by ",
                          kWarpgroupColTiles, " x 8 pairs, grouped");
    PARITY_DEVICE_REQUIRE(ws.precision == Precision::bf16 && warpgroup_mma_available(),
                          "launch_f32_moe_linear: the warpgroup tiles take the bf16 precision on a "
                          "GPU with warpgroup MMA (sm_90a built, compute capability 9.0)");
  } else {
    PARITY_DEVICE_REQUIRE(mt == 2 && (nt == 1 || nt == 2), "launch_f32_moe_linear: tiles of ", mt,
                          " x 16 rows by ", nt,
                          " x 8 pairs are not built (2 x 1 and 2 x 2 are, and the warpgroup's)");
  }
  PARITY_DEVICE_REQUIRE(tiling.grouped || (nt == 1 && !tiling.wide),
                        "launch_f32_moe_linear: pair mode takes one pair per tile, 32 rows a "
                        "block");
  PARITY_DEVICE_REQUIRE(tiling.wide || nt == 1,
                        "launch_f32_moe_linear: tiles of 16 pairs are wide (128 rows a block)");
  const int64_t x_floats = moe_x_floats(batch, k, x_row_stride, x_slot_stride, w.in);
  PARITY_DEVICE_REQUIRE(ws.split.size() >= split_bf16x3_words(x_floats),
                        "launch_f32_moe_linear: the split workspace holds ", ws.split.size(),
                        " words, the step needs ", split_bf16x3_words(x_floats),
                        " (split_bf16x3_words)");
  const int tile_pairs = 8 * nt;
  int64_t tiles_bound = pairs;
  const int32_t* routing = nullptr;
  if (tiling.grouped) {
    PARITY_DEVICE_REQUIRE(w.experts <= kMaxRoutedExperts, "launch_f32_moe_linear: ", w.experts,
                          " experts exceed the routing kernel's ", kMaxRoutedExperts);
    PARITY_DEVICE_REQUIRE(ws.routing.data() != nullptr &&
                              ws.routing.size() >= moe_routing_ints(pairs, w.experts),
                          "launch_f32_moe_linear: the routing workspace holds ", ws.routing.size(),
                          " int32, the step needs ", moe_routing_ints(pairs, w.experts),
                          " (moe_routing_ints)");
    moe_route_pairs_by_expert<<<1, kRouteThreads, 0, stream>>>(idx, int(pairs), w.experts,
                                                               tile_pairs, ws.routing.data());
    HIP_LAUNCH_CHECK("moe_route_pairs_by_expert", stream);
    routing = ws.routing.data();
    // At most one tile per pair, and at most ceil(n_b / P) per bucket (experts + 1 of them).
    tiles_bound =
        std::min(pairs, (pairs + int64_t(w.experts + 1) * (tile_pairs - 1)) / tile_pairs);
  }
  if (!ws.split_ready) launch_split_bf16x3(x, x_floats, ws.split, stream);
  const uint4* split = reinterpret_cast<const uint4*>(ws.split.data());
  const int np = int(pairs);
  const auto launch = [&]<int P>() {
    if constexpr (P == 1) {
      if (tiling.warpgroup) {
        constexpr int kNt = kWarpgroupColTiles;
        if (act != nullptr)
          launch_mma<P, true, 2, kNt>(a, np, routing, split, tiles_bound, true, stream);
        else
          launch_mma<P, false, 2, kNt>(a, np, routing, split, tiles_bound, true, stream);
        return;
      }
    }
    if (nt == 1) {
      if (act != nullptr)
        launch_mma<P, true, 2, 1>(a, np, routing, split, tiles_bound, tiling.wide, stream);
      else
        launch_mma<P, false, 2, 1>(a, np, routing, split, tiles_bound, tiling.wide, stream);
    } else {
      if (act != nullptr)
        launch_mma<P, true, 2, 2>(a, np, routing, split, tiles_bound, true, stream);
      else
        launch_mma<P, false, 2, 2>(a, np, routing, split, tiles_bound, true, stream);
    }
  };
  if (ws.precision == Precision::bf16)
    launch.template operator()<1>();
  else
    launch.template operator()<kSplitParts>();
}

}  // namespace detail

void launch_f32_moe_linear(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                           const float* x, int x_row_stride, int x_slot_stride, float* y,
                           float* act, float alpha, float limit, const MoeWorkspace& ws,
                           hipStream_t stream) {
  const MoeArgs a =
      moe_args(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act, alpha, limit, ws);
  const bool swiglu = act != nullptr;
  if (w.mxfp4) {
    const bool routable = w.experts <= kMaxRoutedExperts;
    detail::MoeTiling tiling =
        detail::moe_tiling(int64_t(batch) * k, w.experts, ws.precision,
                           ws.precision == Precision::bf16 && warpgroup_mma_available());
    if (!routable) tiling = {false, 2, 1};
    detail::launch_f32_mxfp4w_moe_mma(w, idx, batch, k, x, x_row_stride, x_slot_stride, y, act,
                                      alpha, limit, ws, tiling, stream);
    return;
  }
  PARITY_DEVICE_REQUIRE(w.dense != nullptr, "launch_f32_moe_linear: null dense expert weights");
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
