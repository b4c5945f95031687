// Attention with sinks, GQA and the sliding window (gpt_oss/torch/model.py sdpa), as three
// stage kernels over the KV cache, each split over the key axis for long contexts:
//   scores:   S[h][j] = (q_h . k_{h/g, j}) * scale for visible j, -inf for masked j <= pos,
//             S[h][pos + 1] = sinks[h] (raw, not scaled). Visible: j <= pos and, on sliding
//             layers, pos - j < window (window keys including the current one).
//   softmax:  P[h] = softmax(S[h][0 .. pos + 1]); the sink takes probability mass only.
//   output:   O_h = sum_j P[h][j] v_{h/g, j} (no value vector for the sink).
// The KV-cache append (the `scores` stage writes this step's k_rope and v rows first) is its
// own kernel. GQA: query head h reads KV head h / g with g = nH / nKV (integer division).
// The cache is paged (KvCacheView): key j of a row lives in block table[j / block_size] of its
// sequence. Only addresses go through the table; every sum runs in the same order as over a
// contiguous cache, so the results do not depend on the block size or the blocks' placement.
// Rows of one sequence (a prefill chunk) go in query tiles (QueryTiles): the scores and output
// kernels of a tile read each key and value once for all of its rows and keep several sums per
// thread in registers, each sum still the same chain of operations as the one-row kernels'.
// Decode steps (every row its own tile, contexts up to 1,024 keys) run the three stages as one
// kernel (f32_attention_decode) with the same chains and trees: the same bits.
#include <algorithm>
#include <climits>

#include "device/device_math.h"
#include "device/kv_access.h"
#include "device/split_inputs.h"

