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
#include <algorithm>

#include "device/device_math.h"
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
  float* kc = kv.blocks + kv_row_offset(kv, table, a.kv_slot, 0, rows[r].pos, kv_dim);
  float* vc = kv.blocks + kv_row_offset(kv, table, a.kv_slot, 1, rows[r].pos, kv_dim);
  for (int t = int(threadIdx.x); t < kv_dim; t += int(blockDim.x)) {
    kc[t] = k[int64_t(r) * kv_dim + t];
    vc[t] = v[int64_t(r) * kv_dim + t];
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
  const float* kc = kv.blocks + int64_t(kvh) * d;
  for (int t = int(threadIdx.x); t < kScoreTile * d; t += int(blockDim.x)) {
    const int jj = t / d, i = t % d, j = j0 + jj;
    const bool visible = j < j_end && j >= first;
    const float x = kc[kv_row_offset(kv, table, a.kv_slot, 0, visible ? j : pos, kv_dim) + i];
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
        const float* v =
            kv.blocks + kv_row_offset(kv, table, a.kv_slot, 1, j0 + jj, kv_dim) + int64_t(kvh) * d;
        vq[u] = vec ? *reinterpret_cast<const float4*>(v + 4 * c) : float4{v[c], 0, 0, 0};
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

}  // namespace

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
                                 const float* sinks, float* scores, hipStream_t stream) {
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
  const dim3 grid(unsigned(ceil_div(max_pos + 1, kScoreTile)), unsigned(a.n_kv), unsigned(batch));
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
                             float* out, std::span<uint32_t> out_split, hipStream_t stream) {
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
  if (splits > 1) {
    f32_attention_pv_combine<<<batch, kThreads, 0, stream>>>(a, split_keys, max_splits, rows,
                                                             workspace, out, split);
    HIP_LAUNCH_CHECK("f32_attention_pv_combine", stream);
  }
}

}  // namespace parity::device
