// The stage list of the gpt-oss forward pass, written once. Everything that names a stage
// (the graph, both backends, the tracer, the differ, the error bounds, the reports, fault
// injection, replay) reads it from here. Order is execution order within a layer; the graph
// (model/forward.cpp) runs the model-scope stages around the layers.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace parity {

enum class Scope { Model, Layer, Expert };
enum class ValueKind { Real, Index };

// Shape rules, per token row (the graph traces one row per position):
//   hidden: [H]   qkv: [(nH + 2 nKV) d]   q: [nH, d]   kv: [nKV, d]
//   keys: [nH, n_keys + 1] (the last column is the sink; n_keys = pos + 1, masked = -inf)
//   head_out: [nH d]   experts: [E]   topk: [k]   mlp1: [k, 2 I]   inter: [k, I]
//   expert_hidden: [k, H]   vocab: [V]   token: [1]
enum class Shape {
  hidden, qkv, q, kv, keys, head_out, experts, topk, mlp1, inter, expert_hidden, vocab, token
};

// What a stage reads, as data: the graph's replay, the error bounds and the reports use it.
//   stage     another stage's output of this position, at the same layer; for a model-scope
//             stage reading a per-layer stage, at the last layer
//   residual  the residual stream entering the layer: the embedding at layer 0, else the
//             previous layer's resid_ffn (residual_input() below is that rule, written once)
//   append    this step's row of a stage that this stage appends to the layer's KV cache
//   kv_cache  the layer's KV cache: the k_rope and v rows of every earlier position
//   token     the token id of the row
enum class InputKind { stage, residual, append, kv_cache, token };

enum class Stage : int;
struct StageInput {
  InputKind kind;
  Stage stage;  // for stage and append; the residual's stage is residual_input(layer)
};

// X(name, scope, shape, kind, inputs...). Inputs are written with the IN_* words defined where
// the input tables are generated below.
#define PARITY_STAGES(X)                                                                       \
  X(embedding, Model, hidden, Real, IN_TOKEN)                                                  \
  X(attn_norm, Layer, hidden, Real, IN_RESIDUAL)                                               \
  X(qkv, Layer, qkv, Real, IN(attn_norm))                                                      \
  X(q_rope, Layer, q, Real, IN(qkv))                                                           \
  X(k_rope, Layer, kv, Real, IN(qkv))                                                          \
  X(v, Layer, kv, Real, IN(qkv))                                                               \
  X(scores, Layer, keys, Real, IN(q_rope), IN_APPEND(k_rope), IN_APPEND(v), IN_KV_CACHE)       \
  X(att, Layer, keys, Real, IN(scores))                                                        \
  X(attn_out, Layer, head_out, Real, IN(att), IN_KV_CACHE)                                     \
  X(o_proj, Layer, hidden, Real, IN(attn_out))                                                 \
  X(resid_attn, Layer, hidden, Real, IN_RESIDUAL, IN(o_proj))                                  \
  X(ffn_norm, Layer, hidden, Real, IN(resid_attn))                                             \
  X(router, Layer, experts, Real, IN(ffn_norm))                                                \
  X(topk_idx, Layer, topk, Index, IN(router))                                                  \
  X(topk_w, Layer, topk, Real, IN(router), IN(topk_idx))                                       \
  X(mlp1, Expert, mlp1, Real, IN(ffn_norm), IN(topk_idx))                                      \
  X(swiglu, Expert, inter, Real, IN(mlp1))                                                     \
  X(mlp2, Expert, expert_hidden, Real, IN(swiglu), IN(topk_idx))                               \
  X(moe_out, Layer, hidden, Real, IN(topk_w), IN(mlp2))                                        \
  X(resid_ffn, Layer, hidden, Real, IN(resid_attn), IN(moe_out))                               \
  X(final_norm, Model, hidden, Real, IN(resid_ffn))                                            \
  X(logits, Model, vocab, Real, IN(final_norm))                                                \
  X(sampled, Model, token, Index, IN(logits))