namespace parity::device {
namespace {

constexpr int kScoreTile = 64;  // keys per scores block
// The attention output's shared-memory tile: at most kPvTile keys, and as many as each thread's
// kPvMaxQuads value loads (16 bytes each) and kPvMaxProbs probability loads cover (the kernel's
// register arrays).
constexpr int kPvTile = 128;
constexpr int kPvMaxQuads = 4;
constexpr int kPvMaxProbs = 2;
constexpr int kThreads = 256;

__device__ __forceinline__ int first_visible_key(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// The block table of row r's sequence for the layer's group.
__device__ __forceinline__ const int32_t* row_table(const KvCacheView& kv, const AttentionShape& a,
                                                    const StepRow& row) {
  return kv.block_tables + row.kv_table[a.kv_group];
}

__global__ void __launch_bounds__(kThreads)
    f32_kv_cache_append(AttentionShape a, KvCacheView kv, const StepRow* __restrict__ rows,
                        const float* __restrict__ k, const float* __restrict__ v) {
  const int r = int(blockIdx.x);
  const int kv_dim = a.n_kv * a.head_dim;
  const int32_t* table = row_table(kv, a, rows[r]);
  const int64_t kc = kv_row_offset(kv, table, a.kv_slot, 0, rows[r].pos, kv_dim);
  const int64_t vc = kv_row_offset(kv, table, a.kv_slot, 1, rows[r].pos, kv_dim);
  for (int t = int(threadIdx.x); t < kv_dim; t += int(blockDim.x)) {
    kv_store(kv, kc + t, k[int64_t(r) * kv_dim + t]);
    kv_store(kv, vc + t, v[int64_t(r) * kv_dim + t]);
  }
}

// grid (key tiles, nKV, B). The block holds the g query heads of one KV head and a tile of keys
// in shared memory; thread item (hh, jj) computes one score with a sequential fmaf dot.
__global__ void __launch_bounds__(kThreads)
    f32_attention_scores_gqa_sink(AttentionShape a, KvCacheView kv,
                                  const StepRow* __restrict__ rows, const float* __restrict__ q,
                                  const float* __restrict__ sinks, float* __restrict__ scores) {
  extern __shared__ float smem[];
  const int r = int(blockIdx.z), kvh = int(blockIdx.y), j0 = int(blockIdx.x) * kScoreTile;
  const int pos = rows[r].pos, cols = pos + 2;
  if (j0 > pos) return;
  const int d = a.head_dim, g = a.n_heads / a.n_kv;
  const int first = first_visible_key(pos, a.window);
  const int j_end = min(j0 + kScoreTile, pos + 1);
  float* srow = scores + rows[r].scores_offset + int64_t(kvh) * g * cols;  // head kvh*g, column 0
  if (blockIdx.x == 0)
    for (int t = int(threadIdx.x); t < g; t += int(blockDim.x))
      srow[int64_t(t) * cols + pos + 1] = sinks[kvh * g + t];
  const int items = g * kScoreTile;
  if (j_end <= first) {  // the whole tile is outside the window
    for (int t = int(threadIdx.x); t < items; t += int(blockDim.x)) {
      const int hh = t / kScoreTile, j = j0 + t % kScoreTile;
      if (j < j_end) srow[int64_t(hh) * cols + j] = -INFINITY;
    }
    return;
  }
  float* q_s = smem;          // [g][d]
  float* k_s = smem + g * d;  // [tile][d + 1] (padded: conflict-free column reads)
  const float* qr = q + (int64_t(r) * a.n_heads + int64_t(kvh) * g) * d;
  for (int t = int(threadIdx.x); t < g * d; t += int(blockDim.x)) q_s[t] = qr[t];
  // A key outside [first, j_end) reads the row of pos instead (always there: the append ran
  // first) and is zeroed: every load is unconditional, so a thread's loads overlap.
  const int kv_dim = a.n_kv * d;
  const int32_t* table = row_table(kv, a, rows[r]);
  const int64_t kc = int64_t(kvh) * d;
  for (int t = int(threadIdx.x); t < kScoreTile * d; t += int(blockDim.x)) {
    const int jj = t / d, i = t % d, j = j0 + jj;
    const bool visible = j < j_end && j >= first;
    const float x =
        kv_load(kv, kc + kv_row_offset(kv, table, a.kv_slot, 0, visible ? j : pos, kv_dim) + i);
    k_s[jj * (d + 1) + i] = visible ? x : 0.0f;
  }
  __syncthreads();
  for (int t = int(threadIdx.x); t < items; t += int(blockDim.x)) {
    const int hh = t / kScoreTile, jj = t % kScoreTile, j = j0 + jj;
    if (j >= j_end) continue;
    float s = -INFINITY;
    if (j >= first) {
      const float* qh = q_s + hh * d;
      const float* kj = k_s + jj * (d + 1);
      float acc = 0.0f;
      for (int i = 0; i < d; ++i) acc = fmaf(qh[i], kj[i], acc);
      s = acc * a.scale;
    }
    srow[int64_t(hh) * cols + j] = s;
  }
}

// grid (nH, B): one block per (row, head) over the pos + 2 columns.
__global__ void __launch_bounds__(kThreads)
    f32_softmax_with_sink(int n_heads, const StepRow* __restrict__ rows,
                          const float* __restrict__ scores, float* __restrict__ probs) {
  __shared__ float scratch[32];
  const int r = int(blockIdx.y), h = int(blockIdx.x);
  const int cols = rows[r].pos + 2;
  const int64_t at = rows[r].scores_offset + int64_t(h) * cols;
  const float* s = scores + at;
  float* p = probs + at;
  float m = -INFINITY;
  for (int j = int(threadIdx.x); j < cols; j += int(blockDim.x)) m = fmaxf(m, s[j]);
  m = block_max(m, scratch);
  float z = 0.0f;
  for (int j = int(threadIdx.x); j < cols; j += int(blockDim.x)) z += expf(s[j] - m);
  z = block_sum(z, scratch);
  for (int j = int(threadIdx.x); j < cols; j += int(blockDim.x)) p[j] = expf(s[j] - m) / z;
  (void)n_heads;
}

// grid (splits, nKV, B), block >= g d threads: thread (hh, i) sums P[h][j] v_j[i] over the keys
// of its split in order. A row with one split writes out directly; otherwise partial sums go
// to the workspace [B][max_splits][nH][d] and f32_attention_pv_combine adds them in order.
// The keys go through shared memory a tile of `tile` at a time: the block loads the tile's value
// rows (its KV head's d floats of each key, 16-byte loads where d allows) and the g heads'
// probabilities together, the next tile's loads are in flight while the threads sum the current
// one, and each thread then adds its keys in order exactly as it would from global memory -- the
// loads of a whole tile overlap instead of a thread's chain of dependent ones (a row at batch 1
// has only nKV blocks).
__global__ void __launch_bounds__(1024)
    f32_attention_pv_gqa(AttentionShape a, KvCacheView kv, int split_keys, int max_splits, int tile,
                         const StepRow* __restrict__ rows, const float* __restrict__ probs,
                         float* __restrict__ workspace, float* __restrict__ out,
                         uint32_t* __restrict__ out_split) {
  allow_next_grid_start();  // o_proj may load its weights meanwhile
  extern __shared__ float smem[];
  const int r = int(blockIdx.z), kvh = int(blockIdx.y), s = int(blockIdx.x);
  const int pos = rows[r].pos, cols = pos + 2;
  const int splits = (pos + split_keys) / split_keys;  // ceil((pos + 1) / split_keys)
  if (s >= splits) return;                             // block-uniform
  const int d = a.head_dim, g = a.n_heads / a.n_kv;
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const bool computes = t < g * d;
  const int hh = computes ? t / d : 0, i = t % d, h = kvh * g + hh;
  const int j_begin = max(s * split_keys, first_visible_key(pos, a.window));
  const int j_end = min((s + 1) * split_keys, pos + 1);
  const float* pbase = probs + rows[r].scores_offset + int64_t(kvh) * g * cols;  // head kvh g
  const int kv_dim = a.n_kv * d;
  const int32_t* table = row_table(kv, a, rows[r]);
  float* v_s = smem;             // [tile][d]
  float* p_s = smem + tile * d;  // [g][tile]
  // A thread's share of a tile's loads: value quads (d / 4 per key) and probabilities.
  const bool vec = d % 4 == 0;
  const int quads = vec ? d / 4 : d;  // units per key: float4 or float
  float4 vq[kPvMaxQuads];
  float pq[kPvMaxProbs];
  const auto load = [&](int j0) {
    const int n = min(tile, j_end - j0);
#pragma unroll
    for (int u = 0; u < kPvMaxQuads; ++u) {
      const int x = t + u * threads, jj = x / quads, c = x % quads;
      if (jj < n) {
        const int64_t v =
            kv_row_offset(kv, table, a.kv_slot, 1, j0 + jj, kv_dim) + int64_t(kvh) * d;
        vq[u] = vec ? kv_load4(kv, v + 4 * c) : float4{kv_load(kv, v + c), 0, 0, 0};
      }
    }
#pragma unroll
    for (int u = 0; u < kPvMaxProbs; ++u) {
      const int x = t + u * threads, ph = x / tile, jj = x % tile;
      if (ph < g && jj < n) pq[u] = pbase[int64_t(ph) * cols + j0 + jj];
    }
  };
  const auto store = [&](int j0) {
    const int n = min(tile, j_end - j0);
#pragma unroll
    for (int u = 0; u < kPvMaxQuads; ++u) {
      const int x = t + u * threads, jj = x / quads, c = x % quads;
      if (jj < n) {
        if (vec)
          *reinterpret_cast<float4*>(v_s + jj * d + 4 * c) = vq[u];
        else
          v_s[jj * d + c] = vq[u].x;
      }
    }
#pragma unroll
    for (int u = 0; u < kPvMaxProbs; ++u) {
      const int x = t + u * threads, ph = x / tile, jj = x % tile;
      if (ph < g && jj < n) p_s[ph * tile + jj] = pq[u];
    }
  };
  float acc = 0.0f;
  if (j_begin < j_end) load(j_begin);
  for (int j0 = j_begin; j0 < j_end; j0 += tile) {  // block-uniform
    store(j0);
    __syncthreads();
    if (j0 + tile < j_end) load(j0 + tile);  // in flight while this tile is summed
    if (computes) {
      const int n = min(tile, j_end - j0);
      const float* pr = p_s + hh * tile;
      // A zero probability adds nothing (the value is read whatever it is).
      for (int jj = 0; jj < n; ++jj) {
        const float p = pr[jj];
        const float sum = fmaf(p, v_s[jj * d + i], acc);
        acc = p != 0.0f ? sum : acc;
      }
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
  if (!computes) return;
  if (splits == 1) {
    const int64_t f = (int64_t(r) * a.n_heads + h) * d + i;
    out[f] = acc;
    if (out_split != nullptr) split_bf16x3_write1(acc, out_split, f);
  } else {
    workspace[((int64_t(r) * max_splits + s) * a.n_heads + h) * d + i] = acc;
  }
}

// grid (B): rows with several splits add their partial sums in split order.
__global__ void __launch_bounds__(kThreads)
    f32_attention_pv_combine(AttentionShape a, int split_keys, int max_splits,
                             const StepRow* __restrict__ rows, const float* __restrict__ workspace,
                             float* __restrict__ out, uint32_t* __restrict__ out_split) {
  allow_next_grid_start();  // o_proj may load its weights meanwhile
  const int r = int(blockIdx.x);
  const int splits = (rows[r].pos + split_keys) / split_keys;
  if (splits == 1) return;
  const int n = a.n_heads * a.head_dim;
  for (int t = int(threadIdx.x); t < n; t += int(blockDim.x)) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) acc += workspace[(int64_t(r) * max_splits + s) * n + t];
    out[int64_t(r) * n + t] = acc;
    if (out_split != nullptr) split_bf16x3_write1(acc, out_split, int64_t(r) * n + t);
  }
}

// ------------------------------------------------------------- decode: the three in one ---
// One kernel for the scores, the softmax and the output of rows that are each their own query
// tile (decode), bitwise the three kernels above: grid (g / hb, nKV, B), block kThreads. A block
// takes hb heads of one KV group of one row over its whole context; the heads' scores and then
// probabilities stay in shared memory (and are written out as the stage kernels write them).
// Keys and values go through shared memory a tile of kDecodeKeys at a time, the next tile's
// loads in flight meanwhile (the first value tile's from the start). Scores: the sequential fmaf
// chain of f32_attention_scores_gqa_sink. Softmax: per head as f32_softmax_with_sink's block of
// kThreads threads computes it (thread t's strided partial maximum and sum, block_max's and
// block_sum's trees; the hb heads' trees side by side). Output: thread (hh, i) sums
// P[h][j] v_j[i] key by key as f32_attention_pv_gqa does, a fresh sum at
// each split of `split_keys` keys (a multiple of 32: the value tiles start on multiples of 32,
// so a split starts at a tile or its second half), the splits added in order from 0 as
// f32_attention_pv_combine does when a row has several. A key outside [first visible, pos] has
// probability 0 in shared memory and adds nothing, as the stage kernel does not visit it.
constexpr int kDecodeKeys = 64;        // keys per shared-memory tile
constexpr int kDecodeHalf = 32;        // split_keys is a multiple of it
constexpr int kDecodeMaxHeads = 8;     // hb
constexpr int kDecodeMinBlocks = 256;  // batches under 32 halve hb down to this many blocks
constexpr int kDecodeMaxPos = 1023;    // longer contexts: the stage kernels, split over blocks
constexpr int kDecodeOutputs = 2;      // output elements per thread: hb d <= 2 kThreads
constexpr int kDecodeBlocksPerSm = 3;  // the register budget's

// Floats of a decode block's probabilities row: the keys of every value tile (multiples of 32).
__host__ __device__ inline int decode_row_floats(int pos) {
  return (pos / kDecodeHalf + 2) * kDecodeHalf;
}

template <int kD>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm)
    f32_attention_decode(AttentionShape a, KvCacheView kv, int hb, int split_keys,
                         const StepRow* __restrict__ rows, const float* __restrict__ q,
                         const float* __restrict__ sinks, float* __restrict__ scores,
                         float* __restrict__ probs, float* __restrict__ out,
                         uint32_t* __restrict__ out_split) {
  static_assert(kD % 4 == 0 && kDecodeMaxHeads * kD <= kDecodeOutputs * kThreads);
  constexpr int kQuads = kD / 4, kLdk = kD + 4, kWarps = kThreads / kWarpSize;
  constexpr int kLoads = (kDecodeKeys * kQuads + kThreads - 1) / kThreads;  // a tile, per thread
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (q_rope)
  allow_next_grid_start();   // o_proj may load its weights meanwhile
  extern __shared__ float4 smem4[];
  __shared__ float red[kDecodeMaxHeads][kWarps];
  __shared__ float head_max[kDecodeMaxHeads], head_sum[kDecodeMaxHeads];
  const int r = int(blockIdx.z), kvh = int(blockIdx.y), g = a.n_heads / a.n_kv;
  const int h0 = kvh * g + int(blockIdx.x) * hb;
  const int t = int(threadIdx.x), lane = t % kWarpSize, warp = t / kWarpSize;
  const int pos = rows[r].pos, cols = pos + 2, first = first_visible_key(pos, a.window);
  const int ld = decode_row_floats(pos);
  const int64_t row0 = rows[r].scores_offset + int64_t(h0) * cols;  // head h0, column 0
  const int kv_dim = a.n_kv * kD;
  const int32_t* table = row_table(kv, a, rows[r]);
  const int64_t kvbase = int64_t(kvh) * kD;
  float* q_s = reinterpret_cast<float*>(smem4);  // [hb][kD]
  float* t_s = q_s + hb * kD;  // a tile: keys [kDecodeKeys][kD + 4] or values [kDecodeKeys][kD]
  float* s_s = t_s + kDecodeKeys * kLdk;  // scores, then probabilities [hb][ld]
  // Tile loads: keys (slot 0) or values (1) j0 .. j0 + kDecodeKeys - 1 of [first, pos], zero
  // elsewhere.
  const auto load_tile = [&](float4(&buf)[kLoads], int slot, int j0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int x = t + u * kThreads, jj = x / kQuads, c = x % kQuads, j = j0 + jj;
      buf[u] = float4{0, 0, 0, 0};
      if (jj < kDecodeKeys && j >= first && j <= pos)
        buf[u] =
            kv_load4(kv, kvbase + kv_row_offset(kv, table, a.kv_slot, slot, j, kv_dim) + 4 * c);
    }
  };
  const auto store_tile = [&](const float4(&buf)[kLoads], int ldt) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int x = t + u * kThreads, jj = x / kQuads, c = x % kQuads;
      if (jj < kDecodeKeys) *reinterpret_cast<float4*>(t_s + jj * ldt + 4 * c) = buf[u];
    }
  };
  const int v_start = first / kDecodeHalf * kDecodeHalf;
  float4 kq[kLoads], vq[kLoads];
  load_tile(kq, 0, first);
  load_tile(vq, 1, v_start);  // in flight through the scores and the softmax
  for (int x = t; x < hb * kQuads; x += kThreads)
    reinterpret_cast<float4*>(q_s)[x] =
        reinterpret_cast<const float4*>(q + (int64_t(r) * a.n_heads + h0) * kD)[x];
  for (int x = t; x < hb; x += kThreads) {
    s_s[x * ld + pos + 1] = scores[row0 + int64_t(x) * cols + pos + 1] = sinks[h0 + x];
  }
  for (int j = t; j < first; j += kThreads)  // outside the window
    for (int hh = 0; hh < hb; ++hh)
      s_s[hh * ld + j] = scores[row0 + int64_t(hh) * cols + j] = -INFINITY;
  for (int j0 = first; j0 <= pos; j0 += kDecodeKeys) {  // block-uniform
    store_tile(kq, kLdk);
    __syncthreads();
    if (j0 + kDecodeKeys <= pos) load_tile(kq, 0, j0 + kDecodeKeys);
    for (int x = t; x < hb * kDecodeKeys; x += kThreads) {
      const int hh = x / kDecodeKeys, jj = x % kDecodeKeys, j = j0 + jj;
      if (j > pos) continue;
      const float* qh = q_s + hh * kD;
      const float* kj = t_s + jj * kLdk;
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kQuads; ++c) {
        const float4 y = *reinterpret_cast<const float4*>(qh + 4 * c);
        const float4 k4 = *reinterpret_cast<const float4*>(kj + 4 * c);
        acc = fmaf(y.x, k4.x, acc);
        acc = fmaf(y.y, k4.y, acc);
        acc = fmaf(y.z, k4.z, acc);
        acc = fmaf(y.w, k4.w, acc);
      }
      s_s[hh * ld + j] = scores[row0 + int64_t(hh) * cols + j] = acc * a.scale;
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
  // Softmax over each head's cols scores.
  float part[kDecodeMaxHeads];
#pragma unroll
  for (int hh = 0; hh < kDecodeMaxHeads; ++hh) {
    part[hh] = -INFINITY;
    if (hh < hb)
      for (int j = t; j < cols; j += kThreads) part[hh] = fmaxf(part[hh], s_s[hh * ld + j]);
    part[hh] = warp_max(part[hh]);
    if (lane == 0) red[hh][warp] = part[hh];
  }
  __syncthreads();
  for (int hh = warp; hh < hb; hh += kWarps) {
    const float m = warp_max(lane < kWarps ? red[hh][lane] : -INFINITY);
    if (lane == 0) head_max[hh] = m;
  }
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < kDecodeMaxHeads; ++hh) {
    part[hh] = 0.0f;
    if (hh < hb) {
      const float m = head_max[hh];
      for (int j = t; j < cols; j += kThreads) part[hh] += expf(s_s[hh * ld + j] - m);
    }
    part[hh] = warp_sum(part[hh]);
    if (lane == 0) red[hh][warp] = part[hh];
  }
  __syncthreads();
  for (int hh = warp; hh < hb; hh += kWarps) {
    const float z = warp_sum(lane < kWarps ? red[hh][lane] : 0.0f);
    if (lane == 0) head_sum[hh] = z;
  }
  __syncthreads();
  // Probabilities; in shared memory 0 outside [first, pos] (the sink's column and the tiles'
  // keys past pos included).
  for (int hh = 0; hh < hb; ++hh) {
    const float m = head_max[hh], z = head_sum[hh];
    for (int j = t; j < ld; j += kThreads) {
      float p = 0.0f;
      if (j < cols) {
        p = expf(s_s[hh * ld + j] - m) / z;
        probs[row0 + int64_t(hh) * cols + j] = p;
      }
      s_s[hh * ld + j] = j >= first && j <= pos ? p : 0.0f;
    }
  }
  // The output: thread (hh, i) -- up to kDecodeOutputs of them a thread --, value tiles from
  // the one holding the first visible key, a fresh sum per split (splits wholly before the
  // window add their zero sums first, as the combine does).
  const int splits = (pos + split_keys) / split_keys;
  float acc[kDecodeOutputs], total[kDecodeOutputs];
  int p_at[kDecodeOutputs], v_at[kDecodeOutputs];
