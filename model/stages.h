// The stage list of the gpt-oss forward pass, written once. Everything that names a stage
// (the graph, both backends, the tracer, the differ, the reports, fault injection) reads it
// from here. Order is execution order within a position.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace parity {

enum class Scope { Model, Layer, Expert };
enum class ValueKind { Real, Index };

// Shape rules, per token row (the graph traces one row per position):
//   hidden: [H]   qkv: [(nH + 2 nKV) d]   q: [nH, d]   kv: [nKV, d]
//   keys: [nH, n_keys + 1] (the last column is the sink; n_keys = pos + 1, masked = -inf)
//   head_out: [nH d]   experts: [E]   topk: [k]   mlp1: [k, 2 I]   inter: [k, I]
//   expert_hidden: [k, H]   vocab: [V]
enum class Shape { hidden, qkv, q, kv, keys, head_out, experts, topk, mlp1, inter, expert_hidden, vocab };

// X(name, scope, shape, kind, inputs) -- inputs as a string for documentation and reports.
#define PARITY_STAGES(X)                                                                   \
  X(embedding, Model, hidden, Real, "token")                                              \
  X(attn_norm, Layer, hidden, Real, "resid_ffn[L-1] | embedding")                         \
  X(qkv, Layer, qkv, Real, "attn_norm")                                                   \
  X(q_rope, Layer, q, Real, "qkv")                                                        \
  X(k_rope, Layer, kv, Real, "qkv")                                                       \
  X(v, Layer, kv, Real, "qkv")                                                            \
  X(scores, Layer, keys, Real, "q_rope, k_rope (cache), sinks")                           \
  X(att, Layer, keys, Real, "scores")                                                     \
  X(attn_out, Layer, head_out, Real, "att, v (cache)")                                    \
  X(o_proj, Layer, hidden, Real, "attn_out")                                              \
  X(resid_attn, Layer, hidden, Real, "o_proj, residual")                                  \
  X(ffn_norm, Layer, hidden, Real, "resid_attn")                                          \
  X(router, Layer, experts, Real, "ffn_norm")                                             \
  X(topk_idx, Layer, topk, Index, "router")                                               \
  X(topk_w, Layer, topk, Real, "router, topk_idx")                                        \
  X(mlp1, Expert, mlp1, Real, "ffn_norm, topk_idx")                                       \
  X(swiglu, Expert, inter, Real, "mlp1")                                                  \
  X(mlp2, Expert, expert_hidden, Real, "swiglu")                                          \
  X(moe_out, Layer, hidden, Real, "mlp2, topk_w")                                         \
  X(resid_ffn, Layer, hidden, Real, "moe_out, resid_attn")                                \
  X(final_norm, Model, hidden, Real, "resid_ffn[last]")                                   \
  X(logits, Model, vocab, Real, "final_norm")

enum class Stage : int {
#define PARITY_STAGE_ENUM(name, scope, shape, kind, inputs) name,
  PARITY_STAGES(PARITY_STAGE_ENUM)
#undef PARITY_STAGE_ENUM
};

struct StageInfo {
  Stage stage;
  std::string_view name;
  Scope scope;
  Shape shape;
  ValueKind kind;
  std::string_view inputs;
};

inline constexpr std::array kStages = {
#define PARITY_STAGE_INFO(name, scope, shape, kind, inputs) \
  StageInfo{Stage::name, #name, Scope::scope, Shape::shape, ValueKind::kind, inputs},
    PARITY_STAGES(PARITY_STAGE_INFO)
#undef PARITY_STAGE_INFO
};
inline constexpr int kNumStages = static_cast<int>(kStages.size());

constexpr const StageInfo& info(Stage s) { return kStages[static_cast<int>(s)]; }
constexpr std::string_view name(Stage s) { return info(s).name; }
constexpr bool is_model_scope(Stage s) { return info(s).scope == Scope::Model; }
constexpr bool is_per_expert(Stage s) { return info(s).scope == Scope::Expert; }

inline std::optional<Stage> stage_from_name(std::string_view n) {
  for (const auto& s : kStages)
    if (s.name == n) return s.stage;
  return std::nullopt;
}

constexpr std::string_view scope_name(Scope s) {
  return s == Scope::Model ? "model" : s == Scope::Layer ? "layer" : "expert";
}

// Layer index used for model-scope stages.
inline constexpr int kModelLayer = -1;

}  // namespace parity
