// MutantBackend: a test-only Backend decorator that gives any candidate backend (cpu-f32, hip)
// ONE classic porting bug, so the harness can prove it names the stage and layer the bug is in.
//
// The bug lives here, not in production code: after the wrapped backend runs a mutated stage,
// the decorator reads that stage's inputs back from it (read()), recomputes the stage's output
// on the host with the bug -- an independent, deliberately wrong re-implementation of that stage
// alone -- and writes it back (write()), so every later stage of the wrapped backend consumes
// the buggy values as it would consume its own. Every other call is forwarded untouched. The
// bug applies to every row of a step (free-running rows and replay rows alike, as a real bug
// would) and only at the chosen layers.
//
// With `with_bug` off the same host re-implementation runs the correct math: the control that
// the re-implementation itself stays inside the derived bounds, so a divergence the suite finds
// is the bug's and not the re-implementation's.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/backend.h"
#include "model/checkpoint.h"
#include "tests/test_util.h"

namespace parity::test {

// Each bug, and the stage the harness must blame for it.
enum class Mutation {
  // SwiGLU gate clamped to [-limit, limit] instead of min(gate, limit) -> swiglu
  swiglu_gate_clamped_both_sides,
  // SwiGLU as (lin) instead of (lin + 1) on the linear half -> swiglu
  swiglu_without_linear_plus_one,
  // SwiGLU gate through SiLU, x sigmoid(x), instead of x sigmoid(1.702 x) -> swiglu
  swiglu_silu_gate,
  // mlp1 split as gate = [0, I), linear = [I, 2I) (chunk(2)) instead of even/odd -> swiglu
  swiglu_halves_not_interleaved,
  // RMSNorm eps 1e-6 (the HF class default) instead of the config's 1e-5 -> attn_norm
  rmsnorm_eps_1e6,
  // attn_norm scaled by post_attention_layernorm's weights (ffn_norm's) -> attn_norm
  attn_norm_with_ffn_norm_weights,
  // RoPE on interleaved pairs (2i, 2i+1), GPT-J style, instead of half-split (i, i + d/2)
  // -> q_rope (k_rope has the same bug)
  rope_interleaved_pairs,
  // YaRN ramp bounds floored/ceiled (truncate=true: low = floor, high = ceil) -> q_rope
  yarn_bounds_truncated,
  // RoPE cos/sin without YaRN's concentration factor 0.1 ln(factor) + 1 -> q_rope
  rope_without_concentration,
  // head h's sink read from head (h + 1) mod nH -> scores
  sink_of_next_head,
  // sink multiplied by the 1/sqrt(d) score scale, as if it were a q.k logit -> scores
  sink_scaled_by_score_scale,
  // sliding window of window + 1 keys (visible while pos - j <= window) -> scores (on a
  // sliding layer, at a position past the window)
  sliding_window_one_key_too_many,
  // query head h reads KV head h % nKV instead of h / (nH / nKV) -> scores
  gqa_head_modulo,
  // softmax over the pos + 1 key columns only, the sink left out of the denominator -> att
  softmax_without_sink,
  // k_rope rows truncated to bf16 (round toward zero) before they reach the KV cache -> k_rope
  k_rope_bf16_truncated,
  // MXFP4 gate_up (mlp1) weights decoded with the high nibble as the even element -> mlp1
  mxfp4_mlp1_nibbles_swapped,
  // expert bias b2 added after the routing weight (moe_out = sum w_s (W2 a_s) + b2_s) instead
  // of before -> mlp2, whose stage contract includes b2 (the first value to leave the
  // reference; moe_out is wrong as well)
  expert_bias_after_routing_weight,
  // topk_w = softmax over all E router logits, read at the selected experts, not renormalized
  // over the top k -> topk_w
  router_softmax_over_all_experts,
  // the top-k experts in ascending instead of descending router-logit order -> topk_idx
  topk_ascending,
  // o_proj without its bias -> o_proj
  o_proj_without_bias,
  // resid_attn = o_proj, the residual add forgotten -> resid_attn
  resid_attn_without_residual,
  // lm_head read from the embedding matrix (tied weights; gpt-oss's are untied) -> logits
  lm_head_tied_to_embedding,
};

struct MutationInfo {
  Mutation mutation;
  std::string_view name;
  // The stages the decorator recomputes, in execution order.
  std::span<const Stage> stages;
};
std::span<const MutationInfo> all_mutations();
const MutationInfo& mutation_info(Mutation m);

struct MutantOptions {
  Mutation mutation = Mutation::swiglu_gate_clamped_both_sides;
  std::optional<int> layer;  // the one layer mutated; every layer when empty
  bool with_bug = true;      // off: the same host recomputation, without the bug
};

class MutantBackend final : public ForwardingBackend {
 public:
  MutantBackend(std::unique_ptr<Backend> inner, const Model& model, MutantOptions options);

  std::string name() const override;
  nlohmann::json facts() const override;
  void begin_step(const Batch& batch) override;
  void run(Stage s, int layer) override;
  // A stage recomputed here has none of the inner backend's partial sums behind its rows.
  std::vector<StageData> partials(Stage s, int layer, int row) override;
  void reset() override;

 private:
  bool mutates(Stage s, int layer) const;
  // The stage's output row `row` recomputed on the host, with the bug unless options_ say not.
  StageData recompute(Stage s, int layer, int row);
  std::vector<float> input(Stage s, int layer, int row);
  void remember_keys(int layer);

  const Model& model_;
  const Config& c_;
  MutantOptions options_;
  Batch batch_;
  // The rotated keys the step's scores see, per sequence and layer: [pos][nKV d].
  std::map<int, std::map<int, std::vector<std::vector<float>>>> keys_;
};

}  // namespace parity::test