#pragma unroll
  for (int u = 0; u < kDecodeOutputs; ++u) {
    const int o = t + u * kThreads;
    acc[u] = total[u] = 0.0f;
    p_at[u] = (o / kD) * ld;
    v_at[u] = o % kD;
  }
  for (int s = 0; s < first / split_keys; ++s)
#pragma unroll
    for (int u = 0; u < kDecodeOutputs; ++u) total[u] += 0.0f;
  int next_split = (first / split_keys + 1) * split_keys;
  for (int j0 = v_start; j0 <= pos; j0 += kDecodeKeys) {  // block-uniform
    __syncthreads();  // the previous tile (or the scores' last) is read; the probabilities written
    store_tile(vq, kD);
    __syncthreads();
    if (j0 + kDecodeKeys <= pos) load_tile(vq, 1, j0 + kDecodeKeys);
    // The tile's two halves of kDecodeHalf keys, each from a fresh sum where a split starts.
    const auto half_tile = [&](int half) {
      const int jh = j0 + half * kDecodeHalf;
      if (jh == next_split) {
#pragma unroll
        for (int u = 0; u < kDecodeOutputs; ++u) total[u] += acc[u], acc[u] = 0.0f;
        next_split += split_keys;
      }
#pragma unroll
      for (int u = 0; u < kDecodeOutputs; ++u) {
        if (t + u * kThreads < hb * kD) {
          const float* pr = s_s + p_at[u] + jh;
          const float* vr = t_s + half * kDecodeHalf * kD + v_at[u];
#pragma unroll
          for (int jj = 0; jj < kDecodeHalf; ++jj) {
            const float p = pr[jj];  // as f32_attention_pv_gqa: a zero probability adds nothing
            const float sum = fmaf(p, vr[jj * kD], acc[u]);
            acc[u] = p != 0.0f ? sum : acc[u];
          }
        }
      }
    };
    static_assert(kDecodeKeys == 2 * kDecodeHalf);
    half_tile(0);
    if (j0 + kDecodeHalf <= pos) half_tile(1);  // block-uniform
  }
#pragma unroll
  for (int u = 0; u < kDecodeOutputs; ++u) {
    const int o = t + u * kThreads;
    if (o < hb * kD) {
      const float v = splits == 1 ? acc[u] : total[u] + acc[u];
      const int64_t f = (int64_t(r) * a.n_heads + h0) * kD + o;
      out[f] = v;
      if (out_split != nullptr) split_bf16x3_write1(v, out_split, f);
    }
  }
}

// ------------------------------------------------------------------ query tiles (prefill) ---
// A tile's (row, head) pairs go eight at a time to a group of 32 threads: pair p = rr g + hh is
// head kvh g + hh of the tile's row rr.
constexpr int kTilePairs = 8;
constexpr int kGroupThreads = 32;
constexpr int kPvTileKeys = 64;  // keys per shared-memory tile of the tiled output kernel
constexpr int kTiledThreads = 256;  // at most, per block of the tiled kernels
static_assert(kScoreTile == 2 * kGroupThreads, "the tiled scores take two keys per thread");

// Decode steps of at least this many rows (a tile per row) take the tiled scores kernel too:
// each of a thread's eight heads shares its key loads, where the one-row kernel loads both
// operands of every product.
constexpr int kTiledScoresMinRows = 16;

// Pair groups of a tile of `tile_rows` rows at most.
__host__ __device__ inline int tile_pair_groups(int g, int tile_rows = kQueryTileRows) {
  return (tile_rows * g + kTilePairs - 1) / kTilePairs;
}

// The rows of tile `tile`, their positions and first visible keys, in shared memory.
struct TileRows {
  int r0, n, max_pos, min_first;
};
__device__ TileRows load_tile_rows(const AttentionShape& a, const StepRow* rows,
                                   const int32_t* tile_first, int tile, int (&pos)[kQueryTileRows],
                                   int64_t (&offset)[kQueryTileRows]) {
  TileRows t;
  t.r0 = tile_first[tile];
  t.n = tile_first[tile + 1] - t.r0;
  for (int rr = int(threadIdx.x); rr < t.n; rr += int(blockDim.x)) {
    pos[rr] = rows[t.r0 + rr].pos;
    offset[rr] = rows[t.r0 + rr].scores_offset;
  }
  __syncthreads();
  t.max_pos = 0;
  t.min_first = INT_MAX;
  for (int rr = 0; rr < t.n; ++rr) {
    t.max_pos = max(t.max_pos, pos[rr]);
    t.min_first = min(t.min_first, first_visible_key(pos[rr], a.window));
  }
  return t;
}

// grid (key tiles of kScoreTile, nKV, query tiles of at most `tile_rows` rows), block
// kGroupThreads tile_pair_groups(g, tile_rows) threads, at most kTiledThreads (a group then takes
// several pair groups in turn). Thread (group, lane) computes keys j0 + lane and j0 + lane + 32
// for the eight pairs of its group: q (eight pairs) and k (a tile of keys, padded rows) come from
// shared memory four inputs at a time, each score the sequential fmaf chain of
// f32_attention_scores_gqa_sink.
__global__ void __launch_bounds__(kTiledThreads)
    f32_attention_scores_tiled(AttentionShape a, KvCacheView kv, const StepRow* __restrict__ rows,
                               const int32_t* __restrict__ tile_first, int tile_rows,
                               const float* __restrict__ q, const float* __restrict__ sinks,
                               float* __restrict__ scores) {
  extern __shared__ float4 smem4[];
  __shared__ int pos[kQueryTileRows];
  __shared__ int64_t offset[kQueryTileRows];
  const int kvh = int(blockIdx.y), j0 = int(blockIdx.x) * kScoreTile;
  const TileRows tr = load_tile_rows(a, rows, tile_first, int(blockIdx.z), pos, offset);
  if (j0 > tr.max_pos) return;  // block-uniform
  const int d = a.head_dim, g = a.n_heads / a.n_kv, pairs = tr.n * g, quads = d / 4;
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const auto row_of = [&](int pair) -> float* {  // the pair's scores row, column 0
    const int rr = pair / g;
    return scores + offset[rr] + int64_t(kvh * g + pair % g) * (pos[rr] + 2);
  };
  if (blockIdx.x == 0)
    for (int x = t; x < pairs; x += threads) row_of(x)[pos[x / g] + 1] = sinks[kvh * g + x % g];
  if (j0 + kScoreTile <= tr.min_first) {  // the tile is outside every row's window
    for (int x = t; x < pairs * kScoreTile; x += threads) {
      const int pair = x / kScoreTile, j = j0 + x % kScoreTile;
      if (j <= pos[pair / g]) row_of(pair)[j] = -INFINITY;
    }
    return;
  }
  const int pairs8 = (pairs + kTilePairs - 1) / kTilePairs * kTilePairs, ldk = d + 4;
  float* q_s = reinterpret_cast<float*>(smem4);            // [pairs8][d]
  float* k_s = q_s + tile_pair_groups(g, tile_rows) * kTilePairs * d;  // [kScoreTile][d + 4]
  for (int x = t; x < pairs8 * quads; x += threads) {
    const int pair = x / quads, c = x % quads;
    float4 v{0, 0, 0, 0};
    if (pair < pairs)
      v = *reinterpret_cast<const float4*>(
          q + (int64_t(tr.r0 + pair / g) * a.n_heads + kvh * g + pair % g) * d + 4 * c);
    *reinterpret_cast<float4*>(q_s + pair * d + 4 * c) = v;
  }
  // Keys no row of the tile sees read the tile's last row's instead (always there) and are zeroed.
  const int kv_dim = a.n_kv * d;
  const int32_t* table = row_table(kv, a, rows[tr.r0]);
  const int64_t kc = int64_t(kvh) * d;
  for (int x = t; x < kScoreTile * quads; x += threads) {
    const int jj = x / quads, c = x % quads, j = j0 + jj;
    const bool present = j >= tr.min_first && j <= tr.max_pos;
    float4 v = kv_load4(
        kv, kc + kv_row_offset(kv, table, a.kv_slot, 0, present ? j : tr.max_pos, kv_dim) + 4 * c);
    if (!present) v = float4{0, 0, 0, 0};
    *reinterpret_cast<float4*>(k_s + jj * ldk + 4 * c) = v;
  }
  __syncthreads();
  const int lane = t % kGroupThreads, groups = threads / kGroupThreads;
  for (int pg = t / kGroupThreads; pg * kTilePairs < pairs; pg += groups) {
    float acc[kTilePairs][2] = {};
    const float* k0 = k_s + lane * ldk;
    const float* k1 = k_s + (lane + kGroupThreads) * ldk;
    const float* qg = q_s + pg * kTilePairs * d;
    for (int c = 0; c < quads; ++c) {
      const float4 x0 = *reinterpret_cast<const float4*>(k0 + 4 * c);
      const float4 x1 = *reinterpret_cast<const float4*>(k1 + 4 * c);
#pragma unroll
      for (int p = 0; p < kTilePairs; ++p) {
        const float4 y = *reinterpret_cast<const float4*>(qg + p * d + 4 * c);
        acc[p][0] = fmaf(y.x, x0.x, acc[p][0]);
        acc[p][0] = fmaf(y.y, x0.y, acc[p][0]);
        acc[p][0] = fmaf(y.z, x0.z, acc[p][0]);
        acc[p][0] = fmaf(y.w, x0.w, acc[p][0]);
        acc[p][1] = fmaf(y.x, x1.x, acc[p][1]);
        acc[p][1] = fmaf(y.y, x1.y, acc[p][1]);
        acc[p][1] = fmaf(y.z, x1.z, acc[p][1]);
        acc[p][1] = fmaf(y.w, x1.w, acc[p][1]);
      }
    }
#pragma unroll
    for (int p = 0; p < kTilePairs; ++p) {
      const int pair = pg * kTilePairs + p;
      if (pair >= pairs) break;
      const int rp = pos[pair / g], first = first_visible_key(rp, a.window);
      float* out = row_of(pair);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int j = j0 + lane + u * kGroupThreads;
        if (j <= rp) out[j] = j >= first ? acc[p][u] * a.scale : -INFINITY;
      }
    }
  }
}

