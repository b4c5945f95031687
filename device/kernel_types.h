// The plain types the kernels take (weights, step rows, attention shape, the paged KV cache), with
// no vendor header: host-only code (the runtime's planning, tests on machines without the GPU
// toolkit) includes this file alone; device/kernels.h includes it after device/hip_compat.h,
// which makes PARITY_HOST_DEVICE mean __host__ __device__ for the kernels (device code includes
// kernels.h first: a helper seen without it would be host-only and fail to compile there).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#ifndef PARITY_HOST_DEVICE
#define PARITY_HOST_DEVICE
#endif

namespace parity::device {

// The precision of the products on MMA tiles (the projections and the MXFP4 experts), a
// property of the device runtime (DeviceOptions::precision) that every launch reads:
//   fp32  exact: each float32 input split into three BF16 parts that sum to it (hi, mid, lo),
//         three products per weight, float32 accumulation (the traced default)
//   bf16  each input rounded once to BF16, to nearest even (the hi part alone): one product per
//         weight, float32 accumulation, as production engines feed the tensor cores; the
//         attention's products on BF16 MMA tiles too (q, k, the probabilities and v rounded
//         once: attention_mma_fuses), its KV cache BF16 (kv_cache_dtype)
// Everything else (norms, RoPE, the softmax, the router, sums, the GEMV of F16/F32 weights) runs
// in float32 in both.
enum class Precision : int { fp32, bf16 };
// The split parts a product of `p` uses.
PARITY_HOST_DEVICE constexpr int precision_parts(Precision p) {
  return p == Precision::fp32 ? 3 : 1;
}

// Element type of a matrix kept on the device in its checkpoint dtype.
enum class WeightType : int { bf16, f16, f32 };

// A row-major matrix [rows, cols] in device memory.
struct Matrix {
  WeightType type = WeightType::bf16;
  const void* data = nullptr;
  int rows = 0, cols = 0;
};

// MXFP4 expert weights as the MMA kernels read them (device/experts.hip), packed once on the
// device (launch_u8_mxfp4_pack_blocks / _scales) from the checkpoint's blocks [E, out, in / 32,
// 16] and scales [E, out, in / 32]: in the order in which the 32 lanes of a 16-row tile consume
// them, so that a lane's codes of one chunk (two blocks of 32 inputs) are one 16-byte load and a
// warp's loads are 512 contiguous bytes, its scales one 32-bit load. Rows are padded to whole
// tiles of 16 and blocks to whole chunks of two; padding is zero and never reaches a written
// result. With lane = 4 g + t (g < 8, t < 4), h, b < 2:
//   blocks: [E][row tile][chunk][lane][h][b] uint32: word t (codes 8t .. 8t+7) of block
//           2 chunk + b of row 16 tile + 8 h + g
//   scales: [E][row tile][chunk][g][h][b] uint8: the E8M0 scale of that row's block
// Only the bytes move: the kernel multiplies the same codes by the same inputs in the same order.
struct Mxfp4Packing {
  int64_t row_tiles = 0, chunks = 0;
  PARITY_HOST_DEVICE Mxfp4Packing(int out, int in)
      : row_tiles((int64_t(out) + 15) / 16), chunks((int64_t(in) / 32 + 1) / 2) {}
  static constexpr int64_t kTileChunkBytes = 512;      // codes of one row tile's chunk
  static constexpr int64_t kTileChunkScaleBytes = 32;  // its scales
  PARITY_HOST_DEVICE int64_t tile_chunks(int64_t experts) const {
    return experts * row_tiles * chunks;
  }
  PARITY_HOST_DEVICE int64_t block_bytes(int64_t experts) const {
    return tile_chunks(experts) * kTileChunkBytes;
  }
  PARITY_HOST_DEVICE int64_t scale_bytes(int64_t experts) const {
    return tile_chunks(experts) * kTileChunkScaleBytes;
  }
  // Where the packed entry (h, b) of row group g in tile chunk `tile_chunk` (counted over the
  // experts) comes from: expert e, row, block; a row >= out or a block >= in / 32 is padding.
  struct Source {
    int64_t e, row, block;
  };
  PARITY_HOST_DEVICE Source source(int64_t tile_chunk, int g, int h, int b) const {
    const int64_t c = tile_chunk % chunks, rt = tile_chunk / chunks % row_tiles;
    return {tile_chunk / chunks / row_tiles, 16 * rt + 8 * h + g, 2 * c + b};
  }
};

// Expert weights of one layer projection: W[e] is [out, in] mathematically.
struct ExpertWeights {
  bool mxfp4 = true;
  const uint8_t* packed_blocks = nullptr;  // mxfp4: Mxfp4Packing's blocks
  const uint8_t* packed_scales = nullptr;  // mxfp4: Mxfp4Packing's scales (E8M0)
  WeightType dense_type = WeightType::bf16;
  const void* dense = nullptr;  // dense: [E, in, out] (input-major, transformers layout)
  const float* bias = nullptr;  // [E, out]
  int experts = 0, out = 0, in = 0;
};

// KV-cache layer groups: the full-attention layers and the sliding-window layers page their
// blocks apart (a sliding layer keeps only its window's blocks).
inline constexpr int kKvGroups = 2;
inline constexpr int kKvFullGroup = 0;
inline constexpr int kKvSlidingGroup = 1;

// One row of the current step, as the kernels read it (built on the host, uploaded once per
// step: device/runtime/step.h).
struct StepRow {
  int32_t token = 0;
  int32_t pos = 0;  // absolute position
  int32_t seq = 0;  // sequence id
  // Offset of the row's sequence's block table of each KV group in KvCacheView::block_tables.
  int32_t kv_table[kKvGroups] = {0, 0};
  int64_t scores_offset = 0;  // element offset of the row's [nH, pos+2] block in scores/att
};

// Rows of one sequence that the attention kernels take together, reading the sequence's keys and
// values once for all of them: tile t is rows [first[t], first[t + 1]) (first[count] = the
// batch), consecutive rows of one sequence, at most kQueryTileRows of them (build_step makes
// them). count 0, or a tile per row: the kernels take one row at a time. Either way every score
// and every output is computed in the same order: the bits do not depend on the tiles.
inline constexpr int kQueryTileRows = 8;
struct QueryTiles {
  const int32_t* first = nullptr;  // device, count + 1 entries
  int count = 0;
  int singles = 0;  // leading tiles of one row each (tile t < singles is row t): decode rows
};
// The leading tiles of one row each of a step's tiles (`first`, count + 1 entries).
inline int leading_single_tiles(const int32_t* first, int count) {
  int n = 0;
  while (n < count && first[n + 1] - first[n] == 1 && first[n] == n) ++n;
  return n;
}

// The element type of the paged KV cache: float32, or BF16 (the bits of a float32 rounded to
// nearest even) where every reader rounds keys and values to BF16 anyway -- the bf16 precision's
// MMA attention (kv_cache_dtype) -- which halves the bytes a decode step reads.
enum class KvDtype : int { f32, bf16 };
PARITY_HOST_DEVICE constexpr int kv_dtype_bytes(KvDtype t) {
  return t == KvDtype::bf16 ? 2 : 4;
}

// The paged KV cache as the attention kernels see it. The pool is an array of blocks; a block
// holds `block_size` consecutive positions of one sequence for every layer of one group:
//   [block][slot (the layer's place in its group)][K, V][position in block][nKV d]  dtype
// A sequence's block table (per group) maps logical block j / block_size to a physical block;
// released or never-allocated entries are -1 and are never read (they hold no visible key).
struct KvCacheView {
  void* blocks = nullptr;
  const int32_t* block_tables = nullptr;  // the step's tables (StepRow::kv_table offsets)
  int block_shift = 0;                    // block_size = 1 << block_shift positions
  int slots = 0;                          // layer slots per block (the largest group)
  KvDtype dtype = KvDtype::f32;
};

// Element offset in KvCacheView::blocks of position j's row (kv_dim elements) of layer slot
// `slot`, keys (which = 0) or values (1), for a sequence whose group block table is `table`.
PARITY_HOST_DEVICE inline int64_t kv_row_offset(const KvCacheView& kv, const int32_t* table,
                                                int slot, int which, int j, int kv_dim) {
  const int64_t block = table[j >> kv.block_shift];
  const int64_t in_block = j & ((1 << kv.block_shift) - 1);
  return ((((block * kv.slots + slot) * 2 + which) << kv.block_shift) + in_block) * kv_dim;
}

// Shape of one attention layer and its place in the KV cache.
struct AttentionShape {
  int n_heads = 0, n_kv = 0, head_dim = 0;
  int window = 0;       // sliding window (keys pos - window < j <= pos), 0 = full causal
  int max_context = 0;  // positions per sequence
  int kv_group = 0;     // kKvFullGroup or kKvSlidingGroup
  int kv_slot = 0;      // the layer's slot in its group's blocks
  float scale = 0;      // 1 / sqrt(head_dim)
};

// Whether the bf16 precision's MMA attention (launch_bf16_attention_mma, device/kernels.h) is a
// layer's every-step attention: the bf16 precision, head_dim 16, 32 or 64, at most
// kAttentionMmaMaxGroup query heads per KV head.
constexpr int kAttentionMmaMaxGroup = 8;
PARITY_HOST_DEVICE inline bool attention_mma_fuses(const AttentionShape& a, Precision precision) {
  const int g = a.n_kv > 0 ? a.n_heads / a.n_kv : 0;
  return precision == Precision::bf16 &&
         (a.head_dim == 16 || a.head_dim == 32 || a.head_dim == 64) && g >= 1 &&
         g <= kAttentionMmaMaxGroup;
}
// The KV cache's dtype for layers of shape `a` (every layer of a model has the same heads):
// BF16 where the MMA attention is every step's, which rounds each key and value to BF16 as it
// reads them -- the cache holding them rounded gives it the same bits from half the bytes (the
// float32 kernels that recompute a traced stage then read the same rounded values); float32
// otherwise.
PARITY_HOST_DEVICE inline KvDtype kv_cache_dtype(const AttentionShape& a, Precision precision) {
  return attention_mma_fuses(a, precision) ? KvDtype::bf16 : KvDtype::f32;
}

// Sampling parameters of one row (launch_f32_sample), as engine/sampler.h defines them:
// greedy when temperature <= 0 or top_k == 1; top_k 0 and top_p >= 1 turn the cuts off. The
// generator's keys are the request's seed, id and draw index.
struct SampleParams {
  double temperature = 0;
  int top_k = 0;
  double top_p = 1;
  uint64_t seed = 0;
  uint64_t request = 0;
  uint64_t step = 0;
};

// The peer-store all-reduce of a tensor-parallel group (device/runtime/peer_group.h,
// launch_f32_peer_rank_sum_residual): every place it touches, on this rank's GPU and its peers'.
// Each call is numbered by `epoch` (one counter per block, the same count on every rank, kept on
// the device so that a replayed graph counts too); its parity picks the parts buffer, so that a
// rank already at the next call never writes over parts another rank still reads.
inline constexpr int kPeerMaxRanks = 8;
inline constexpr int kPeerBlocks = 32;
struct PeerReduceView {
  int ranks = 0, rank = 0;
  // parts[r][p]: rank r's parts of parity p, [ranks][capacity] floats; this rank writes its
  // partial sums at + rank n of every rank's, and adds its own buffer's parts.
  float* parts[kPeerMaxRanks][2] = {};
  // flags[r]: rank r's arrival words, [kPeerBlocks][kPeerMaxRanks]; rank q's block b writes
  // flags[r][b kPeerMaxRanks + q] = its epoch once its part is in rank r's buffer.
  uint32_t* flags[kPeerMaxRanks] = {};
  uint32_t* epoch = nullptr;  // this rank's [kPeerBlocks] counters
  // Host-mapped words: `abort` nonzero ends every wait (the group was given up); a wait that
  // ends without the peer writes failed[0] = 1 + the rank it waited for.
  const volatile uint32_t* abort = nullptr;
  uint32_t* failed = nullptr;
  uint64_t timeout_ticks = 0;  // device_wall_clock() ticks a wait may take
  int64_t capacity = 0;        // floats of one rank's part
};

// The attention output kernel splits the key axis in chunks: at most 64 splits per row whatever
// the context (a bounded workspace), at least 256 keys each.
inline int attention_split_keys(int max_context) {
  const int per = (std::max(max_context, 1) + 63) / 64;
  return std::max(256, (per + 31) / 32 * 32);
}
// The bf16 precision's attention goes over the keys in tiles of this many, at fixed offsets.
constexpr int kAttentionKeyTile = 64;
// Key tiles a row at a position up to max_pos sees on a layer of the given window (0: every key):
// every tile up to max_pos's, or the window's keys over at most ceil((window - 1) / 64) + 1.
PARITY_HOST_DEVICE inline int attention_key_tiles(int max_pos, int window) {
  const int all = max_pos / kAttentionKeyTile + 1;
  const int windowed = (window + kAttentionKeyTile - 2) / kAttentionKeyTile + 1;
  return window > 0 && windowed < all ? windowed : all;
}
// Floats of the bf16 decode kernel's partials for `batch` rows up to max_pos: (o, m, l) per row,
// head and key tile (launch_bf16_attention_mma).
inline size_t attention_partials_floats(const AttentionShape& a, int batch, int max_pos) {
  return size_t(batch) * size_t(a.n_heads) * size_t(attention_key_tiles(max_pos, a.window)) *
         size_t(a.head_dim + 2);
}
// At most this many floats of the workspace go to the bf16 partials (256 MiB): a step that needs
// more folds its key tiles in one kernel instead, with the same bits.
constexpr size_t kAttentionPartialsMaxFloats = size_t(64) << 20;
// Floats of the attention workspace for `batch` rows: the float32 output kernel's split sums,
// [B][max splits][nH][d], or the bf16 decode partials of every key tile of the context (full
// attention: the window's need no more), up to kAttentionPartialsMaxFloats, whichever is more.
inline size_t attention_workspace_floats(const AttentionShape& a, int batch) {
  const int split = attention_split_keys(a.max_context);
  const size_t sums = size_t(batch) * size_t((a.max_context + split - 1) / split) *
                      size_t(a.n_heads) * size_t(a.head_dim);
  AttentionShape full = a;
  full.window = 0;
  const size_t partials =
      std::min(attention_partials_floats(full, batch, std::max(a.max_context - 1, 0)),
               kAttentionPartialsMaxFloats);
  return std::max(sums, partials);
}

}  // namespace parity::device
