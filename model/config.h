// gpt-oss model configuration: the fields of a Hugging Face config.json (hub layout with
// `rope_scaling` + top-level `rope_theta`, or transformers 5 `rope_parameters`), validated.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace parity {

// What a gpt-oss-like model can be. A config.json is untrusted input: these bounds keep every
// size derived from it (q_dim, qkv_dim, tensor element counts and byte sizes, per-layer tables)
// far from overflow and refuse absurd dimensions before anything is allocated for them. Each
// bound is well above the real models (20b/120b in parentheses) so that nothing real, nor a
// scaled-up variant, is refused.
struct ConfigLimits {
  static constexpr int kMaxVocab = 1 << 24;         // (201088)
  static constexpr int kMaxHidden = 65536;          // (2880)
  static constexpr int kMaxLayers = 1024;           // (24 / 36)
  static constexpr int kMaxHeads = 1024;            // query and KV heads (64 / 8)
  static constexpr int kMaxHeadDim = 1024;          // (64)
  static constexpr int kMaxIntermediate = 1 << 18;  // per expert (2880)
  static constexpr int kMaxExperts = 4096;          // (32 / 128); per token: <= experts
  static constexpr int kMaxContext = 1 << 24;       // positions, windows, YaRN context (131072)
};
// q_dim() + 2 kv_dim() stays an int; tensor sizes ([V, H], [E, 2I, H]) are computed in int64
// and are at most 2^24 * 2^16 and 2^12 * 2^19 * 2^16 = 2^47 elements.
static_assert(int64_t(3) * ConfigLimits::kMaxHeads * ConfigLimits::kMaxHeadDim <
              std::numeric_limits<int>::max());
static_assert(int64_t(2) * ConfigLimits::kMaxIntermediate < std::numeric_limits<int>::max());

struct Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int num_local_experts = 0;
  int num_experts_per_tok = 0;
  int sliding_window = 0;
  std::vector<bool> layer_is_sliding;  // per layer, from layer_types (default: even layers)
  double rope_theta = 150000.0;
  // YaRN (rope_type "yarn"); factor 1 with no scaling section means plain RoPE.
  std::string rope_type = "yarn";
  double rope_factor = 32.0;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  int rope_original_max_position = 4096;
  bool rope_truncate = false;
  double rms_norm_eps = 1e-5;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;  // hard-coded in every implementation
  int max_position_embeddings = 131072;
  int initial_context_length = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = true;
  int eos_token_id = -1;
  int pad_token_id = -1;
  std::string quant_method;  // "mxfp4" or empty

  // In int range for every config validate() accepts (see ConfigLimits).
  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int heads_per_kv() const { return num_attention_heads / num_key_value_heads; }
  bool sliding(int layer) const { return layer_is_sliding.at(size_t(layer)); }

  // Throws parity::Error naming `source` and the offending field: dimensions within
  // ConfigLimits and consistent, every real parameter finite and in its domain, the YaRN ramp
  // inside the rotary pairs (Rope::yarn_ramp).
  void validate(const std::string& source) const;
  // Canonical JSON (hub field names, rope as `rope_scaling`) for writing and for traces.
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j, const std::string& source);
  // path to config.json: a regular file of at most kMaxFileBytes.
  static Config load(const std::string& path);
  static constexpr uint64_t kMaxFileBytes = uint64_t(16) << 20;  // a real one is ~2 KB
};

// YaRN tables derived from the config, in double: inverse frequency per rotary pair and the
// attention concentration (mscale). Mirrors gpt_oss/torch/model.py RotaryEmbedding.
struct Rope {
  std::vector<double> inv_freq;  // head_dim / 2
  double concentration = 1.0;
  // Throws parity::Error on a head_dim outside [2, kMaxHeadDim] or odd; otherwise computes what
  // the config says (validate() is what refuses a meaningless YaRN).
  static Rope from_config(const Config& c);

  // YaRN's ramp over the rotary pairs: pair i keeps its frequency below `low`, is divided by
  // the factor above `high`, and blends linearly between. These are the bounds as the official
  // reference computes them; with `truncate` the table uses floor(low) and ceil(high).
  struct YarnRamp {
    double low = 0, high = 0;
  };
  static YarnRamp yarn_ramp(const Config& c);
};

}  // namespace parity