// grid (splits, nKV, query tiles), block tile_pair_groups(g) d / 4 threads (rounded up to whole
// warps and a multiple of d / 4; the threads past them only load): thread (group, c)
// sums, for the eight pairs of its group, P[h][j] v_j[4c .. 4c + 3] over the keys of split s in
// order, exactly as f32_attention_pv_gqa does for each row (a key outside a row's range, or a
// zero probability, adds nothing: the tile's probabilities there are stored as 0). Values and
// probabilities go through shared memory kPvTileKeys keys at a time.
__global__ void __launch_bounds__(kTiledThreads)
    f32_attention_pv_tiled(AttentionShape a, KvCacheView kv, int split_keys, int max_splits,
                           const StepRow* __restrict__ rows, const int32_t* __restrict__ tile_first,
                           const float* __restrict__ probs, float* __restrict__ workspace,
                           float* __restrict__ out, uint32_t* __restrict__ out_split) {
  allow_next_grid_start();  // o_proj may load its weights meanwhile
  extern __shared__ float4 smem4[];
  __shared__ int pos[kQueryTileRows];
  __shared__ int64_t offset[kQueryTileRows];
  const int kvh = int(blockIdx.y), s = int(blockIdx.x);
  const TileRows tr = load_tile_rows(a, rows, tile_first, int(blockIdx.z), pos, offset);
  if (s >= (tr.max_pos + split_keys) / split_keys) return;  // block-uniform
  const int d = a.head_dim, g = a.n_heads / a.n_kv, pairs = tr.n * g, quads = d / 4;
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const int c = t % quads, pg = t / quads;
  const int pairs8 = (pairs + kTilePairs - 1) / kTilePairs * kTilePairs, ldp = kPvTileKeys + 1;
  const int j_begin = max(s * split_keys, tr.min_first);
  const int j_end = min((s + 1) * split_keys, tr.max_pos + 1);
  const int kv_dim = a.n_kv * d;
  const int32_t* table = row_table(kv, a, rows[tr.r0]);
  float* v_s = reinterpret_cast<float*>(smem4);  // [kPvTileKeys][d]
  float* p_s = v_s + kPvTileKeys * d;             // [pairs8][kPvTileKeys + 1]
  // Per pair: where its probabilities row starts, and the keys [lo, hi) of split s it sees.
  int64_t* p_row = reinterpret_cast<int64_t*>(p_s + pairs8 * ldp);
  int2* p_keys = reinterpret_cast<int2*>(p_row + pairs8);
  for (int x = t; x < pairs; x += threads) {
    const int rr = x / g, rp = pos[rr];
    p_row[x] = offset[rr] + int64_t(kvh * g + x % g) * (rp + 2);
    p_keys[x] = int2{max(s * split_keys, first_visible_key(rp, a.window)),
                     min((s + 1) * split_keys, rp + 1)};
  }
  // A thread's value quads: quad t % quads of keys t / quads, + threads / quads, ... (the block
  // is a multiple of quads threads).
  const int v_first = t / quads, v_step = threads / quads;
  float4 acc[kTilePairs] = {};
  __syncthreads();
  for (int j0 = j_begin; j0 < j_end; j0 += kPvTileKeys) {  // block-uniform
    const int n = min(kPvTileKeys, j_end - j0);
    for (int jj = v_first; jj < n; jj += v_step) {
      *reinterpret_cast<float4*>(v_s + jj * d + 4 * c) = kv_load4(
          kv, kv_row_offset(kv, table, a.kv_slot, 1, j0 + jj, kv_dim) + int64_t(kvh) * d + 4 * c);
    }
    for (int x = t; x < pairs8 * kPvTileKeys; x += threads) {
      const int pair = x / kPvTileKeys, jj = x % kPvTileKeys, j = j0 + jj;
      float p = 0.0f;
      if (pair < pairs && jj < n) {
        const int2 keys = p_keys[pair];
        if (j >= keys.x && j < keys.y) p = probs[p_row[pair] + j];
      }
      p_s[pair * ldp + jj] = p;
    }
    __syncthreads();
    if (pg * kTilePairs < pairs) {
      const float* pr = p_s + pg * kTilePairs * ldp;
      for (int jj = 0; jj < n; ++jj) {
        const float4 v = *reinterpret_cast<const float4*>(v_s + jj * d + 4 * c);
#pragma unroll
        for (int p = 0; p < kTilePairs; ++p) {
          const float w = pr[p * ldp + jj];
          if (w != 0.0f) {  // as f32_attention_pv_gqa: a zero probability adds nothing
            acc[p].x = fmaf(w, v.x, acc[p].x);
            acc[p].y = fmaf(w, v.y, acc[p].y);
            acc[p].z = fmaf(w, v.z, acc[p].z);
            acc[p].w = fmaf(w, v.w, acc[p].w);
          }
        }
      }
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
  if (pg * kTilePairs >= pairs) return;
#pragma unroll
  for (int p = 0; p < kTilePairs; ++p) {
    const int pair = pg * kTilePairs + p;
    if (pair >= pairs) break;
    const int rr = pair / g, r = tr.r0 + rr, h = kvh * g + pair % g;
    const int splits = (pos[rr] + split_keys) / split_keys;
    if (s >= splits) continue;
    if (splits == 1) {
      const int64_t f = (int64_t(r) * a.n_heads + h) * d + 4 * c;
      *reinterpret_cast<float4*>(out + f) = acc[p];
      if (out_split != nullptr) {
        split_bf16x3_write1(acc[p].x, out_split, f);
        split_bf16x3_write1(acc[p].y, out_split, f + 1);
        split_bf16x3_write1(acc[p].z, out_split, f + 2);
        split_bf16x3_write1(acc[p].w, out_split, f + 3);
      }
    } else {
      *reinterpret_cast<float4*>(workspace + ((int64_t(r) * max_splits + s) * a.n_heads + h) * d +
                                 4 * c) = acc[p];
    }
  }
}
// ---------------------------------------------------- bf16: the three on the tensor cores ---
// The bf16 precision's attention (attention_mma_fuses): scores, softmax and output with the
// scores' and the output's products on BF16 MMA tiles (mma_bf16_16x8x16, float32 accumulation)
// and the softmax flash-style, in 64-key tiles at fixed offsets (key tile T: keys 64 T .. 64 T +
// 63). q, k, v and the probabilities are each rounded once to BF16 (nearest even). The (row,
// head) pairs of a query tile, p = rr g + hh, go sixteen to a group of 32 lanes (the MMA tile's
// rows).
//
// Each key tile T with a key visible to a pair gives that pair a partial (mma_key_tile_probs,
// mma_key_tile_output):
//   s_j   = (bf16(q) . bf16(k_j)) * scale on the MMA tile (a chain over the head's dimensions),
//           -inf where j is not visible to the pair (before its window, past its position)
//   m_T   = max_j s_j;  p_j = exp(s_j - m_T);  l_T = sum_j p_j (the group's fixed tree)
//   o_T   = sum_j bf16(p_j) bf16(v_j) on the MMA tile, from zero
// and the pair's partials fold in tile order into a state that starts at the sink (M = sink,
// L = 1, O = 0), each fold (FoldFactors)
//   M' = max(M, m_T);  a = exp(M - M');  b = exp(m_T - M');  L = L a + l_T b;  O = O a + o_T b
// and out = O / L. A partial depends on the pair, its tile and nothing else (a pair's MMA rows do
// not depend on the tile's other rows), and every pair folds the same tiles in the same order,
// so two kernels compute it with the same bits:
//   bf16_attention_mma    grid (query tiles, nKV): a block walks its keys a tile at a time and
//                         folds as it goes (prefill chunks; decode where the partials do not fit)
//   bf16_attention_split  grid (key tiles, nKV, rows) for the rows that are each their own query
//                         tile (a decode step's, the decode rows ahead of a mixed step's prefill
//                         chunks): a block computes one key tile's partials of one row's heads
//                         and writes them to the workspace; bf16_attention_merge folds them.
// A row's output has the same bits alone (decode), in a prefill chunk, with any other rows and in
// either kernel, so the engine's batches do not change a request's tokens. (The keys a pair does
// not see add exact zero products in both -- staged as read in one, as zeros in the other -- so
// only an output whose every product is zero could differ, in the sign of that zero.)
// With `scores` (a traced step), the kernels also write each pair's scores as
// launch_f32_attention_scores lays them out (the softmax stage then computes att from them).
constexpr int kMmaKeys = kAttentionKeyTile;  // keys per tile (kernel_types.h)
constexpr int kMmaGroups = 4;  // groups of 32 lanes, 16 pairs each
constexpr int kMmaThreads = 32 * kMmaGroups;
constexpr int kMmaBlocksPerSm = 2;  // the register budget's (3 spills 200 bytes)
constexpr int kMmaMaxGroup = kMmaGroups * 16 / kQueryTileRows;  // g: a tile's pairs fit
static_assert(kMmaMaxGroup == kAttentionMmaMaxGroup);
// exp(x) as exp2(x log2 e): the probabilities are rounded to BF16 for the output's products,
// 2^-8 relative, far above the few float32 ulps this costs (the softmax stage's att, traced,
// is the softmax kernel's expf).
constexpr float kLog2e = 1.44269504088896341f;

template <int kD>
struct MmaTileSmem {
  static constexpr int kLdk = kD + 8, kLdv = kMmaKeys + 8;  // BF16 elements; no bank conflict
  uint16_t k[kMmaKeys * kLdk];                              // [key][dimension]
  uint16_t vt[kD * kLdv];                                   // [dimension][key]
};

// A key tile's keys and values on their way to shared memory, from the BF16 cache
// (kv_cache_dtype: the append rounded them): fetch() loads them into registers (the block's
// kMmaThreads threads, eight elements each, 16 bytes; keys outside [lo, hi] read as zero, never a
// released block's nor a not yet written one's), store() writes them, values transposed.
template <int kD>
struct MmaKvStaging {
  static constexpr int kOcts = kD / 8;  // 16-byte loads per key row
  static constexpr int kKLoads = (kMmaKeys * kOcts + kMmaThreads - 1) / kMmaThreads;
  // Values go a pair of keys to a lane, a warp's 32 pairs of one oct at a time: the transposed
  // stores of a warp then fall in 32 different banks.
  static constexpr int kPairs = kMmaKeys / 2;
  static constexpr int kVLoads = (kPairs * kOcts + kMmaThreads - 1) / kMmaThreads;
  uint4 kr[kKLoads], vr[kVLoads][2];

  __device__ __forceinline__ void fetch(const KvCacheView& kv, const int32_t* table,
                                        const AttentionShape& a, int kvh, int j0, int lo, int hi,
                                        int t) {
    const int kvd = a.n_kv * kD;
    const uint16_t* cache = static_cast<const uint16_t*>(kv.blocks);
    const auto row_of = [&](int which, int j, int c) {
      if (j < lo || j > hi) return make_uint4(0u, 0u, 0u, 0u);
      return *reinterpret_cast<const uint4*>(
          cache + kv_row_offset(kv, table, a.kv_slot, which, j, kvd) + kvh * kD + 8 * c);
    };
#pragma unroll
    for (int u = 0; u < kKLoads; ++u) {
      const int i = t + u * kMmaThreads;
      if (i < kMmaKeys * kOcts) kr[u] = row_of(0, j0 + i / kOcts, i % kOcts);
    }
#pragma unroll
    for (int u = 0; u < kVLoads; ++u) {
      const int i = t + u * kMmaThreads;
      if (i < kPairs * kOcts) {
        vr[u][0] = row_of(1, j0 + 2 * (i % kPairs), i / kPairs);
        vr[u][1] = row_of(1, j0 + 2 * (i % kPairs) + 1, i / kPairs);
      }
    }
  }

  __device__ __forceinline__ void store(MmaTileSmem<kD>& sm, int t) const {
    using Smem = MmaTileSmem<kD>;
#pragma unroll
    for (int u = 0; u < kKLoads; ++u) {
      const int i = t + u * kMmaThreads;
      if (i < kMmaKeys * kOcts)
        *reinterpret_cast<uint4*>(&sm.k[(i / kOcts) * Smem::kLdk + 8 * (i % kOcts)]) = kr[u];
    }
#pragma unroll
    for (int u = 0; u < kVLoads; ++u) {
      const int i = t + u * kMmaThreads;
      if (i < kPairs * kOcts) {
        const int jj = 2 * (i % kPairs), c = i / kPairs;
        const uint32_t v0[4] = {vr[u][0].x, vr[u][0].y, vr[u][0].z, vr[u][0].w};
        const uint32_t v1[4] = {vr[u][1].x, vr[u][1].y, vr[u][1].z, vr[u][1].w};
        uint32_t* at = reinterpret_cast<uint32_t*>(&sm.vt[(8 * c) * Smem::kLdv + jj]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // dimensions 8 c + 2 w (low halves), 8 c + 2 w + 1 (high)
          at[(2 * w) * Smem::kLdv / 2] = (v0[w] & 0xffffu) | (v1[w] << 16);
          at[(2 * w + 1) * Smem::kLdv / 2] = (v0[w] >> 16) | (v1[w] & 0xffff0000u);
        }
      }
    }
  }
};

// One (row, head) pair of an MMA tile row.
struct MmaPair {
  bool valid = false;
  int r = 0, h = 0, pos = -1, first = 0;
  int64_t scores = 0;  // element offset of its scores row

  // Whether key tile j0 .. j0 + kMmaKeys - 1 has a key the pair sees.
  __device__ __forceinline__ bool sees_tile(int j0) const {
    return valid && j0 <= pos && j0 + kMmaKeys > first;
  }
};

// The pair of MMA row `p` of a query tile whose rows start at r0 (n_rows of them), KV head kvh.
__device__ __forceinline__ MmaPair mma_pair(const AttentionShape& a, const StepRow* rows, int r0,
                                            int n_rows, int kvh, int p) {
  const int g = a.n_heads / a.n_kv;
  if (p >= n_rows * g) return {};
  const StepRow& row = rows[r0 + p / g];
  return {true,
          r0 + p / g,
          kvh * g + p % g,
          row.pos,
          first_visible_key(row.pos, a.window),
          row.scores_offset};
}

// q of the lane's two pairs as the MMA tile's A operand, rounded once to BF16.
template <int kD>
__device__ __forceinline__ void mma_query(const AttentionShape& a, const float* q,
                                          const MmaPair (&pr)[2], int ti,
                                          uint32_t (&qa)[kD / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const MmaPair& pp = pr[e % 2];
      const int dim = 16 * ks + 2 * ti + 8 * (e / 2);
      float2 x = make_float2(0.0f, 0.0f);
      if (pp.valid)
        x = *reinterpret_cast<const float2*>(q + (int64_t(pp.r) * a.n_heads + pp.h) * kD + dim);
      qa[ks][e] = bf16x2_pack_rn(x.x, x.y);
    }
}

// The softmax's partials (m[u], l[u]) of the lane's two pairs over the key tile j0 in shared
// memory, and their probabilities as the output products' A operand (pa); with `scores`, each
// pair's scores of the tile's keys up to its position. Every lane of the group takes part
// (shuffles).
template <int kD>
__device__ __forceinline__ void mma_key_tile_probs(const AttentionShape& a,
                                                   const MmaTileSmem<kD>& sm,
                                                   const uint32_t (&qa)[kD / 16][4],
                                                   const MmaPair (&pr)[2], int j0, int lane,
                                                   float* scores, float (&m)[2], float (&l)[2],
                                                   uint32_t (&pa)[kMmaKeys / 16][4]) {
  using Smem = MmaTileSmem<kD>;
  constexpr int kKSteps = kD / 16, kKeyTiles = kMmaKeys / 8;
  const int gi = lane / 4, ti = lane % 4;
  float s[kKeyTiles][4] = {};
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const uint16_t* kp = sm.k + (8 * nt + gi) * Smem::kLdk + 16 * ks + 2 * ti;
      const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(kp),
                             *reinterpret_cast<const uint32_t*>(kp + 8)};
      mma_bf16_16x8x16(s[nt], qa[ks], b);
    }
  float tmax[2] = {-INFINITY, -INFINITY};
  // Whether every key of the tile is visible to both pairs: no mask to evaluate.
  const bool whole = pr[0].valid && pr[1].valid && j0 >= pr[0].first && j0 >= pr[1].first &&
                     j0 + kMmaKeys - 1 <= pr[0].pos && j0 + kMmaKeys - 1 <= pr[1].pos;
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const MmaPair& pp = pr[e / 2];
      const int j = j0 + 8 * nt + 2 * ti + e % 2;
      const bool visible = whole || (pp.valid && j >= pp.first && j <= pp.pos);
      const float v = visible ? s[nt][e] * a.scale : -INFINITY;
      s[nt][e] = v;
      tmax[e / 2] = fmaxf(tmax[e / 2], v);
      if (scores != nullptr && pp.valid && j <= pp.pos)
        scores[pp.scores + int64_t(pp.h) * (pp.pos + 2) + j] = v;
    }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    tmax[u] = fmaxf(tmax[u], __shfl_xor(tmax[u], 1, 32));
    m[u] = fmaxf(tmax[u], __shfl_xor(tmax[u], 2, 32));
  }
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = s[nt][e] == -INFINITY ? 0.0f : exp2f((s[nt][e] - m[e / 2]) * kLog2e);
      s[nt][e] = p;
      sum[e / 2] += p;
    }
    pa[nt / 2][2 * (nt % 2)] = bf16x2_pack_rn(s[nt][0], s[nt][1]);
    pa[nt / 2][2 * (nt % 2) + 1] = bf16x2_pack_rn(s[nt][2], s[nt][3]);
  }
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    sum[u] += __shfl_xor(sum[u], 1, 32);
    l[u] = sum[u] + __shfl_xor(sum[u], 2, 32);
  }
}

