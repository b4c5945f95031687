#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>

#include "model/error.h"
#include "model/untrusted.h"

namespace parity {
namespace {

using nlohmann::json;
using L = ConfigLimits;


// JSON value -> T, strictly: nlohmann's get<int>() would silently truncate 2880.5, read true as
// 1 and wrap 2^32 + 64 to 64, so a dimension must be a JSON integer in int range; a real any
// number, a flag a boolean, a name a string.
template <typename T>
T convert(const json& v, const char* key, const std::string& src) {
  if constexpr (std::is_same_v<T, int>) {
    if (!v.is_number_integer())
      fail("{}: field \"{}\" has the wrong type ({} {}; expected an integer)", src, key,
           v.type_name(), json_excerpt(v));
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                              : v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                    v.get<int64_t>() <= std::numeric_limits<int>::max();
    if (!in_range) fail("{}: field \"{}\" is out of range ({})", src, key, json_excerpt(v));
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

// A required integer that configs spell two ways (transformers' name and gpt-oss's own): either
// name, or both when they agree; two different values is an error, not a silent pick.
int get_aliased_int(const json& j, const char* key, const char* alias, const std::string& src) {
  if (!j.contains(key)) return get_required<int>(j, alias, src);
  const int value = get_required<int>(j, key, src);
  if (j.contains(alias)) {
    const int other = get_required<int>(j, alias, src);
    if (other != value)
      fail("{}: \"{}\" is {} but \"{}\" (the same field by another name) is {}", src, key, value,
           alias, other);
  }
  return value;
}

// eos/pad: an id, a list of ids (the first counts) or null. Nothing downstream needs them, so a
// value of another type, or a negative id, reads as "none" (-1), as before; an integer must
// still fit an int rather than wrap.
int first_id(const json& j, const char* key, const std::string& src) {
  if (!j.contains(key)) return -1;
  const json* v = &j.at(key);
  if (v->is_array()) {
    if (v->empty()) return -1;
    v = &v->front();
  }
  if (!v->is_number_integer()) return -1;
  return std::max(convert<int>(*v, key, src), -1);
}

// 1 <= v <= max, named; shared by from_json (before a loop runs num_hidden_layers times) and
// validate.
void require_dim(int v, const char* name, int max, const std::string& src) {
  if (v <= 0) fail("{}: \"{}\" must be positive, got {}", src, name, v);
  if (v > max)
    fail("{}: \"{}\" is {}, more than a gpt-oss-like model has (at most {})", src, name, v, max);
}

// A real parameter that must be finite and above `floor` (strictly, or at least when
// `inclusive`): NaN fails every comparison, so the test is written to refuse it.
void require_real(double v, const char* name, double floor, bool inclusive,
                  const std::string& src) {
  const bool ok = std::isfinite(v) && (inclusive ? v >= floor : v > floor);
  if (!ok)
    fail("{}: \"{}\" must be a finite number {} {}, got {}", src, name, inclusive ? ">=" : ">",
         floor, v);
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
  c.head_dim = get_or<int>(
      j, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0, src);
  c.intermediate_size = get_required<int>(j, "intermediate_size", src);
  c.num_local_experts = get_aliased_int(j, "num_local_experts", "num_experts", src);
  c.num_experts_per_tok = get_aliased_int(j, "num_experts_per_tok", "experts_per_token", src);
  c.sliding_window = get_required<int>(j, "sliding_window", src);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-5, src);
  c.swiglu_limit = get_or<double>(j, "swiglu_limit", 7.0, src);
  c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 131072, src);
  c.initial_context_length = get_or<int>(j, "initial_context_length", 4096, src);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, src);
  c.attention_bias = get_or<bool>(j, "attention_bias", true, src);
  c.eos_token_id = first_id(j, "eos_token_id", src);
  c.pad_token_id = first_id(j, "pad_token_id", src);
  if (j.contains("quantization_config") && j.at("quantization_config").is_object())
    c.quant_method = get_or<std::string>(j.at("quantization_config"), "quant_method", "",
                                         src + " (quantization_config)");

