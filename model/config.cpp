#include "model/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <type_traits>

#include "model/error.h"

namespace parity {
namespace {

using nlohmann::json;

// JSON value -> T, strictly: nlohmann's get<int>() would silently truncate 2880.5, read true as
// 1 and wrap 2^32 + 64 to 64, so a dimension must be a JSON integer in int range; a real any
// number, a flag a boolean, a name a string.
template <typename T>
T convert(const json& v, const char* key, const std::string& src) {
  if constexpr (std::is_same_v<T, int>) {
    if (!v.is_number_integer())
      fail("{}: field \"{}\" has the wrong type ({} {}; expected an integer)", src, key,
           v.type_name(), v.dump());
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                              : v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                    v.get<int64_t>() <= std::numeric_limits<int>::max();
    if (!in_range) fail("{}: field \"{}\" is out of range ({})", src, key, v.dump());
    return v.get<int>();
  } else {
    static_assert(std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                  std::is_same_v<T, std::string>);
    const bool ok = std::is_same_v<T, double> ? v.is_number()
                    : std::is_same_v<T, bool> ? v.is_boolean()
                                              : v.is_string();
    if (!ok)
      fail("{}: field \"{}\" has the wrong type ({}; expected {})", src, key, v.type_name(),
           std::is_same_v<T, double> ? "a number"
           : std::is_same_v<T, bool> ? "a boolean"
                                     : "a string");
    return v.get<T>();
  }
}

template <typename T>
T get_required(const json& j, const char* key, const std::string& src) {
  if (!j.contains(key)) fail("{}: missing required field \"{}\"", src, key);
  return convert<T>(j.at(key), key, src);
}

template <typename T>
T get_or(const json& j, const char* key, T fallback, const std::string& src) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return convert<T>(j.at(key), key, src);
}

int first_id(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return -1;
  if (j[key].is_number_integer()) return j[key].get<int>();
  if (j[key].is_array() && !j[key].empty() && j[key][0].is_number_integer())
    return j[key][0].get<int>();
  return -1;
}

}  // namespace

Config Config::from_json(const json& j, const std::string& src) {
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", src);
  Config c;
  c.vocab_size = get_required<int>(j, "vocab_size", src);
  c.hidden_size = get_required<int>(j, "hidden_size", src);
  c.num_hidden_layers = get_required<int>(j, "num_hidden_layers", src);
  c.num_attention_heads = get_required<int>(j, "num_attention_heads", src);
  c.num_key_value_heads = get_required<int>(j, "num_key_value_heads", src);
  c.head_dim = get_or<int>(j, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0, src);
  c.intermediate_size = get_required<int>(j, "intermediate_size", src);
  if (j.contains("num_local_experts"))
    c.num_local_experts = get_required<int>(j, "num_local_experts", src);
  else
    c.num_local_experts = get_required<int>(j, "num_experts", src);
  if (j.contains("num_experts_per_tok"))
    c.num_experts_per_tok = get_required<int>(j, "num_experts_per_tok", src);
  else
    c.num_experts_per_tok = get_required<int>(j, "experts_per_token", src);
  c.sliding_window = get_required<int>(j, "sliding_window", src);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-5, src);
  c.swiglu_limit = get_or<double>(j, "swiglu_limit", 7.0, src);
  c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 131072, src);
  c.initial_context_length = get_or<int>(j, "initial_context_length", 4096, src);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, src);
  c.attention_bias = get_or<bool>(j, "attention_bias", true, src);
  c.eos_token_id = first_id(j, "eos_token_id");
  c.pad_token_id = first_id(j, "pad_token_id");
  if (j.contains("quantization_config") && j["quantization_config"].is_object())
    c.quant_method = get_or<std::string>(j["quantization_config"], "quant_method", "", src);

  // Layer types: explicit list, else the gpt-oss convention (even layers slide).
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    if (!j["layer_types"].is_array())
      fail("{}: field \"layer_types\" must be an array of strings", src);
    for (const auto& t : j["layer_types"]) {
      if (!t.is_string()) fail("{}: field \"layer_types\" must be an array of strings", src);
      const auto s = t.get<std::string>();
      if (s == "sliding_attention")
        c.layer_is_sliding.push_back(true);
      else if (s == "full_attention")
        c.layer_is_sliding.push_back(false);
      else
        fail("{}: layer_types has unknown entry \"{}\" (expected sliding_attention or full_attention)", src, s);
    }
  } else {
    for (int l = 0; l < c.num_hidden_layers; ++l) c.layer_is_sliding.push_back(l % 2 == 0);
  }

  // RoPE: hub `rope_scaling` + top-level `rope_theta`, or transformers 5 `rope_parameters`
  // holding rope_theta itself.
  c.rope_theta = get_or<double>(j, "rope_theta", 150000.0, src);
  const json* rope = nullptr;
  std::string rsrc = src;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    // null means no scaling; anything else but an object is malformed, not plain RoPE.
    if (j.contains(key) && !j.at(key).is_null() && !j.at(key).is_object())
      fail("{}: field \"{}\" must be an object, got {}", src, key, j.at(key).type_name());
    if (rope == nullptr && j.contains(key) && j.at(key).is_object()) {
      rope = &j.at(key);
      rsrc = src + " (" + key + ")";
    }
  }
  if (rope != nullptr) {
    c.rope_theta = get_or<double>(*rope, "rope_theta", c.rope_theta, rsrc);
    c.rope_type = get_or<std::string>(*rope, "rope_type", get_or<std::string>(*rope, "type", "yarn", rsrc), rsrc);
    c.rope_factor = get_or<double>(*rope, "factor", c.rope_type == "yarn" ? 32.0 : 1.0, rsrc);
    c.rope_beta_fast = get_or<double>(*rope, "beta_fast", 32.0, rsrc);
    c.rope_beta_slow = get_or<double>(*rope, "beta_slow", 1.0, rsrc);
    c.rope_original_max_position =
        get_or<int>(*rope, "original_max_position_embeddings", c.initial_context_length, rsrc);
    c.rope_truncate = get_or<bool>(*rope, "truncate", false, rsrc);
  } else {
    c.rope_type = "default";
    c.rope_factor = 1.0;
  }
  c.validate(src);
  return c;
}