// The output's partial of the lane's two pairs over the key tile in shared memory, dimension
// tile dt (dimensions 8 dt .. 8 dt + 7): o[2u], o[2u + 1] of pair u, an MMA chain from zero.
template <int kD>
__device__ __forceinline__ void mma_key_tile_output(const MmaTileSmem<kD>& sm,
                                                    const uint32_t (&pa)[kMmaKeys / 16][4],
                                                    int lane, int dt, float (&o)[4]) {
  using Smem = MmaTileSmem<kD>;
  const int gi = lane / 4, ti = lane % 4;
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
    const uint16_t* vp = sm.vt + (8 * dt + gi) * Smem::kLdv + 16 * kk + 2 * ti;
    const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(vp),
                           *reinterpret_cast<const uint32_t*>(vp + 8)};
    mma_bf16_16x8x16(o, pa[kk], b);
  }
}

// One fold of a key tile's partial (m_t, l_t) into a pair's state (M, L): the factors of the
// state's O (a) and of the tile's o (b); out of line of the output's elements, so that both
// kernels' folds are the same operations.
struct FoldFactors {
  float a, b;
};
__device__ __forceinline__ FoldFactors fold_tile(float& M, float& L, float m_t, float l_t) {
  const float mn = fmaxf(M, m_t);
  const FoldFactors f{exp2f((M - mn) * kLog2e), exp2f((m_t - mn) * kLog2e)};
  M = mn;
  L = fmaf(L, f.a, l_t * f.b);
  return f;
}
__device__ __forceinline__ float fold_output(float O, float o_t, FoldFactors f) {
  return fmaf(O, f.a, o_t * f.b);
}

