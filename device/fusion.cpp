#include "device/fusion.h"

#include <algorithm>

namespace parity::device {
namespace {

constexpr Stage kKRopeOrV[] = {Stage::k_rope, Stage::v};
constexpr Stage kScores[] = {Stage::scores};
constexpr Stage kScoresOrAtt[] = {Stage::scores, Stage::att};
constexpr Stage kOProj[] = {Stage::o_proj};
constexpr Stage kRouter[] = {Stage::router};
constexpr Stage kTopkIdx[] = {Stage::topk_idx};
constexpr Stage kMlp1[] = {Stage::mlp1};
constexpr Stage kMoeOut[] = {Stage::moe_out};

// The fused kernels (device/kernels.h):
//   q_rope   launch_f32_qkv_split_yarn_rope: q_rope, k_rope and v (all three from qkv alone, so
//            k_rope and v never recompute: an overwritten qkv reruns q_rope itself), and appends
//            k_rope and v to the KV cache (the scores stage's append);
//   scores   launch_f32_attention_decode at decode-sized steps: scores, att and attn_out (and
//            o_proj's split of attn_out); launch_bf16_attention_mma at every step of the bf16
//            precision: attn_out and its split (and, traced, the scores att is computed from);
//   o_proj   launch_f32_gemv_bias with a residual: o_proj and resid_attn = residual + o_proj;
//   router   launch_f32_router: router logits, topk_idx and topk_w (topk_w is recomputed from
//            the router logits when topk_idx was overwritten; an overwritten router recomputes
//            both at topk_idx);
//   mlp1     launch_f32_moe_linear with SwiGLU in its epilogue: mlp1 and swiglu;
//   moe_out  launch_f32_moe_weighted_sum_residual: moe_out and resid_ffn = resid_attn + moe_out.
constexpr Fusion kFusions[] = {
    {Stage::k_rope, Stage::q_rope, Covers::output, {}},
    {Stage::v, Stage::q_rope, Covers::output, {}},
    {Stage::scores, Stage::q_rope, Covers::kv_append, kKRopeOrV},
    {Stage::att, Stage::scores, Covers::attention_output, kScores},
    {Stage::attn_out, Stage::scores, Covers::attention_output, kScoresOrAtt},
    {Stage::resid_attn, Stage::o_proj, Covers::output, kOProj},
    {Stage::topk_idx, Stage::router, Covers::output, kRouter},
    {Stage::topk_w, Stage::router, Covers::output, kTopkIdx},
    {Stage::swiglu, Stage::mlp1, Covers::output, kMlp1},
    {Stage::resid_ffn, Stage::moe_out, Covers::output, kMoeOut},
};

}  // namespace

std::span<const Fusion> fusions() { return kFusions; }

const Fusion* fusion_of(Stage s) {
  const auto it = std::find_if(std::begin(kFusions), std::end(kFusions),
                               [s](const Fusion& f) { return f.covered == s; });
  return it == std::end(kFusions) ? nullptr : &*it;
}

bool fused_into_producer(Stage s) {
  const Fusion* f = fusion_of(s);
  return f != nullptr && f->covers == Covers::output;
}

}  // namespace parity::device