enum class Stage : int {
#define PARITY_STAGE_ENUM(name, ...) name,
  PARITY_STAGES(PARITY_STAGE_ENUM)
#undef PARITY_STAGE_ENUM
};

namespace stage_inputs {
#define IN(s) StageInput{InputKind::stage, Stage::s}
#define IN_APPEND(s) StageInput{InputKind::append, Stage::s}
#define IN_RESIDUAL StageInput{InputKind::residual, Stage::embedding}
#define IN_KV_CACHE StageInput{InputKind::kv_cache, Stage::embedding}
#define IN_TOKEN StageInput{InputKind::token, Stage::embedding}
#define PARITY_STAGE_INPUTS(name, scope, shape, kind, ...) \
  inline constexpr StageInput name[] = {__VA_ARGS__};
PARITY_STAGES(PARITY_STAGE_INPUTS)
#undef PARITY_STAGE_INPUTS
#undef IN
#undef IN_APPEND
#undef IN_RESIDUAL
#undef IN_KV_CACHE
#undef IN_TOKEN
}  // namespace stage_inputs

struct StageInfo {
  Stage stage;
  std::string_view name;
  Scope scope;
  Shape shape;
  ValueKind kind;
  std::span<const StageInput> inputs;
};

inline constexpr std::array kStages = {
#define PARITY_STAGE_INFO(name, scope, shape, kind, ...)                                        \
  StageInfo{Stage::name, #name, Scope::scope, Shape::shape, ValueKind::kind, stage_inputs::name},
    PARITY_STAGES(PARITY_STAGE_INFO)
#undef PARITY_STAGE_INFO
};
inline constexpr int kNumStages = static_cast<int>(kStages.size());

constexpr const StageInfo& info(Stage s) { return kStages[static_cast<int>(s)]; }
constexpr std::string_view name(Stage s) { return info(s).name; }
constexpr bool is_model_scope(Stage s) { return info(s).scope == Scope::Model; }
constexpr bool is_per_expert(Stage s) { return info(s).scope == Scope::Expert; }
constexpr bool is_decision(Stage s) { return info(s).kind == ValueKind::Index; }

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

// One stage output of one position: the stage and the layer it ran at (kModelLayer at model
// scope).
struct StageRef {
  Stage stage = Stage::embedding;
  int layer = kModelLayer;
  friend bool operator==(const StageRef&, const StageRef&) = default;
};

// The residual stream entering `layer`: the embedding at layer 0, else resid_ffn of layer - 1.
constexpr StageRef residual_input(int layer) {
  return layer == 0 ? StageRef{Stage::embedding, kModelLayer}
                    : StageRef{Stage::resid_ffn, layer - 1};
}

// The stage output an input of (stage, layer) reads, for inputs of kind stage, append and
// residual; nullopt for kv_cache and token. `num_layers` resolves a model-scope stage's read
// of a per-layer stage (final_norm reads the last layer's resid_ffn).
constexpr std::optional<StageRef> resolve_input(const StageInput& in, int layer, int num_layers) {
  switch (in.kind) {
    case InputKind::residual:
      return residual_input(layer);
    case InputKind::stage:
    case InputKind::append:
      if (is_model_scope(in.stage)) return StageRef{in.stage, kModelLayer};
      return StageRef{in.stage, layer == kModelLayer ? num_layers - 1 : layer};
    case InputKind::kv_cache:
    case InputKind::token:
      return std::nullopt;
  }
  return std::nullopt;
}

// The input of a stage that reads another given stage, if any (e.g. the router of topk_w).
constexpr bool reads(Stage consumer, Stage producer) {
  for (const auto& in : info(consumer).inputs)
    if ((in.kind == InputKind::stage || in.kind == InputKind::append) && in.stage == producer)
      return true;
  return false;
}

}  // namespace parity