// The output of a pair: out (and o_proj's split of it) at element f of (B, nH d).
__device__ __forceinline__ void mma_write_output(float x, float* out, uint32_t* out_split,
                                                 int64_t f) {
  out[f] = x;
  if (out_split != nullptr) split_bf16x3_write1(x, out_split, f);
}

// grid (query tiles from tile_offset, nKV), kMmaThreads threads: the tile's pairs over their keys,
// folding each key tile's partials as it goes; the next key tile's loads are in flight while the
// groups compute the current one.
template <int kD>
__global__ void __launch_bounds__(kMmaThreads, kMmaBlocksPerSm)
    bf16_attention_mma(AttentionShape a, KvCacheView kv, const StepRow* __restrict__ rows,
                       const int32_t* __restrict__ tile_first, int tile_offset,
                       const float* __restrict__ q, const float* __restrict__ sinks,
                       float* __restrict__ scores, float* __restrict__ out,
                       uint32_t* __restrict__ out_split) {
  static_assert(kD % 16 == 0 && kD <= 128);
  constexpr int kDimTiles = kD / 8;
  __shared__ __align__(16) MmaTileSmem<kD> sm[2];
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (q_rope)
  allow_next_grid_start();   // o_proj may load its weights meanwhile
  const int tile = int(blockIdx.x) + tile_offset, kvh = int(blockIdx.y), g = a.n_heads / a.n_kv;
  const int r0 = tile_first != nullptr ? tile_first[tile] : tile;
  const int n_rows = tile_first != nullptr ? tile_first[tile + 1] - r0 : 1;
  const int t = int(threadIdx.x), group = t / 32, lane = t % 32, ti = lane % 4;
  const int32_t* table = row_table(kv, a, rows[r0]);
  // The block's keys: from the first any of its rows sees to the last position.
  int lo = INT_MAX, hi = 0;
  for (int rr = 0; rr < n_rows; ++rr) {
    const int p = rows[r0 + rr].pos;
    lo = min(lo, first_visible_key(p, a.window));
    hi = max(hi, p);
  }
  const int j_begin = lo / kMmaKeys * kMmaKeys;
  // This lane's two pairs: MMA rows gi and gi + 8 of its group.
  const MmaPair pr[2] = {mma_pair(a, rows, r0, n_rows, kvh, 16 * group + lane / 4),
                         mma_pair(a, rows, r0, n_rows, kvh, 16 * group + lane / 4 + 8)};
  const bool active = 16 * group < n_rows * g;  // the group has a pair
  // A traced step: the keys before the block's first tile are masked for every pair, and the
  // sink column is the sink.
  if (scores != nullptr)
    for (int p = t; p < n_rows * g; p += kMmaThreads) {
      const StepRow& row = rows[r0 + p / g];
      const int h = kvh * g + p % g;
      float* s_row = scores + row.scores_offset + int64_t(h) * (row.pos + 2);
      for (int j = 0; j < j_begin; ++j) s_row[j] = -INFINITY;
      s_row[row.pos + 1] = sinks[h];
    }
  uint32_t qa[kD / 16][4];
  mma_query<kD>(a, q, pr, ti, qa);
  // Each pair's state, from the sink.
  float M[2], L[2] = {1.0f, 1.0f}, O[kDimTiles][4] = {};
#pragma unroll
  for (int u = 0; u < 2; ++u) M[u] = pr[u].valid ? sinks[pr[u].h] : 0.0f;
  MmaKvStaging<kD> staging;
  staging.fetch(kv, table, a, kvh, j_begin, lo, hi, t);
  staging.store(sm[0], t);
  __syncthreads();
  int buf = 0;
  for (int j0 = j_begin; j0 <= hi; j0 += kMmaKeys, buf ^= 1) {
    const bool next = j0 + kMmaKeys <= hi;
    if (next) staging.fetch(kv, table, a, kvh, j0 + kMmaKeys, lo, hi, t);
    if (active) {
      float m[2], l[2];
      uint32_t pa[kMmaKeys / 16][4];
      mma_key_tile_probs<kD>(a, sm[buf], qa, pr, j0, lane, scores, m, l, pa);
      FoldFactors f[2] = {};
      bool sees[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        sees[u] = pr[u].sees_tile(j0);
        if (sees[u]) f[u] = fold_tile(M[u], L[u], m[u], l[u]);
      }
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        float o[4];
        mma_key_tile_output<kD>(sm[buf], pa, lane, dt, o);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (sees[e / 2]) O[dt][e] = fold_output(O[dt][e], o[e], f[e / 2]);
      }
    }
    if (next) staging.store(sm[buf ^ 1], t);
    __syncthreads();
  }
  if (!active) return;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const MmaPair& pp = pr[u];
    if (!pp.valid) continue;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        mma_write_output(O[dt][2 * u + c] / L[u], out, out_split,
                         (int64_t(pp.r) * a.n_heads + pp.h) * kD + 8 * dt + 2 * ti + c);
  }
}

// The split kernels' workspace: per (row, head, key tile slot) the tile's o (kD floats), then m
// and l. Slot i of a row is its key tile first / 64 + i.
template <int kD>
__device__ __forceinline__ float* mma_partial_at(float* partials, const AttentionShape& a, int r,
                                                 int h, int max_tiles, int slot) {
  return partials + ((int64_t(r) * a.n_heads + h) * max_tiles + slot) * (kD + 2);
}

// grid (max_tiles, nKV, B), kMmaThreads threads, rows that are each their own query tile: block
// (i, kvh, r) computes the partials of key tile first / 64 + i for row r's heads of KV head kvh,
// its g <= 16 pairs in every group's MMA rows: the scores and the softmax's m and l in every group
// alike (group 0 writes them), the output's dimension tiles a quarter to each group.
template <int kD>
__global__ void __launch_bounds__(kMmaThreads)
    bf16_attention_split(AttentionShape a, KvCacheView kv, const StepRow* __restrict__ rows,
                         int max_tiles, const float* __restrict__ q, float* __restrict__ scores,
                         float* __restrict__ partials) {
  static_assert(kD % 16 == 0 && kD <= 128);
  constexpr int kDimTiles = kD / 8, kPerGroup = (kDimTiles + kMmaGroups - 1) / kMmaGroups;
  __shared__ __align__(16) MmaTileSmem<kD> sm;
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (q_rope)
  allow_next_grid_start();   // the merge may start; it waits for this grid
  const int r = int(blockIdx.z), kvh = int(blockIdx.y), slot = int(blockIdx.x);
  const int pos = rows[r].pos, first = first_visible_key(pos, a.window);
  const int j0 = (first / kMmaKeys + slot) * kMmaKeys;
  if (j0 > pos) return;  // block-uniform: past the row's last key tile
  const int t = int(threadIdx.x), group = t / 32, lane = t % 32, gi = lane / 4, ti = lane % 4;
  MmaKvStaging<kD> staging;
  staging.fetch(kv, row_table(kv, a, rows[r]), a, kvh, j0, first, pos, t);
  const MmaPair pr[2] = {mma_pair(a, rows, r, 1, kvh, gi), mma_pair(a, rows, r, 1, kvh, gi + 8)};
  uint32_t qa[kD / 16][4];
  mma_query<kD>(a, q, pr, ti, qa);
  staging.store(sm, t);
  __syncthreads();
  float m[2], l[2];
  uint32_t pa[kMmaKeys / 16][4];
  mma_key_tile_probs<kD>(a, sm, qa, pr, j0, lane, group == 0 ? scores : nullptr, m, l, pa);
#pragma unroll
  for (int u = 0; u < kPerGroup; ++u) {
    const int dt = group * kPerGroup + u;
    if (dt >= kDimTiles) break;  // group-uniform
    float o[4];
    mma_key_tile_output<kD>(sm, pa, lane, dt, o);
#pragma unroll
    for (int w = 0; w < 2; ++w)
      if (pr[w].valid)
        *reinterpret_cast<float2*>(mma_partial_at<kD>(partials, a, r, pr[w].h, max_tiles, slot) +
                                   8 * dt + 2 * ti) = make_float2(o[2 * w], o[2 * w + 1]);
  }
  if (group == 0 && ti == 0)
#pragma unroll
    for (int w = 0; w < 2; ++w)
      if (pr[w].valid) {
        float* part = mma_partial_at<kD>(partials, a, r, pr[w].h, max_tiles, slot);
        part[kD] = m[w];
        part[kD + 1] = l[w];
      }
}

// grid (nH, B), kD threads: thread i folds dimension i of the row's key tiles' partials in tile
// order from the sink (the same folds as bf16_attention_mma's) and writes out (and the split);
// with `scores`, the keys before the row's first tile are masked and the sink column is the sink.
template <int kD>
__global__ void __launch_bounds__(kD)
    bf16_attention_merge(AttentionShape a, const StepRow* __restrict__ rows, int max_tiles,
                         const float* __restrict__ sinks, const float* __restrict__ partials,
                         float* __restrict__ scores, float* __restrict__ out,
                         uint32_t* __restrict__ out_split) {
  wait_for_previous_grid();  // the split kernel's partials
  allow_next_grid_start();   // o_proj may load its weights meanwhile
  const int h = int(blockIdx.x), r = int(blockIdx.y), i = int(threadIdx.x);
  const int pos = rows[r].pos, first = first_visible_key(pos, a.window);
  const int tiles = pos / kMmaKeys - first / kMmaKeys + 1;
  if (scores != nullptr) {
    float* s_row = scores + rows[r].scores_offset + int64_t(h) * (pos + 2);
    for (int j = i; j < first / kMmaKeys * kMmaKeys; j += kD) s_row[j] = -INFINITY;
    if (i == 0) s_row[pos + 1] = sinks[h];
  }
  float M = sinks[h], L = 1.0f, O = 0.0f;
  const float* part = partials + (int64_t(r) * a.n_heads + h) * max_tiles * (kD + 2);
  for (int s = 0; s < tiles; ++s, part += kD + 2) {
    const FoldFactors f = fold_tile(M, L, part[kD], part[kD + 1]);
    O = fold_output(O, part[i], f);
  }
  mma_write_output(O / L, out, out_split, (int64_t(r) * a.n_heads + h) * kD + i);
}

