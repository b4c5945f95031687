#include "device/stage_launch.h"

#include <algorithm>

#include "device/fusion.h"
#include "device/kernels.h"
#include "model/error.h"

namespace parity::device {

// mlp1's epilogue writes mlp2's split (three 2-byte stores per output, scattered over the
// tile's pairs) in steps of up to this many (row, slot) pairs; larger steps leave it to the split
// kernel's 16-byte stores, which were faster at prefill (docs/measurements.md, 2026-11-25).
constexpr int64_t kMlp1SplitMaxPairs = 256;

namespace {

bool is_epilogue(Stage s) {
  return s == Stage::final_norm || s == Stage::logits || s == Stage::sampled;
}

// Stage `s`'s kernels over every row of the step, or, for an epilogue stage with `sampled`,
// over those rows.
void launch(DeviceRuntime& rt, Stage s, int layer, StageCall call, StaleRows stale,
            const SampledRows* sampled) {
  PARITY_CHECK(sampled == nullptr || is_epilogue(s), "launch_sampled_stage({})", name(s));
  const Config& c = rt.config();
  const ActivationArena& arena = rt.arena();
  const auto out = [&](Stage st) { return arena.out(st); };
  // Input of the layer's attention block: the embedding, or the previous layer's resid_ffn.
  const auto residual_in = [&] { return out(layer == 0 ? Stage::embedding : Stage::resid_ffn); };
  const int B = sampled != nullptr ? sampled->count : rt.step().rows();
  const int H = c.hidden_size, k = c.num_experts_per_tok, I = c.intermediate_size;
  const float alpha = float(c.swiglu_alpha), limit = float(c.swiglu_limit);
  const float eps = float(c.rms_norm_eps);
  const hipStream_t st = rt.stream();
  const StepRow* rows = rt.step().device_rows();
  const int max_pos = rt.launch_max_pos();  // the attention grids' bound
  const DeviceWeights& w = rt.weights();
  const DeviceLayer* L = layer >= 0 ? &w.layer(layer) : nullptr;
  int32_t* topk_idx = arena.index_out(Stage::topk_idx);
  // The MMA kernels' split of stage `in`'s output: ready when its producer wrote it (and nothing
  // since); otherwise the kernel splits it into the scratch, which then holds no producer's split.
  // The products' precision is the runtime's (DeviceOptions::precision).
  const auto split_of = [&](Stage in, int in_layer) {
    const SplitInput split{arena.split_of(in), rt.split_holds(in, in_layer), rt.precision()};
    if (!split.ready) rt.forget_split(in);
    return split;
  };
  // A norm writes its output's split too when its rows are whole blocks of 32.
  const auto rmsnorm = [&](const float* x, const DeviceNorm& weight, Stage s_out, int s_layer) {
    if (rmsnorm_writes_split(H)) {
      launch_f32_rmsnorm_split(x, weight.type, weight.data, B, H, eps, out(s_out),
                               arena.split_of(s_out), st);
      rt.set_split_source(s_out, s_layer);
    } else {
      launch_f32_rmsnorm(x, weight.type, weight.data, B, H, eps, out(s_out), st);
    }
  };
  const auto moe_ws = [&](Stage in) {  // the expert linear's workspace for input `in`
    MoeWorkspace ws = arena.moe_workspace(in);
    const SplitInput split = split_of(in, layer);
    ws.split_ready = split.ready;
    ws.precision = split.precision;
    return ws;
  };
  const auto gemv = [&](const DeviceLinear& l, Stage in, int in_layer, Stage out_stage,
                        GemvResidual residual = {}) {
    const GemvSegment seg{l.w, l.bias, 0};
    launch_f32_gemv_bias(std::span<const GemvSegment>(&seg, 1), out(in), l.w.cols, B,
                         out(out_stage), l.w.rows, residual, split_of(in, in_layer), st);
  };
  const bool recompute = call == StageCall::recompute;
  PARITY_CHECK(B > 0, "launch_stage({}) with no step", name(s));
  PARITY_CHECK(is_model_scope(s) || L != nullptr, "launch_stage({}) without a layer", name(s));

  switch (s) {
    case Stage::embedding:
      launch_f32_embedding_gather(w.embed(), rows, B, out(s), st);
      break;
    case Stage::attn_norm:
      rmsnorm(residual_in(), L->attn_norm, s, layer);
      break;
    case Stage::qkv: {
      const int qd = c.q_dim(), kvd = c.kv_dim();
      const GemvSegment segs[3] = {
          {L->q.w, L->q.bias, 0}, {L->k.w, L->k.bias, qd}, {L->v.w, L->v.bias, qd + kvd}};
      launch_f32_gemv_bias(segs, out(Stage::attn_norm), H, B, out(s), c.qkv_dim(), {},
                           split_of(Stage::attn_norm, layer), st);
      break;
    }
    case Stage::q_rope: {  // also appends k_rope and v to the KV cache (the scores stage's)
      const KvAppend append{rt.attention_shape(layer), rt.kv_view()};
      launch_f32_qkv_split_yarn_rope(out(Stage::qkv), rows, B, c.num_attention_heads,
                                     c.num_key_value_heads, c.head_dim, w.inv_freq(),
                                     w.concentration(), out(Stage::q_rope), out(Stage::k_rope),
                                     out(Stage::v), &append, st);
      break;
    }
    case Stage::k_rope:
    case Stage::v:
      break;  // written by q_rope's kernel
    case Stage::scores: {
      const AttentionShape a = rt.attention_shape(layer);
      const KvCacheView kv = rt.kv_view();
      // q_rope's kernel appended k_rope and v; again only when they were overwritten since.
      if (recompute)
        launch_f32_kv_cache_append(a, kv, rows, B, out(Stage::k_rope), out(Stage::v), st);
      const bool split = attention_out_writes_split(a);
      const std::span<uint32_t> out_split =
          split ? arena.split_of(Stage::attn_out) : std::span<uint32_t>{};
      if (attention_mma_fuses(a, rt.precision())) {
        // The bf16 precision: attn_out (and o_proj's split of it) at every step, the scores only
        // where a trace reads them.
        launch_bf16_attention_mma(a, kv, rows, B, max_pos, out(Stage::q_rope), L->sinks,
                                  call == StageCall::untraced ? nullptr : arena.scores(),
                                  out(Stage::attn_out), out_split, arena.attention_workspace(), st,
                                  rt.step().device_query_tiles());
        if (split) rt.set_split_source(Stage::attn_out, layer);
        break;
      }
      if (attention_decode_fuses(a, B, max_pos, rt.step().device_query_tiles())) {
        // Decode: also the att and attn_out stages (and o_proj's split of attn_out).
        launch_f32_attention_decode(a, kv, rows, B, max_pos, out(Stage::q_rope), L->sinks,
                                    arena.scores(), arena.att(), out(Stage::attn_out), out_split,
                                    st);
        if (split) rt.set_split_source(Stage::attn_out, layer);
        break;
      }
      launch_f32_attention_scores(a, kv, rows, B, max_pos, out(Stage::q_rope), L->sinks,
                                  arena.scores(), st, rt.step().device_query_tiles());
      break;
    }
    case Stage::att: {  // written by the scores stage's kernel where it fuses, unless overwritten
      const AttentionShape a = rt.attention_shape(layer);
      const bool mma = attention_mma_fuses(a, rt.precision());
      if (mma && call == StageCall::untraced) break;  // nothing reads it
      if (recompute || mma ||
          !attention_decode_fuses(a, B, max_pos, rt.step().device_query_tiles()))
        launch_f32_softmax_with_sink(c.num_attention_heads, rows, B, arena.scores(), arena.att(),
                                     st);
      break;
    }
    case Stage::attn_out: {  // also o_proj's split of its output
      const AttentionShape a = rt.attention_shape(layer);
      const bool mma = attention_mma_fuses(a, rt.precision());
      if (!recompute &&
          (mma || attention_decode_fuses(a, B, max_pos, rt.step().device_query_tiles())))
        break;  // written by the scores stage's kernel
      const bool split = attention_out_writes_split(a);
      if (mma) {  // the written rows alone: the others keep the MMA kernel's output
        const int first = std::max(stale.first, 0), end = std::min(stale.end, B);
        if (first >= end) break;
        const int64_t row_floats = int64_t(a.n_heads) * a.head_dim;
        std::span<uint32_t> out_split;
        if (split)
          out_split =
              arena.split_of(s).subspan(size_t(first * row_floats / 32 * kSplitWordsPerBlock),
                                        split_bf16x3_words((end - first) * row_floats));
        launch_f32_attention_pv(a, rt.kv_view(), rows + first, end - first, max_pos, arena.att(),
                                arena.workspace(), out(s) + first * row_floats, out_split, st);
        break;
      }
      launch_f32_attention_pv(a, rt.kv_view(), rows, B, max_pos, arena.att(), arena.workspace(),
                              out(s), split ? arena.split_of(s) : std::span<uint32_t>{}, st,
                              rt.step().device_query_tiles());
      if (split) rt.set_split_source(s, layer);
      break;
    }
    case Stage::o_proj:
      if (rt.shard() != nullptr) {  // this rank's heads' partial sum (its bias rank 0's alone)
        gemv(L->o, Stage::attn_out, layer, s);
        rt.all_reduce(out(s), int64_t(B) * H, residual_in(), out(Stage::resid_attn));
        break;
      }
      gemv(L->o, Stage::attn_out, layer, s, {residual_in(), out(Stage::resid_attn), H});
      break;
    case Stage::resid_attn:
      if (recompute) launch_f32_add(residual_in(), out(Stage::o_proj), int64_t(B) * H, out(s), st);
      break;
    case Stage::ffn_norm:
      rmsnorm(out(Stage::resid_attn), L->ffn_norm, s, layer);
      break;
    case Stage::router:  // writes router, topk_idx and topk_w
      launch_f32_router(L->router.w, L->router.bias, out(Stage::ffn_norm), B, k, out(s), topk_idx,
                        out(Stage::topk_w), arena.router_tickets(), st);
      break;
    case Stage::topk_idx:
      if (recompute)
        launch_f32_router_topk_softmax(out(Stage::router), B, c.num_local_experts, k, true,
                                       topk_idx, out(Stage::topk_w), st);
      break;
    case Stage::topk_w:
      if (recompute)
        launch_f32_router_topk_softmax(out(Stage::router), B, c.num_local_experts, k, false,
                                       topk_idx, out(s), st);
      break;
    case Stage::mlp1: {  // also swiglu, and (decode-sized steps) mlp2's split of it
      MoeWorkspace ws = moe_ws(Stage::ffn_norm);
      const bool split = moe_writes_act_split(L->mlp1.out) && int64_t(B) * k <= kMlp1SplitMaxPairs;
      if (split) ws.act_split = arena.split_of(Stage::swiglu);
      launch_f32_moe_linear(L->mlp1, topk_idx, B, k, out(Stage::ffn_norm), H, 0, out(s),
                            out(Stage::swiglu), alpha, limit, ws, st);
      if (split) rt.set_split_source(Stage::swiglu, layer);
      break;
    }
    case Stage::swiglu:
      if (recompute) {
        launch_f32_swiglu(out(Stage::mlp1), B * k, I, alpha, limit, out(s), st);
        rt.forget_split(s);  // mlp1's split of the values this replaced
      }
      break;
    case Stage::mlp2: {
      // The router wrote the indices before mlp1 ran (or a replay wrote them from the host);
      // neither mlp1 nor the SwiGLU or split kernels that may run between write them.
      MoeWorkspace ws = moe_ws(Stage::swiglu);
      ws.idx_settled = true;
      // Under tensor parallel a partial sum, its bias rank 0's alone (DeviceWeights).
      launch_f32_moe_linear(L->mlp2, topk_idx, B, k, out(Stage::swiglu), k * I, I, out(s), nullptr,
                            alpha, limit, ws, st);
      break;
    }
    case Stage::moe_out:
      if (rt.shard() != nullptr) {  // the sum of this rank's intermediate slice, all-reduced
        launch_f32_moe_weighted_sum_residual(out(Stage::topk_w), out(Stage::mlp2), B, k, H, nullptr,
                                             out(s), nullptr, st);
        rt.all_reduce(out(s), int64_t(B) * H, out(Stage::resid_attn), out(Stage::resid_ffn));
        break;
      }
      launch_f32_moe_weighted_sum_residual(out(Stage::topk_w), out(Stage::mlp2), B, k, H,
                                           out(Stage::resid_attn), out(s), out(Stage::resid_ffn),
                                           st);
      break;
    case Stage::resid_ffn:
      if (recompute)
        launch_f32_add(out(Stage::resid_attn), out(Stage::moe_out), int64_t(B) * H, out(s), st);
      break;
    case Stage::final_norm:
      if (sampled != nullptr) {  // the sampled rows of resid_ffn, gathered, then normalized
        launch_f32_gather_rows(out(Stage::resid_ffn), sampled->rows, B, H, arena.sampled_rows(),
                               st);
        rmsnorm(arena.sampled_rows(), w.final_norm(), s, kModelLayer);
      } else {
        rmsnorm(out(Stage::resid_ffn), w.final_norm(), s, kModelLayer);
      }
      break;
    case Stage::logits:
      if (rt.shard() != nullptr) {  // this rank's vocabulary rows, joined into full rows
        const Matrix& head = w.lm_head();
        const GemvSegment seg{head, nullptr, 0};
        for (int r0 = 0; r0 < B; r0 += DeviceRuntime::kJoinRows) {
          const int n = std::min(B - r0, DeviceRuntime::kJoinRows);
          // One part of the rows reads final_norm's split (written with it); parts of more
          // rows split their rows themselves, into the scratch.
          const SplitInput split =
              n == B ? split_of(Stage::final_norm, kModelLayer)
                     : SplitInput{arena.split_of(Stage::final_norm), false, rt.precision()};
          if (n != B) rt.forget_split(Stage::final_norm);
          rt.join_logits(
              n,
              [&](float* shard) {
                launch_f32_gemv_bias(std::span<const GemvSegment>(&seg, 1),
                                     out(Stage::final_norm) + int64_t(r0) * H, H, n, shard,
                                     head.rows, {}, split, st);
              },
              out(s) + int64_t(r0) * c.vocab_size);
        }
        break;
      }
      gemv({w.lm_head(), nullptr}, Stage::final_norm, kModelLayer, s);
      break;
    case Stage::sampled:
      if (sampled != nullptr && sampled->params != nullptr)
        launch_f32_sample(out(Stage::logits), c.vocab_size, B, c.vocab_size, sampled->params,
                          sampled->tokens, st);
      else
        launch_f32_argmax(out(Stage::logits), B, c.vocab_size,
                          sampled != nullptr ? sampled->tokens : arena.index_out(s), st);
      break;
  }
}

}  // namespace

void launch_stage(DeviceRuntime& rt, Stage s, int layer, StageCall call, StaleRows stale) {
  launch(rt, s, layer, call, stale, nullptr);
}

void launch_sampled_stage(DeviceRuntime& rt, Stage s, const SampledRows& rows) {
  launch(rt, s, kModelLayer, StageCall::untraced, {}, &rows);
}

}  // namespace parity::device
