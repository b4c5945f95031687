// The device kernels of the gpt-oss forward pass, one launcher per kernel, callable from host
// C++ (the backend, the kernel tests). Each launcher validates its arguments (parity::Error
// naming the launcher and the argument), picks the launch shape and checks the launch.
//
// Conventions: activations are float32, row-major, one row per token of the step (`batch` rows).
// Matrices keep their checkpoint dtype (BF16, F16, F32), stored [out, in] as PyTorch does;
// MXFP4 experts stay as blocks/scales. Every output element is produced by one thread or one
// warp in a fixed order (explicit fmaf in dot products, fixed shuffle trees, no atomics), so
// a row's result does not depend on the other rows of the batch or on the run.
//
// Files (same base names as reference/): embedding.hip, rmsnorm.hip, linear.hip, rope.hip,
// attention.hip, router.hip, experts.hip, swiglu.hip, residual.hip, sampled.hip, sample.hip.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

#include "device/hip_compat.h"
// After hip_compat.h: the types' host/device helpers compile for the device too.
#include "device/kernel_types.h"

namespace parity::device {

std::string_view weight_type_name(WeightType t);
size_t weight_type_size(WeightType t);

// Warp (wavefront) size of the current device, from the runtime; cached per device.
int device_warp_size();
// Warp size the device code was compiled for (a kernel reports it); must equal the above.
int compiled_warp_size(hipStream_t stream);

// embedding: x (B, H) = float(table[token_r]) for each row (no scaling). table [V, H].
void launch_f32_embedding_gather(const Matrix& table, const StepRow* rows, int batch, float* x,
                                 hipStream_t stream);

// row gather: y[i] (n,) = x[rows[i]] (n,) for i < count; rows (device, count entries) index
// x's rows. The engine's epilogue (final_norm, logits) runs on the sampled rows only.
void launch_f32_gather_rows(const float* x, const int32_t* rows, int count, int n, float* y,
                            hipStream_t stream);

// rmsnorm: y (B, n) = x / sqrt(mean(x^2) + eps) * weight, weight (n,) in its checkpoint dtype.
// (gpt_oss/torch/model.py RMSNorm; the order (x * inv) * weight as in reference/rmsnorm.cpp)
void launch_f32_rmsnorm(const float* x, WeightType weight_type, const void* weight, int batch,
                        int n, float eps, float* y, hipStream_t stream);
// The same y, and y split into BF16 parts into `split` (launch_split_bf16x3's layout, the rows
// contiguous: at least split_bf16x3_words(batch n) words) for the MMA kernel that reads y next.
// n as rmsnorm_writes_split(n) says; x, weight and y 16-byte aligned.
inline constexpr int kRmsNormMaxSplitN = 8192;
inline bool rmsnorm_writes_split(int n) {
  return n % 32 == 0 && n <= kRmsNormMaxSplitN;
}
void launch_f32_rmsnorm_split(const float* x, WeightType weight_type, const void* weight,
                              int batch, int n, float eps, float* y, std::span<uint32_t> split,
                              hipStream_t stream);

// Float32 inputs split into three BF16 parts that sum to them exactly, for the MMA kernels
// (device/split_inputs.hip has the layout): `floats` (a multiple of 32) inputs of x (16-byte
// aligned) into `split` (at least split_bf16x3_words(floats) words, 16-byte aligned).
inline constexpr int kSplitParts = 3;           // hi, mid, lo
inline constexpr int kSplitWordsPerBlock = 48;  // words per block of 32 inputs: 3 x 32 BF16 / 2
inline constexpr int kSplitQuadsPerBlock = 12;  // the same in 16-byte units
size_t split_bf16x3_words(int64_t floats);
void launch_split_bf16x3(const float* x, int64_t floats, std::span<uint32_t> split,
                         hipStream_t stream);

// gemv: y[b, col + j] = W[j, :] . x[b, :] + bias[j] for each segment (W [out, in], bias (out,)
// float or null). Segments stack their outputs side by side in y (qkv: q | k | v). With
// `residual`, also resid_out[b, j] = residual[b, j] + y[b, j] (o_proj -> resid_attn).
struct GemvSegment {
  Matrix w;
  const float* bias = nullptr;
  int y_col = 0;
};
struct GemvResidual {
  const float* residual = nullptr;  // (B, ld) ; null: no epilogue
  float* out = nullptr;
  int ld = 0;
};
// The MMA kernels' inputs split into BF16 parts: `words` is the scratch (at least
// split_bf16x3_words of the floats the kernel reads); `ready` says it already holds the split of
// those inputs (their producer wrote it: launch_f32_rmsnorm_split), so no split is launched.
struct SplitInput {
  std::span<uint32_t> words;
  bool ready = false;
  // The products' precision (device/kernel_types.h): fp32 uses all three parts, bf16 the hi part.
  Precision precision = Precision::fp32;
};
// BF16 weights with in and ldx multiples of 32 (16-byte aligned x and weights) run on MMA tiles
// and need `split` (at least split_bf16x3_words((batch - 1) ldx + in) words); other weights take
// the GEMV and leave it unused. Either way a row's result does not depend on the batch.
void launch_f32_gemv_bias(std::span<const GemvSegment> segments, const float* x, int ldx, int batch,
                          float* y, int ldy, GemvResidual residual, SplitInput split,
                          hipStream_t stream);
namespace detail {
// The MMA tiling behind launch_f32_gemv_bias, callable with each so that the kernel tests
// compare them bit for bit: quarter tiles (a block's four warps on the same 32 or 16 rows, a
// quarter of the input each), narrow (the quarter tiles on 16 rows by 32 batch rows; batch 32
// and more), wide (128 rows a block, each warp 32 of them over the whole input, the batch rows'
// split inputs staged once per block; batch 32 and more), or warpgroup (Hopper's wgmma: 128 rows
// by 64 batch rows a block; the bf16 precision where warpgroup_mma_available()). gemv_wide says
// whether the entry point takes the wide tiles for `rows` output rows at `batch`, gemv_narrow
// whether it takes the narrow ones at `batch` in `precision` (where neither the wide nor the
// warpgroup tiles run), gemv_warpgroup whether it takes the warpgroup tiles where they run.
enum class GemvTiling { automatic, quarter, narrow, wide, warpgroup };
bool gemv_wide(int rows, int batch);
bool gemv_narrow(int batch, Precision precision);
bool gemv_warpgroup(int rows, int batch);
void launch_f32_gemv_bias_tiled(std::span<const GemvSegment> segments, const float* x, int ldx,
                                int batch, float* y, int ldy, GemvResidual residual,
                                SplitInput split, GemvTiling tiling, hipStream_t stream);
}  // namespace detail

// qkv split + YaRN RoPE (half-split pairs, gpt_oss/torch/model.py _apply_rotary_emb):
//   for head h of q (nH heads) and k (nKV heads), i < d/2, angle = pos * inv_freq[i] (float):
//   out[i] = x[i] c - x[i + d/2] s,  out[i + d/2] = x[i + d/2] c + x[i] s,
//   c = cos(angle) * concentration, s = sin(angle) * concentration.  v is copied unrotated.
// qkv (B, (nH + 2 nKV) d) -> q (B, nH d), k (B, nKV d), v (B, nKV d). inv_freq (d/2,) on device.
// With `append` (not null), k and v are also appended to the KV cache as
// launch_f32_kv_cache_append(append->shape, append->kv, rows, ...) writes them (the same values:
// the scores stage's append then has nothing left to do).
struct KvAppend {
  AttentionShape shape;
  KvCacheView kv;
};
void launch_f32_qkv_split_yarn_rope(const float* qkv, const StepRow* rows, int batch, int n_heads,
                                    int n_kv, int head_dim, const float* inv_freq,
                                    float concentration, float* q, float* k, float* v,
                                    const KvAppend* append, hipStream_t stream);

// The KV cache is paged (KvCacheView, device/kernel_types.h): each row reads and writes its
// sequence's keys and values through its block table, K(j) at kv_row_offset(kv, table, slot, 0,
// j, nKV d), V(j) at (..., 1, ...). The arithmetic does not depend on where the blocks lie.

// KV-cache append: K(pos_r) = k[r], V(pos_r) = v[r] (nKV d each) in the layer's slot.
void launch_f32_kv_cache_append(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                                int batch, const float* k, const float* v, hipStream_t stream);

// scores (per row, packed at scores_offset): S[h][j] = (q_h . k_{h / g, j}) * scale for visible
// j (j <= pos; sliding: pos - j < window), -inf for masked j <= pos, S[h][pos + 1] = sinks[h]
// (raw). GQA: query head h reads KV head h / g, g = nH / nKV. Split over the key axis in tiles.
// `max_pos` is the largest position of the batch (grid size; a host value). With `tiles`
// (QueryTiles: rows of one sequence together), one block computes a tile's rows from one read of
// each key; the scores are bitwise those of the one-row kernel.
void launch_f32_attention_scores(const AttentionShape& a, const KvCacheView& kv,
                                 const StepRow* rows, int batch, int max_pos, const float* q,
                                 const float* sinks, float* scores, hipStream_t stream,
                                 const QueryTiles& tiles = {});

// softmax with the sink column: P[h][:] = softmax(S[h][0 .. pos + 1]) per row and head;
// m = max, p = exp(s - m) / sum(exp(s - m)); masked (-inf) entries give exactly 0.
void launch_f32_softmax_with_sink(int n_heads, const StepRow* rows, int batch, const float* scores,
                                  float* probs, hipStream_t stream);

// attention output: O[h] (d,) = sum over visible j of P[h][j] v_{h / g, j} (sink column unused;
// zero probabilities skipped as in reference/attention.cpp). Split over the key axis in chunks
// of attention_split_keys(max_context) (device/kernel_types.h); partial sums (workspace,
// attention_workspace_floats) are combined in chunk order. out (B, nH d). With `out_split`
// not empty (at least split_bf16x3_words(B nH d) words; nH d as attention_out_writes_split says),
// out's split into BF16 parts (launch_split_bf16x3's words) is written too, for o_proj. `tiles`
// as for the scores: one read of each value for a tile's rows, the same bits.
inline bool attention_out_writes_split(const AttentionShape& a) {
  return int64_t(a.n_heads) * a.head_dim % 32 == 0;
}
void launch_f32_attention_pv(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                             int batch, int max_pos, const float* probs, float* workspace,
                             float* out, std::span<uint32_t> out_split, hipStream_t stream,
                             const QueryTiles& tiles = {});

// scores, softmax and output in one kernel for steps whose rows are each their own query tile
// (decode): scores, probs, out and out's split as launch_f32_attention_scores,
// launch_f32_softmax_with_sink and launch_f32_attention_pv write them, bit for bit (the same
// chains and trees; no split workspace). attention_decode_fuses says where it applies (every row
// its own tile; head_dim 16, 32 or 64; at most 8 heads per KV head; positions up to 1,023, a
// block's scores within 48 KiB of shared memory). A stage launched again on overwritten inputs
// (replay, fault injection) runs its own kernel.
bool attention_decode_fuses(const AttentionShape& a, int batch, int max_pos,
                            const QueryTiles& tiles);
void launch_f32_attention_decode(const AttentionShape& a, const KvCacheView& kv,
                                 const StepRow* rows, int batch, int max_pos, const float* q,
                                 const float* sinks, float* scores, float* probs, float* out,
                                 std::span<uint32_t> out_split, hipStream_t stream);

// The bf16 precision's attention: scores, softmax and output, the products on BF16 MMA tiles (q,
// k, the probabilities and v each rounded once to BF16, float32 accumulation) and the softmax
// flash-style over 64-key tiles at fixed offsets, each tile's partial folded in tile order from
// the sink (device/attention.hip spells the arithmetic). Prefill chunks fold as they go in one
// kernel; rows that are each their own query tile (decode) have their key tiles computed in
// parallel, the partials in `workspace` and folded by a second kernel
// (attention_mma_splits: when they fit, attention_partials_floats). A row's output has the same
// bits either way and in every tiling -- alone, in a prefill chunk's query tiles, or with any
// other rows -- so where attention_mma_fuses holds (device/kernel_types.h: the bf16 precision,
// head_dim 16, 32 or 64, at most 8 heads per KV head; the cache then BF16) it is every step's
// attention and a request's tokens do not depend on its batch. out (B, nH d) and its split as
// launch_f32_attention_pv writes them; `scores` (not null in a traced step) also receives the
// scores as launch_f32_attention_scores lays them out, from which the softmax stage's kernel
// computes att. The cache must be BF16 (kv.dtype).
bool attention_mma_splits(const AttentionShape& a, int batch, int max_pos, size_t workspace_floats,
                          const QueryTiles& tiles = {});
void launch_bf16_attention_mma(const AttentionShape& a, const KvCacheView& kv, const StepRow* rows,
                               int batch, int max_pos, const float* q, const float* sinks,
                               float* scores, float* out, std::span<uint32_t> out_split,
                               std::span<float> workspace, hipStream_t stream,
                               const QueryTiles& tiles = {});

// router: top-k of the logits g (B, E) (descending; ties: lowest expert index), then
// w = softmax(g[idx]) over the k selected only. With select = false, idx is read (it was
// overwritten) and only w is recomputed.
void launch_f32_router_topk_softmax(const float* logits, int batch, int n_experts, int k,
                                    bool select, int32_t* idx, float* w, hipStream_t stream);
// router logits and decision in one kernel: logits (B, E) = W x + bias (W [E, in] in its dtype,
// bias float or null; per expert one warp, fmaf in the GEMV's lane order, then a butterfly), then
// idx and w as launch_f32_router_topk_softmax(select = true) computes them from those logits.
// One block per row or per two rows, inputs staged in shared memory (at most kRouterMaxInputs);
// when a row's experts are spread over several blocks (small batches; more experts than one
// block's warps), the last block to finish takes the decision: `tickets` then holds at least
// router_tickets(B, E, in) int32 zeros, which the kernel leaves zero (at most one per row). A
// row's results do not depend on the batch.
inline constexpr int kRouterMaxInputs = 10240;
size_t router_tickets(int batch, int n_experts, int in);
void launch_f32_router(const Matrix& weight, const float* bias, const float* x, int batch, int k,
                       float* logits, int32_t* idx, float* w, std::span<int32_t> tickets,
                       hipStream_t stream);

// expert linear for every (row, slot): y[r][s] (out,) = W[e] x + b[e], e = idx[r][s] read from
// device memory. x row of slot s of row r is x + r * x_row_stride + s * x_slot_stride.
// With `act` (mlp1): also act[r][s][i] = swiglu(y[2i], y[2i + 1]) (see launch_f32_swiglu).
// y (B, k, out); act (B, k, out / 2). An invalid expert index gives NaN outputs for its pair.
// MXFP4 weights (packed: launch_u8_mxfp4_pack_blocks / _scales) run on MMA tiles (BF16
// products, float32 accumulation) with x split into three BF16 parts that sum to it exactly
// (into ws.split, at least split_bf16x3_words(floats of x the step reads)); steps of more than
// a few pairs first sort the pairs by expert into ws.routing (at least moe_routing_ints(B k,
// experts)) so that each expert's weights are read once per tile of pairs. Every output is the
// same sequence of MMA steps whatever the step's size: a row's result does not depend on the
// batch. Workspace contents are scratch. With `act` and ws.act_split not empty (at least
// split_bf16x3_words(B k out / 2) words; out / 2 as moe_writes_act_split says), act's split into
// BF16 parts (launch_split_bf16x3's words) is written too, for mlp2.
struct MoeWorkspace {
  std::span<int32_t> routing;
  std::span<uint32_t> split;
  bool split_ready = false;  // split already holds x's split (SplitInput::ready)
  std::span<uint32_t> act_split;
  // The expert indices were complete before the kernel launched just before this one began (mlp2
  // after mlp1: the router wrote them): a small step's tiles read them and load their first
  // weights while that kernel still runs. False: they wait for it first.
  bool idx_settled = false;
  // The products' precision, as SplitInput::precision.
  Precision precision = Precision::fp32;
};
inline bool moe_writes_act_split(int out) {
  return out % 64 == 0;
}
void launch_f32_moe_linear(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                           const float* x, int x_row_stride, int x_slot_stride, float* y,
                           float* act, float alpha, float limit, const MoeWorkspace& ws,
                           hipStream_t stream);
// MXFP4 expert weights into the layout the MMA kernel reads (Mxfp4Packing, kernel_types.h):
// `experts` experts' checkpoint blocks [E, out, in / 32, 16] (16-byte aligned) into
// Mxfp4Packing(out, in).block_bytes(experts) bytes, and their scales [E, out, in / 32] into
// scale_bytes(experts) bytes; in a multiple of 32. The weights are uploaded as stored and
// packed on the device (device/runtime/device_weights.cpp); the raw buffers may then be freed.
void launch_u8_mxfp4_pack_blocks(const uint8_t* raw_blocks, int experts, int out, int in,
                                 uint8_t* packed_blocks, hipStream_t stream);
void launch_u8_mxfp4_pack_scales(const uint8_t* raw_scales, int experts, int out, int in,
                                 uint8_t* packed_scales, hipStream_t stream);
// Int32 elements of the routing workspace for `pairs` (row, slot) pairs over `experts` experts:
// pairs + 2 (experts + 2). (device/runtime/arena_layout.cpp sizes the arena's by this formula.)
size_t moe_routing_ints(int64_t pairs, int experts);

namespace detail {
// The tiling behind launch_f32_moe_linear, callable with any built tiling so that the kernel
// tests compare them bit for bit: pair mode (one pair per tile, no sort) or grouped by expert,
// with tiles of 16 m_tiles rows by 8 n_tiles pairs (2 x 1 or 2 x 2); `wide` blocks take
// four such row tiles of the same pairs (128 rows; their split inputs staged once per block), or
// else one, the four warps a quarter of the input each. Pair mode is not wide; 2 x 2 always is.
struct MoeTiling {
  bool grouped = true;
  int m_tiles = 2, n_tiles = 1;
  bool wide = false;
  bool warpgroup = false;  // Hopper's wgmma tiles (bf16; warpgroup_mma_available())
};
// The tiling launch_f32_moe_linear takes for `precision`; `warpgroup`: whether the warpgroup
// tiles may run (the bf16 precision on a GPU with warpgroup MMA).
MoeTiling moe_tiling(int64_t pairs, int experts, Precision precision, bool warpgroup);
void launch_f32_mxfp4w_moe_mma(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                               const float* x, int x_row_stride, int x_slot_stride, float* y,
                               float* act, float alpha, float limit, const MoeWorkspace& ws,
                               MoeTiling tiling, hipStream_t stream);
}  // namespace detail

// swiglu (gpt_oss/torch/model.py swiglu, alpha 1.702, limit 7) on h (n, 2I) interleaved:
//   gate = min(h[2i], limit); lin = clamp(h[2i + 1], -limit, limit);
//   a[i] = gate * sigmoid(alpha * gate) * (lin + 1).        a (n, I); n = B k.
void launch_f32_swiglu(const float* h, int n, int inter, float alpha, float limit, float* a,
                       hipStream_t stream);

// moe_out[b] (n,) = sum over slots s (in order) of w[b][s] * expert_out[b][s] (n,);
// with resid_out: resid_out[b] = residual[b] + moe_out[b].
void launch_f32_moe_weighted_sum_residual(const float* w, const float* expert_out, int batch, int k,
                                          int n, const float* residual, float* moe_out,
                                          float* resid_out, hipStream_t stream);

// y (count,) = a + b.
void launch_f32_add(const float* a, const float* b, int64_t count, float* y, hipStream_t stream);

// A tensor-parallel group's all-reduce after the all-gather of its partial sums: parts
// [ranks][n]; sum (n,) = the parts added in rank order (from part 0); with resid_out:
// resid_out = residual + sum. (device/shards.hip)
void launch_f32_rank_sum_residual(const float* parts, int ranks, int64_t n, const float* residual,
                                  float* sum, float* resid_out, hipStream_t stream);
// The same all-reduce in one kernel for ranks whose GPUs reach each other's memory
// (device/runtime/peer_group.h): data (n floats, n % 4 == 0, n <= peers.capacity) is written into
// every rank's parts at its rank's place, each block raises its flags and waits for every rank's,
// then sum and resid_out as launch_f32_rank_sum_residual computes them from this rank's parts
// (the same bits). sum may be data. A wait past the timeout or an abort leaves the outputs
// unwritten and says so in peers.failed.
void launch_f32_peer_rank_sum_residual(const PeerReduceView& peers, const float* data, int64_t n,
                                       const float* residual, float* sum, float* resid_out,
                                       hipStream_t stream);
// The vocabulary join the same way: shard (this rank's part of `part` floats, part % 4 == 0,
// part <= peers.capacity) exchanged into every rank's parts, then logits as
// launch_f32_vocab_join writes them.
void launch_f32_peer_vocab_join(const PeerReduceView& peers, const float* shard, int64_t part,
                                int rows, int vocab, float* logits, hipStream_t stream);
// lm_head's vocabulary shards into full rows: rank r's part (at parts + r part_floats) holds rows
// [rows, size(r)] of the vocabulary rows split_range(vocab, ranks, r)
// (device/runtime/shard_plan.h); logits (rows, vocab).
void launch_f32_vocab_join(const float* parts, int ranks, int rows, int vocab, int64_t part_floats,
                           float* logits, hipStream_t stream);

// greedy sampling: token[b] = argmax of logits[b] (V,), the lowest index among equal values;
// NaN never wins unless every value is NaN (then 0). (reference/sampled.cpp)
void launch_f32_argmax(const float* logits, int batch, int vocab, int32_t* token,
                       hipStream_t stream);

// sampling: tokens[b] = the token engine/sampler.h defines for row b (logits + b * ld, vocab
// values) under params[b] (device memory, one per row): greedy rows as launch_f32_argmax; other
// rows by exact integer selection over the 64-bit order keys (top-k, then the top-p prefix by
// cumulative fixed-point weight, then the draw), with integer histograms only, so the token does
// not depend on the batch or the run. batch <= kMaxSampleBatch, vocab <= kMaxSampleVocab.
inline constexpr int kMaxSampleBatch = 65535;
inline constexpr int kMaxSampleVocab = 1 << 23;  // weights sum exactly in uint64 (2^23 * 2^40)
void launch_f32_sample(const float* logits, int ld, int batch, int vocab,
                       const SampleParams* params, int32_t* tokens, hipStream_t stream);

}  // namespace parity::device