void check_shape(const AttentionShape& a, const char* launcher) {
  PARITY_DEVICE_REQUIRE(a.n_heads > 0 && a.n_kv > 0 && a.n_heads % a.n_kv == 0, launcher,
                        ": heads ", a.n_heads, " must be a positive multiple of kv heads ", a.n_kv);
  PARITY_DEVICE_REQUIRE(a.head_dim > 0, launcher, ": head_dim ", a.head_dim, " must be positive");
  PARITY_DEVICE_REQUIRE(a.window >= 0 && a.max_context > 0, launcher, ": window ", a.window,
                        ", max_context ", a.max_context);
  PARITY_DEVICE_REQUIRE(a.kv_group >= 0 && a.kv_group < kKvGroups && a.kv_slot >= 0, launcher,
                        ": KV group ", a.kv_group, ", slot ", a.kv_slot);
}

void check_kv(const AttentionShape& a, const KvCacheView& kv, const char* launcher) {
  PARITY_DEVICE_REQUIRE(kv.blocks != nullptr && kv.block_tables != nullptr, launcher,
                        ": KV cache view without blocks or block tables");
  PARITY_DEVICE_REQUIRE(kv.block_shift >= 0 && kv.block_shift <= 20 && a.kv_slot < kv.slots,
                        launcher, ": block shift ", kv.block_shift, ", slot ", a.kv_slot, " of ",
                        kv.slots);
}

// True when the launch goes by query tiles: some rows share a tile (or, with `min_single`, the
// batch has at least that many rows of a tile each), every head's inputs come in 16-byte quads
// and `addresses` (the buffers read and written by quads, or-ed) are aligned.
bool takes_tiles(const AttentionShape& a, const QueryTiles& tiles, int batch, uintptr_t addresses,
                 int min_single = 0) {
  const bool shared = tiles.count < batch || (min_single > 0 && batch >= min_single);
  return tiles.first != nullptr && tiles.count > 0 && shared && a.head_dim % 4 == 0 &&
         addresses % 16 == 0;
}

size_t tiled_scores_smem(const AttentionShape& a, int tile_rows) {
  const int g = a.n_heads / a.n_kv;
  return (size_t(tile_pair_groups(g, tile_rows)) * kTilePairs * a.head_dim +
          size_t(kScoreTile) * (a.head_dim + 4)) *
         sizeof(float);
}

// The one-row output kernel (f32_attention_pv_gqa).
void pv_rows(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows, int batch,
             int threads, int split_keys, int max_splits, int splits, const float* probs,
             float* workspace, float* out, uint32_t* split, hipStream_t stream) {
  const int g = a.n_heads / a.n_kv;
  // Keys per shared-memory tile: as many as a thread's share of the loads covers (kPvMaxQuads
  // value units and kPvMaxProbs probabilities per thread), at most kPvTile.
  const int units = a.head_dim % 4 == 0 ? a.head_dim / 4 : a.head_dim;
  const int tile = std::min({kPvTile, kPvMaxQuads * threads / units, kPvMaxProbs * threads / g});
  PARITY_DEVICE_REQUIRE(tile >= 1, "launch_f32_attention_pv: ", g, " heads of dimension ",
                        a.head_dim, " leave no key per tile");
  const size_t smem = size_t(tile) * size_t(a.head_dim + g) * sizeof(float);
  PARITY_DEVICE_REQUIRE(smem <= 48 * 1024, "launch_f32_attention_pv: a tile of ", tile,
                        " keys needs ", smem, " bytes of shared memory (limit 48 KiB)");
  const dim3 grid(unsigned(splits), unsigned(a.n_kv), unsigned(batch));
  f32_attention_pv_gqa<<<grid, threads, smem, stream>>>(a, kv, split_keys, max_splits, tile, rows,
                                                        probs, workspace, out, split);
  HIP_LAUNCH_CHECK("f32_attention_pv_gqa", stream);
}

// Heads per block of the decode kernel: all g, halved while a small batch has too few blocks
// (each block reads its KV head's keys and values).
int decode_heads_per_block(const AttentionShape& a, int batch) {
  const int g = a.n_heads / a.n_kv;
  int hb = g;
  while (hb % 2 == 0 && int64_t(batch) * a.n_kv * (g / hb) < kDecodeMinBlocks) hb /= 2;
  return hb;
}

}  // namespace

namespace {
size_t decode_smem(const AttentionShape& a, int hb, int max_pos) {
  return size_t(hb) * size_t(a.head_dim + decode_row_floats(max_pos)) * sizeof(float) +
         size_t(kDecodeKeys) * size_t(a.head_dim + 4) * sizeof(float);
}
}  // namespace

bool attention_decode_fuses(const AttentionShape& a, int batch, int max_pos,
                            const QueryTiles& tiles) {
  const int g = a.n_heads / a.n_kv;
  return (tiles.first == nullptr || tiles.count == batch) && max_pos <= kDecodeMaxPos &&
         (a.head_dim == 16 || a.head_dim == 32 || a.head_dim == 64) && g <= kDecodeMaxHeads &&
         attention_split_keys(a.max_context) % kDecodeHalf == 0 &&
         decode_smem(a, decode_heads_per_block(a, batch), max_pos) <= 48 * 1024;
}

void launch_f32_attention_decode(const AttentionShape& a, const KvCacheView& kv,
                                 const StepRow* rows, int batch, int max_pos, const float* q,
                                 const float* sinks, float* scores, float* probs, float* out,
                                 std::span<uint32_t> out_split, hipStream_t stream) {
  check_shape(a, "launch_f32_attention_decode");
  check_kv(a, kv, "launch_f32_attention_decode");
  PARITY_DEVICE_REQUIRE(rows != nullptr && q != nullptr && sinks != nullptr && scores != nullptr &&
                            probs != nullptr && out != nullptr && batch > 0,
                        "launch_f32_attention_decode: null pointer or empty batch");
  PARITY_DEVICE_REQUIRE(max_pos >= 0 && max_pos < a.max_context,
                        "launch_f32_attention_decode: position ", max_pos,
                        " outside the cache of ", a.max_context);
  PARITY_DEVICE_REQUIRE(attention_decode_fuses(a, batch, max_pos, {}) &&
                            reinterpret_cast<uintptr_t>(q) % 16 == 0,
                        "launch_f32_attention_decode: ", a.n_heads / a.n_kv,
                        " heads per KV head of dimension ", a.head_dim, " up to position ",
                        max_pos, " (at most 8 heads of 16, 32 or 64 up to position ",
                        kDecodeMaxPos, " in 48 KiB; q 16-byte aligned)");
  if (!out_split.empty())
    PARITY_DEVICE_REQUIRE(attention_out_writes_split(a) &&
                              out_split.size() >= split_bf16x3_words(int64_t(batch) * a.n_heads *
                                                                     a.head_dim),
                          "launch_f32_attention_decode: the output's split needs nH d (",
                          a.n_heads, " x ", a.head_dim, ") a multiple of 32 and ",
                          split_bf16x3_words(int64_t(batch) * a.n_heads * a.head_dim),
                          " words; the scratch holds ", out_split.size());
  const int g = a.n_heads / a.n_kv, hb = decode_heads_per_block(a, batch);
  const size_t smem = decode_smem(a, hb, max_pos);
  const dim3 grid(unsigned(g / hb), unsigned(a.n_kv), unsigned(batch));
  const auto launch = [&]<int kD>() {
    uint32_t* const split = out_split.empty() ? nullptr : out_split.data();
    HIP_CHECK(launch_programmatic(&f32_attention_decode<kD>, grid, dim3(kThreads), smem, stream, a,
                                  kv, hb, attention_split_keys(a.max_context), rows, q, sinks,
                                  scores, probs, out, split));
  };
  if (a.head_dim == 16)
    launch.template operator()<16>();
  else if (a.head_dim == 32)
    launch.template operator()<32>();
  else
    launch.template operator()<64>();
  HIP_LAUNCH_CHECK("f32_attention_decode", stream);
}

namespace {
// The leading rows that are each their own query tile: every row of a decode step, the decode
// rows ahead of a mixed step's prefill chunks.
int rows_alone(int batch, const QueryTiles& tiles) {
  return tiles.first == nullptr || tiles.count <= 0 || tiles.count == batch
             ? batch
             : std::min(tiles.singles, batch);
}
}  // namespace

bool attention_mma_splits(const AttentionShape& a, int batch, int max_pos, size_t workspace_floats,
                          const QueryTiles& tiles) {
  const int alone = rows_alone(batch, tiles);
  return attention_mma_fuses(a, Precision::bf16) && alone > 0 &&
         attention_key_tiles(max_pos, a.window) > 1 &&
         attention_partials_floats(a, alone, max_pos) <= workspace_floats;
}