  // Layer types: explicit list, else the gpt-oss convention (even layers slide). The layer
  // count is bounded first: the default list is built num_hidden_layers long, and 2^31 - 1
  // entries would take seconds and hundreds of MB before validate() could refuse them.
  require_dim(c.num_hidden_layers, "num_hidden_layers", L::kMaxLayers, src);
  if (j.contains("layer_types") && !j.at("layer_types").is_null()) {
    const json& types = j.at("layer_types");
    if (!types.is_array()) fail("{}: field \"layer_types\" must be an array of strings", src);
    if (types.size() > size_t(L::kMaxLayers))
      fail("{}: layer_types has {} entries, more than a gpt-oss-like model has (at most {})", src,
           types.size(), L::kMaxLayers);
    for (const auto& t : types) {
      if (!t.is_string()) fail("{}: field \"layer_types\" must be an array of strings", src);
      const auto& s = t.get_ref<const std::string&>();
      if (s == "sliding_attention")
        c.layer_is_sliding.push_back(true);
      else if (s == "full_attention")
        c.layer_is_sliding.push_back(false);
      else
        fail("{}: layer_types has unknown entry {} (expected sliding_attention or full_attention)",
             src, quoted(s, 40));
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
  require_dim(vocab_size, "vocab_size", L::kMaxVocab, src);
  require_dim(hidden_size, "hidden_size", L::kMaxHidden, src);
  require_dim(num_hidden_layers, "num_hidden_layers", L::kMaxLayers, src);
  require_dim(num_attention_heads, "num_attention_heads", L::kMaxHeads, src);
  require_dim(num_key_value_heads, "num_key_value_heads", L::kMaxHeads, src);
  require_dim(head_dim, "head_dim", L::kMaxHeadDim, src);
  require_dim(intermediate_size, "intermediate_size", L::kMaxIntermediate, src);
  require_dim(num_local_experts, "num_local_experts", L::kMaxExperts, src);
  require_dim(num_experts_per_tok, "num_experts_per_tok", L::kMaxExperts, src);
  require_dim(max_position_embeddings, "max_position_embeddings", L::kMaxContext, src);
  require_dim(sliding_window, "sliding_window", L::kMaxContext, src);
  require_dim(initial_context_length, "initial_context_length", L::kMaxContext, src);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", src,
         num_attention_heads, num_key_value_heads);
  if (head_dim % 2 != 0) fail("{}: head_dim must be even for RoPE, got {}", src, head_dim);
  if (num_experts_per_tok > num_local_experts)
    fail("{}: num_experts_per_tok ({}) exceeds num_local_experts ({})", src, num_experts_per_tok,
         num_local_experts);
  // A window longer than the context is no window; gpt-oss has 128 of 131072.
  if (sliding_window > max_position_embeddings)
    fail("{}: sliding_window ({}) exceeds max_position_embeddings ({})", src, sliding_window,
         max_position_embeddings);
  if (layer_is_sliding.size() != size_t(num_hidden_layers))
    fail("{}: layer_types has {} entries but num_hidden_layers is {}", src,
         layer_is_sliding.size(), num_hidden_layers);
  require_real(rms_norm_eps, "rms_norm_eps", 0, false, src);
  require_real(swiglu_limit, "swiglu_limit", 0, false, src);
  require_real(swiglu_alpha, "swiglu_alpha", 0, false, src);
  // theta <= 1 makes every inverse frequency >= 1 and the YaRN bounds' log(theta) <= 0.
  require_real(rope_theta, "rope_theta", 1, false, src);
  if (rope_type != "yarn" && rope_type != "default")
    fail("{}: rope type {} is not supported (gpt-oss uses \"yarn\")", src, quoted(rope_type, 40));
  require_real(rope_factor, "factor", 0, false, src);
  if (rope_type == "yarn") {
    require_real(rope_factor, "factor", 1, true, src);
    require_dim(rope_original_max_position, "original_max_position_embeddings", L::kMaxContext,
                src);
    // Both betas are rotation counts: log(ctx / (beta 2 pi)) needs them positive.
    require_real(rope_beta_slow, "beta_slow", 0, false, src);
    require_real(rope_beta_fast, "beta_fast", 0, false, src);
    if (!(rope_beta_fast > rope_beta_slow))
      fail("{}: YaRN needs beta_fast > beta_slow, got {} and {}", src, rope_beta_fast, rope_beta_slow);
    // Factor 1 is plain RoPE (Rope::from_config, and the official reference) and has no ramp.
    if (rope_factor > 1) {
      // gpt_oss/torch/model.py asserts 0 < low < high < d/2 - 1 (on the bounds before any
      // truncation; it has none) and transformers clamps the bounds, truncated or not, to
      // [0, d - 1]; where either applies, the implementations compute different tables (or
      // none), so a parity comparison against them means nothing. low > 0 and low < high are
      // the official reference's bounds. The upper one is transformers' d - 1: the official
      // d/2 - 1 would refuse the 2-pair head (head_dim 4) that the unit-test configs use with
      // the gpt-oss YaRN parameters (high 1.09), where transformers and this code still compute
      // the same table. The real models are far inside both (20b: 8.09 and 17.40 of 31).
      const Rope::YarnRamp r = Rope::yarn_ramp(*this);
      const double used_high = rope_truncate ? std::ceil(r.high) : r.high;
      if (!(r.low > 0 && r.low < r.high && used_high <= head_dim - 1))
        fail("{}: YaRN ramp [{:.4g}, {:.4g}] lies outside the rotary pairs (0, {}] of head_dim {}; "
             "check rope_theta, beta_fast, beta_slow and original_max_position_embeddings",
             src, r.low, r.high, head_dim - 1, head_dim);
    }
  }
  if (tie_word_embeddings)
    fail("{}: tie_word_embeddings=true is not a gpt-oss checkpoint (lm_head is untied)", src);
  // The weights' encoding: MXFP4 experts or none (dense). Another method (fp8, awq, ...) stores
  // tensors this loader would misread.
  if (!quant_method.empty() && quant_method != "mxfp4")
    fail("{}: quantization_config.quant_method {} is not supported (gpt-oss uses \"mxfp4\")", src,
         quoted(quant_method, 40));
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
  // A FIFO or a device (/dev/zero) would block or read forever; read_small_file refuses them,
  // and a file larger than any config.
  const std::string text = read_small_file(path, kMaxFileBytes, "config");
  return from_json(parse_json(text, path), path);
}

Rope::YarnRamp Rope::yarn_ramp(const Config& c) {
  // gpt_oss/torch/model.py RotaryEmbedding._compute_concentration_and_inv_freq: the pair index
  // at which a rotation count of beta_fast (low) or beta_slow (high) fits the original context.
  const double two_pi = 2.0 * std::numbers::pi;
  const double half = c.head_dim / 2.0;
  const double ctx = c.rope_original_max_position;
  YarnRamp r;
  r.low = half * std::log(ctx / (c.rope_beta_fast * two_pi)) / std::log(c.rope_theta);
  r.high = half * std::log(ctx / (c.rope_beta_slow * two_pi)) / std::log(c.rope_theta);
  return r;
}

Rope Rope::from_config(const Config& c) {
  // Callers pass validated configs, and tests default-built ones; a head_dim that is not one
  // would make the table's size absurd (a negative half becomes a huge size_t).
  if (c.head_dim < 2 || c.head_dim > ConfigLimits::kMaxHeadDim || c.head_dim % 2 != 0)
    fail("RoPE: head_dim {} is not an even number in [2, {}]", c.head_dim,
         ConfigLimits::kMaxHeadDim);
  Rope r;
  const int half = c.head_dim / 2;
  const double d = c.head_dim;
  r.inv_freq.resize(size_t(half));
  if (c.rope_type != "yarn" || c.rope_factor <= 1.0) {
    for (int i = 0; i < half; ++i) r.inv_freq[size_t(i)] = 1.0 / std::pow(c.rope_theta, 2.0 * i / d);
    r.concentration = 1.0;
    return r;
  }
  const YarnRamp bounds = yarn_ramp(c);
  // truncate: transformers' floor/ceil of the bounds (spec section 6, pitfall 4).
  const double low = c.rope_truncate ? std::floor(bounds.low) : bounds.low;
  const double high = c.rope_truncate ? std::ceil(bounds.high) : bounds.high;
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
