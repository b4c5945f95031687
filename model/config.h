// gpt-oss model configuration: the fields of a Hugging Face config.json (hub layout with
// `rope_scaling` + top-level `rope_theta`, or transformers 5 `rope_parameters`), validated.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace parity {

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

  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int heads_per_kv() const { return num_attention_heads / num_key_value_heads; }
  bool sliding(int layer) const { return layer_is_sliding.at(size_t(layer)); }

  // Throws parity::Error naming `source` and the offending field.
  void validate(const std::string& source) const;
  // Canonical JSON (hub field names, rope as `rope_scaling`) for writing and for traces.
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j, const std::string& source);
  static Config load(const std::string& path);  // path to config.json
};

// YaRN tables derived from the config, in double: inverse frequency per rotary pair and the
// attention concentration (mscale). Mirrors gpt_oss/torch/model.py RotaryEmbedding.
struct Rope {
  std::vector<double> inv_freq;  // head_dim / 2
  double concentration = 1.0;
  static Rope from_config(const Config& c);
};

}  // namespace parity