void launch_bf16_attention_mma(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                               int batch, int max_pos, const float* q, const float* sinks,
                               float* scores, float* out, std::span<uint32_t> out_split,
                               std::span<float> workspace, hipStream_t stream,
                               const QueryTiles& tiles) {
  check_shape(a, "launch_bf16_attention_mma");
  check_kv(a, kv, "launch_bf16_attention_mma");
  PARITY_DEVICE_REQUIRE(kv.dtype == KvDtype::bf16,
                        "launch_bf16_attention_mma: the KV cache is float32 (kv_cache_dtype: BF16 "
                        "for the bf16 precision's MMA attention)");
  PARITY_DEVICE_REQUIRE(
      rows != nullptr && q != nullptr && sinks != nullptr && out != nullptr && batch > 0,
      "launch_bf16_attention_mma: null pointer or empty batch");
  PARITY_DEVICE_REQUIRE(max_pos >= 0 && max_pos < a.max_context,
                        "launch_bf16_attention_mma: position ", max_pos, " outside the cache of ",
                        a.max_context);
  PARITY_DEVICE_REQUIRE(attention_mma_fuses(a, Precision::bf16) &&
                            (reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(out) |
                             reinterpret_cast<uintptr_t>(workspace.data())) %
                                    8 ==
                                0,
                        "launch_bf16_attention_mma: ", a.n_heads / a.n_kv,
                        " heads per KV head of dimension ", a.head_dim, " (at most ", kMmaMaxGroup,
                        " heads of 16, 32 or 64; q, out and the workspace 8-byte aligned)");
  if (!out_split.empty())
    PARITY_DEVICE_REQUIRE(
        attention_out_writes_split(a) &&
            out_split.size() >= split_bf16x3_words(int64_t(batch) * a.n_heads * a.head_dim),
        "launch_bf16_attention_mma: the output's split needs nH d (", a.n_heads, " x ", a.head_dim,
        ") a multiple of 32 and ", split_bf16x3_words(int64_t(batch) * a.n_heads * a.head_dim),
        " words; the scratch holds ", out_split.size());
  uint32_t* const split = out_split.empty() ? nullptr : out_split.data();
  const bool tiled = tiles.first != nullptr && tiles.count > 0;
  PARITY_DEVICE_REQUIRE(!tiled || (tiles.count <= batch && tiles.singles <= tiles.count),
                        "launch_bf16_attention_mma: ", tiles.count, " query tiles (", tiles.singles,
                        " of one row ahead) for ", batch, " rows");
  // The leading rows of a tile each (decode): their key tiles over blocks, merged, where the
  // partials fit; the other query tiles fold theirs in one kernel.
  const int alone = attention_mma_splits(a, batch, max_pos, workspace.size(), tiles)
                        ? rows_alone(batch, tiles)
                        : 0;
  const int all_tiles = tiled ? tiles.count : batch;
  const int max_tiles = attention_key_tiles(max_pos, a.window);
  const auto launch = [&]<int kD>() {
    if (alone > 0) {  // rows 0 .. alone - 1, tiles 0 .. alone - 1
      HIP_CHECK(launch_programmatic(
          &bf16_attention_split<kD>, dim3(unsigned(max_tiles), unsigned(a.n_kv), unsigned(alone)),
          dim3(kMmaThreads), 0, stream, a, kv, rows, max_tiles, q, scores, workspace.data()));
      HIP_LAUNCH_CHECK("bf16_attention_split", stream);
      HIP_CHECK(launch_programmatic(
          &bf16_attention_merge<kD>, dim3(unsigned(a.n_heads), unsigned(alone)), dim3(kD), 0,
          stream, a, rows, max_tiles, sinks, workspace.data(), scores, out, split));
      HIP_LAUNCH_CHECK("bf16_attention_merge", stream);
    }
    if (all_tiles > alone) {
      const dim3 grid(unsigned(all_tiles - alone), unsigned(a.n_kv));
      HIP_CHECK(launch_programmatic(&bf16_attention_mma<kD>, grid, dim3(kMmaThreads), 0, stream, a,
                                    kv, rows, tiled ? tiles.first : nullptr, alone, q, sinks,
                                    scores, out, split));
      HIP_LAUNCH_CHECK("bf16_attention_mma", stream);
    }
  };
  if (a.head_dim == 16)
    launch.template operator()<16>();
  else if (a.head_dim == 32)
    launch.template operator()<32>();
  else
    launch.template operator()<64>();
}

void launch_f32_kv_cache_append(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                                int batch, const float* k, const float* v, hipStream_t stream) {
  check_shape(a, "launch_f32_kv_cache_append");
  check_kv(a, kv, "launch_f32_kv_cache_append");
  PARITY_DEVICE_REQUIRE(rows != nullptr && k != nullptr && v != nullptr && batch > 0,
                        "launch_f32_kv_cache_append: null pointer or empty batch");
  f32_kv_cache_append<<<batch, kThreads, 0, stream>>>(a, kv, rows, k, v);
  HIP_LAUNCH_CHECK("f32_kv_cache_append", stream);
}

void launch_f32_attention_scores(const AttentionShape& a, const KvCacheView& kv,
                                 const StepRow* rows, int batch, int max_pos, const float* q,
                                 const float* sinks, float* scores, hipStream_t stream,
                                 const QueryTiles& tiles) {
  check_shape(a, "launch_f32_attention_scores");
  check_kv(a, kv, "launch_f32_attention_scores");
  PARITY_DEVICE_REQUIRE(
      rows != nullptr && q != nullptr && sinks != nullptr && scores != nullptr && batch > 0,
      "launch_f32_attention_scores: null pointer or empty batch");
  PARITY_DEVICE_REQUIRE(max_pos >= 0 && max_pos < a.max_context,
                        "launch_f32_attention_scores: ", "position ", max_pos,
                        " outside the cache of ", a.max_context);
  const int g = a.n_heads / a.n_kv;
  const size_t smem = size_t(g * a.head_dim + kScoreTile * (a.head_dim + 1)) * sizeof(float);
  PARITY_DEVICE_REQUIRE(smem <= 48 * 1024, "launch_f32_attention_scores: ", g,
                        " heads per KV head of dimension ", a.head_dim, " need ", smem,
                        " bytes of shared memory (limit 48 KiB)");
  const unsigned key_tiles = unsigned(ceil_div(max_pos + 1, kScoreTile));
  if (takes_tiles(a, tiles, batch, reinterpret_cast<uintptr_t>(q), kTiledScoresMinRows)) {
    const int tile_rows = tiles.count == batch ? 1 : kQueryTileRows;
    const size_t tiled = tiled_scores_smem(a, tile_rows);
    if (tiled <= 48 * 1024) {
      const dim3 grid(key_tiles, unsigned(a.n_kv), unsigned(tiles.count));
      const int threads = std::min(kGroupThreads * tile_pair_groups(g, tile_rows), kTiledThreads);
      f32_attention_scores_tiled<<<grid, threads, tiled, stream>>>(
          a, kv, rows, tiles.first, tile_rows, q, sinks, scores);
      HIP_LAUNCH_CHECK("f32_attention_scores_tiled", stream);
      return;
    }
  }
  const dim3 grid(key_tiles, unsigned(a.n_kv), unsigned(batch));
  f32_attention_scores_gqa_sink<<<grid, kThreads, smem, stream>>>(a, kv, rows, q, sinks, scores);
  HIP_LAUNCH_CHECK("f32_attention_scores_gqa_sink", stream);
}

void launch_f32_softmax_with_sink(int n_heads, const StepRow* rows, int batch, const float* scores,
                                  float* probs, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(
      rows != nullptr && scores != nullptr && probs != nullptr && batch > 0 && n_heads > 0,
      "launch_f32_softmax_with_sink: null pointer, empty batch or no heads");
  f32_softmax_with_sink<<<dim3(unsigned(n_heads), unsigned(batch)), kThreads, 0, stream>>>(
      n_heads, rows, scores, probs);
  HIP_LAUNCH_CHECK("f32_softmax_with_sink", stream);
}

void launch_f32_attention_pv(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                             int batch, int max_pos, const float* probs, float* workspace,
                             float* out, std::span<uint32_t> out_split, hipStream_t stream,
                             const QueryTiles& tiles) {
  check_shape(a, "launch_f32_attention_pv");
  check_kv(a, kv, "launch_f32_attention_pv");
  PARITY_DEVICE_REQUIRE(rows != nullptr && probs != nullptr && out != nullptr && batch > 0,
                        "launch_f32_attention_pv: null pointer or empty batch");
  PARITY_DEVICE_REQUIRE(max_pos >= 0 && max_pos < a.max_context,
                        "launch_f32_attention_pv: ", "position ", max_pos, " outside the cache of ",
                        a.max_context);
  if (!out_split.empty())
    PARITY_DEVICE_REQUIRE(attention_out_writes_split(a) &&
                              reinterpret_cast<uintptr_t>(out_split.data()) % 16 == 0 &&
                              out_split.size() >= split_bf16x3_words(int64_t(batch) * a.n_heads *
                                                                     a.head_dim),
                          "launch_f32_attention_pv: the output's split needs nH d (", a.n_heads,
                          " x ", a.head_dim, ") a multiple of 32 and ",
                          split_bf16x3_words(int64_t(batch) * a.n_heads * a.head_dim),
                          " words (16-byte aligned); the scratch holds ", out_split.size());
  uint32_t* const split = out_split.empty() ? nullptr : out_split.data();
  const int g = a.n_heads / a.n_kv;
  const int warp = device_warp_size();
  const int threads = ceil_div(g * a.head_dim, warp) * warp;
  PARITY_DEVICE_REQUIRE(threads <= 1024, "launch_f32_attention_pv: ", g,
                        " heads per KV head of dimension ", a.head_dim,
                        " exceed one block of 1024 threads");
  const int split_keys = attention_split_keys(a.max_context);
  const int max_splits = ceil_div(a.max_context, split_keys);
  const int splits = ceil_div(max_pos + 1, split_keys);
  PARITY_DEVICE_REQUIRE(splits == 1 || workspace != nullptr,
                        "launch_f32_attention_pv: positions past ", split_keys,
                        " keys need the split workspace");
  // Whole warps, and a multiple of the quads per head (each thread loads one quad of a key).
  const int quads = a.head_dim / 4;
  int pv_threads = tile_pair_groups(g) * quads;
  if (quads > 0)
    while (pv_threads % 32 != 0) pv_threads += quads;
  const size_t pairs8 = size_t(tile_pair_groups(g)) * kTilePairs;
  const size_t pv_smem =
      (size_t(kPvTileKeys) * a.head_dim + pairs8 * (kPvTileKeys + 1)) * sizeof(float) +
      pairs8 * (sizeof(int64_t) + 2 * sizeof(int));
  if (takes_tiles(a, tiles, batch, reinterpret_cast<uintptr_t>(out) |
                                       reinterpret_cast<uintptr_t>(workspace)) &&
      pv_threads <= kTiledThreads && pv_smem <= 48 * 1024) {
    const dim3 grid(unsigned(splits), unsigned(a.n_kv), unsigned(tiles.count));
    f32_attention_pv_tiled<<<grid, pv_threads, pv_smem, stream>>>(
        a, kv, split_keys, max_splits, rows, tiles.first, probs, workspace, out, split);
    HIP_LAUNCH_CHECK("f32_attention_pv_tiled", stream);
  } else {
    pv_rows(a, kv, rows, batch, threads, split_keys, max_splits, splits, probs, workspace, out,
            split, stream);
  }
  if (splits > 1) {
    f32_attention_pv_combine<<<batch, kThreads, 0, stream>>>(a, split_keys, max_splits, rows,
                                                             workspace, out, split);
    HIP_LAUNCH_CHECK("f32_attention_pv_combine", stream);
  }
}

}  // namespace parity::device