void Config::validate(const std::string& src) const {
  auto positive = [&](int v, const char* name) {
    if (v <= 0) fail("{}: \"{}\" must be positive, got {}", src, name, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(intermediate_size, "intermediate_size");
  positive(num_local_experts, "num_local_experts");
  positive(num_experts_per_tok, "num_experts_per_tok");
  positive(sliding_window, "sliding_window");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_attention_heads % num_key_value_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", src,
         num_attention_heads, num_key_value_heads);
  if (head_dim % 2 != 0) fail("{}: head_dim must be even for RoPE, got {}", src, head_dim);
  if (num_experts_per_tok > num_local_experts)
    fail("{}: num_experts_per_tok ({}) exceeds num_local_experts ({})", src, num_experts_per_tok,
         num_local_experts);
  if (int(layer_is_sliding.size()) != num_hidden_layers)
    fail("{}: layer_types has {} entries but num_hidden_layers is {}", src,
         layer_is_sliding.size(), num_hidden_layers);
  if (!(rms_norm_eps > 0)) fail("{}: rms_norm_eps must be positive", src);
  if (!(swiglu_limit > 0)) fail("{}: swiglu_limit must be positive", src);
  if (!(rope_theta > 1)) fail("{}: rope_theta must be > 1, got {}", src, rope_theta);
  if (rope_type != "yarn" && rope_type != "default")
    fail("{}: rope type \"{}\" is not supported (gpt-oss uses \"yarn\")", src, rope_type);
  if (rope_type == "yarn") {
    if (!(rope_factor >= 1)) fail("{}: rope factor must be >= 1, got {}", src, rope_factor);
    if (rope_original_max_position <= 0)
      fail("{}: original_max_position_embeddings must be positive", src);
    if (!(rope_beta_fast > rope_beta_slow))
      fail("{}: YaRN needs beta_fast > beta_slow, got {} and {}", src, rope_beta_fast, rope_beta_slow);
  }
  if (tie_word_embeddings)
    fail("{}: tie_word_embeddings=true is not a gpt-oss checkpoint (lm_head is untied)", src);
}

nlohmann::json Config::to_json() const {
  json lt = json::array();
  for (bool s : layer_is_sliding) lt.push_back(s ? "sliding_attention" : "full_attention");
  json j = {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"intermediate_size", intermediate_size},
      {"num_local_experts", num_local_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"experts_per_token", num_experts_per_tok},
      {"sliding_window", sliding_window},
      {"layer_types", lt},
      {"rope_theta", rope_theta},
      {"rms_norm_eps", rms_norm_eps},
      {"swiglu_limit", swiglu_limit},
      {"max_position_embeddings", max_position_embeddings},
      {"initial_context_length", initial_context_length},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_bias", attention_bias},
      {"hidden_act", "silu"},
  };
  if (rope_type == "yarn")
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", rope_factor},
                         {"beta_fast", rope_beta_fast},
                         {"beta_slow", rope_beta_slow},
                         {"original_max_position_embeddings", rope_original_max_position},
                         {"truncate", rope_truncate}};
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  if (!quant_method.empty())
    j["quantization_config"] = {
        {"quant_method", quant_method},
        {"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
  return j;
}

Config Config::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open (does the model directory hold a config.json?)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  return from_json(j, path);
}

Rope Rope::from_config(const Config& c) {
  // gpt_oss/torch/model.py RotaryEmbedding._compute_concentration_and_inv_freq, in double.
  Rope r;
  const int half = c.head_dim / 2;
  const double d = c.head_dim;
  r.inv_freq.resize(size_t(half));
  if (c.rope_type != "yarn" || c.rope_factor <= 1.0) {
    for (int i = 0; i < half; ++i) r.inv_freq[size_t(i)] = 1.0 / std::pow(c.rope_theta, 2.0 * i / d);
    r.concentration = 1.0;
    return r;
  }
  const double two_pi = 2.0 * std::numbers::pi;
  const double ctx = c.rope_original_max_position;
  double low = d / 2.0 * std::log(ctx / (c.rope_beta_fast * two_pi)) / std::log(c.rope_theta);
  double high = d / 2.0 * std::log(ctx / (c.rope_beta_slow * two_pi)) / std::log(c.rope_theta);
  if (c.rope_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  r.concentration = 0.1 * std::log(c.rope_factor) + 1.0;
  for (int i = 0; i < half; ++i) {
    const double freq = std::pow(c.rope_theta, 2.0 * i / d);
    const double interpolation = 1.0 / (c.rope_factor * freq);
    const double extrapolation = 1.0 / freq;
    double ramp = (double(i) - low) / (high - low);
    ramp = std::clamp(ramp, 0.0, 1.0);
    const double mask = 1.0 - ramp;
    r.inv_freq[size_t(i)] = interpolation * (1.0 - mask) + extrapolation * mask;
  }
  return r;
}

}  // namespace parity
