// Precision policies: the JSON form, the presets, rounding to a storage format.
#include "model/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/error.h"

namespace parity {
namespace {

// The fields of a StagePrecision as the JSON form names them, with their ranges.
struct Field {
  const char* key;
  double StagePrecision::*member;
  double lo, hi;
};
constexpr std::array kFields = {
    Field{"storage_unit_roundoff", &StagePrecision::storage, 0, 0.5},
    Field{"accumulation_unit_roundoff", &StagePrecision::accumulation, 0, 0.5},
    Field{"intermediate_unit_roundoff", &StagePrecision::intermediate, 0, 0.5},
    Field{"operand_unit_roundoff", &StagePrecision::operand, 0, 0.5},
    Field{"bias_unit_roundoff", &StagePrecision::bias, 0, 0.5},
    Field{"function_ulps", &StagePrecision::function_ulps, 0, 1e6},
    Field{"storage_min_normal", &StagePrecision::min_normal, 0, 1},
};

constexpr std::array kNorms = {Stage::attn_norm, Stage::ffn_norm, Stage::final_norm};

StagePrecision format(double storage, double accumulation, double intermediate, double ulps,
                      double min_normal) {
  StagePrecision p;
  p.storage = storage;
  p.accumulation = accumulation;
  p.intermediate = intermediate;
  p.function_ulps = ulps;
  p.min_normal = min_normal;
  return p;
}

PrecisionPolicy named(std::string name, StagePrecision all) {
  PrecisionPolicy p;
  p.name = std::move(name);
  p.all = all;
  return p;
}

StagePrecision& own(PrecisionPolicy& p, Stage s) {
  auto& o = p.stages[size_t(s)];
  if (!o) o = p.all;
  return *o;
}

// transformers' GptOss in eager mode with every weight and activation in one dtype of unit roundoff
// `unit` (modeling_gpt_oss.py of transformers 5.17): each operation's result is a tensor of the
// dtype, but RMSNorm computes in float32 (`.to(torch.float32)`, one rounding at the end), the
// router's softmax accumulates in float32, the experts compute `x @ W` and then `+ b`, and the
// routed sum is index_add_ into a tensor of the dtype. In float64 the RMSNorm and the rotary
// tables still run in float32.
PrecisionPolicy transformers(std::string name, double unit, double min_normal) {
  const bool f64 = unit < kUnitFloat32;
  PrecisionPolicy p = named(std::move(name), f64 ? format(unit, unit, unit, 2, min_normal)
                                                 : format(unit, kUnitFloat32, unit, 4, min_normal));
  for (Stage s : kNorms) {
    StagePrecision& n = own(p, s);
    n.intermediate = kUnitFloat32;
    if (f64) {
      n.operand = kUnitFloat32;
      n.accumulation = kUnitFloat32;
      n.function_ulps = 4;
    }
  }
  own(p, Stage::topk_w).intermediate = kUnitFloat32;
  own(p, Stage::mlp1).bias = unit;
  own(p, Stage::mlp2).bias = unit;
  own(p, Stage::moe_out).accumulation = unit;
  if (f64)
    for (Stage s : {Stage::q_rope, Stage::k_rope}) {
      own(p, s).accumulation = kUnitFloat32;
      own(p, s).function_ulps = 4;
    }
  return p;
}

// vLLM-like engines: BF16 activations, W4A16 experts, FP32 accumulation in fused kernels; its
// RMSNorm rounds the normalized value to BF16 before the weight, its RoPE computes in BF16 on
// BF16 cos/sin tables.
PrecisionPolicy vllm_like() {
  PrecisionPolicy p = named("vllm-like", format(kUnitBfloat16, kUnitFloat32, kUnitFloat32, 4, 0x1p-126));
  for (Stage s : kNorms) own(p, s).intermediate = kUnitBfloat16;
  for (Stage s : {Stage::q_rope, Stage::k_rope}) own(p, s).intermediate = kUnitBfloat16;
  return p;
}

// Float32 activations whose products round their inputs once to BF16 for the tensor cores (the
// projections, the experts and lm_head, weights exact in BF16 or MXFP4; attention's q.k and its
// probabilities times v, both operands rounded), float32 accumulation: the `hip` backend's bf16
// precision (device/kernel_types.h), and any port that keeps float32 activations but feeds BF16
// operands to its GEMMs and its flash attention.
PrecisionPolicy bf16_operands() {
  PrecisionPolicy p = named("bf16-operands", format(kUnitFloat32, kUnitFloat32, kUnitFloat32, 4, 0x1p-126));
  for (Stage s : {Stage::qkv, Stage::scores, Stage::attn_out, Stage::o_proj, Stage::mlp1,
                  Stage::mlp2, Stage::logits})
    own(p, s).operand = kUnitBfloat16;
  return p;
}

std::vector<PrecisionPolicy> presets() {
  return {
      named("float64", format(kUnitFloat64, kUnitFloat64, kUnitFloat64, 2, 0x1p-1022)),
      named("float32", format(kUnitFloat32, kUnitFloat32, kUnitFloat32, 4, 0x1p-126)),
      named("bfloat16", format(kUnitBfloat16, kUnitFloat32, kUnitFloat32, 4, 0x1p-126)),
      named("float16", format(kUnitFloat16, kUnitFloat32, kUnitFloat32, 4, 0x1p-14)),
      vllm_like(),
      bf16_operands(),
      transformers("transformers-f64", kUnitFloat64, 0x1p-1022),
      transformers("transformers-f32", kUnitFloat32, 0x1p-126),
      transformers("transformers-bf16", kUnitBfloat16, 0x1p-126),
      transformers("transformers-f16", kUnitFloat16, 0x1p-14),
  };
}

nlohmann::json fields_json(const StagePrecision& p, const StagePrecision* base) {
  nlohmann::json j = nlohmann::json::object();
  for (const Field& f : kFields)
    if (base == nullptr || p.*f.member != base->*f.member) j[f.key] = p.*f.member;
  return j;
}

// Reads the fields of `j` into `p` (those present; `required` must all be).
void read_fields(const nlohmann::json& j, StagePrecision& p, bool required,
                 const std::string& where, const std::string& source) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const bool known = std::any_of(kFields.begin(), kFields.end(),
                                   [&](const Field& f) { return key == f.key; });
    if (!known && key != "name" && key != "stages")
      fail("{}: precision policy{} has an unknown field \"{}\"", source, where,
           key.substr(0, 60));
  }
  for (const Field& f : kFields) {
    if (!j.contains(f.key)) {
      if (required) fail("{}: precision policy{} lacks the number \"{}\"", source, where, f.key);
      continue;
    }
    if (!j[f.key].is_number())
      fail("{}: precision policy{} field \"{}\" is not a number", source, where, f.key);
    const double v = j[f.key].get<double>();
    if (!std::isfinite(v) || v < f.lo || v > f.hi)
      fail("{}: precision policy{} field \"{}\" is {}, outside [{}, {}]", source, where, f.key, v,
           f.lo, f.hi);
    p.*f.member = v;
  }
}

}  // namespace

std::string_view storage_format_name(double u) {
  if (u == kUnitFloat64) return "float64";
  if (u == kUnitFloat32) return "float32";
  if (u == kUnitFloat16) return "float16";
  if (u == kUnitBfloat16) return "bfloat16";
  return "";
}

double round_to_storage(double x, double u) {
  if (!std::isfinite(x) || x == 0) return x;
  int bits = 0;  // significand bits kept, the implicit one included
  if (u == kUnitFloat32) bits = 24;
  else if (u == kUnitFloat16) bits = 11;
  else if (u == kUnitBfloat16) bits = 8;
  else return x;
  // Exponent range: float32 and bfloat16 share float32's; float16 normals from 2^-14.
  const int min_exp = u == kUnitFloat16 ? -14 : -126;
  const double max_finite = u == kUnitFloat16 ? 65504.0 : double(std::numeric_limits<float>::max());
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, min_exp);  // subnormals keep the smallest exponent's spacing
  const double ulp = std::ldexp(1.0, exp - (bits - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // the default rounding mode: nearest, even
  return std::fabs(r) > max_finite ? x : r;
}

double PrecisionPolicy::coarsest_storage() const {
  double u = all.storage;
  for (const auto& s : stages)
    if (s) u = std::max(u, s->storage);
  return u;
}

nlohmann::json PrecisionPolicy::to_json() const {
  nlohmann::json j = fields_json(all, nullptr);
  if (!name.empty()) j["name"] = name;
  nlohmann::json own = nlohmann::json::object();
  for (const auto& si : kStages)
    if (const auto& s = stages[size_t(si.stage)]; s && *s != all)
      own[std::string(si.name)] = fields_json(*s, &all);
  if (!own.empty()) j["stages"] = own;
  return j;
}

PrecisionPolicy PrecisionPolicy::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: precision policy is not a JSON object", source);
  PrecisionPolicy p;
  if (j.contains("name")) {
    if (!j["name"].is_string()) fail("{}: precision policy \"name\" is not a string", source);
    p.name = j["name"].get<std::string>();
    if (p.name.size() > 64) fail("{}: precision policy \"name\" is longer than 64 bytes", source);
  }
  // The fields added with per-stage policies are optional, with the meaning traces had before.
  nlohmann::json base = j;
  base.erase("stages");
  if (!base.contains("intermediate_unit_roundoff") && base.contains("accumulation_unit_roundoff"))
    base["intermediate_unit_roundoff"] = base["accumulation_unit_roundoff"];
  if (!base.contains("operand_unit_roundoff")) base["operand_unit_roundoff"] = 0.0;
  if (!base.contains("bias_unit_roundoff")) base["bias_unit_roundoff"] = 0.0;
  read_fields(base, p.all, true, "", source);
  if (j.contains("stages")) {
    const nlohmann::json& st = j["stages"];
    if (!st.is_object()) fail("{}: precision policy \"stages\" is not a JSON object", source);
    for (const auto& [key, value] : st.items()) {
      const auto s = stage_from_name(key);
      if (!s)
        fail("{}: precision policy \"stages\" names \"{}\", which is not a stage", source,
             key.substr(0, 60));
      if (!value.is_object())
        fail("{}: precision policy of stage {} is not a JSON object", source, key);
      StagePrecision sp = p.all;
      read_fields(value, sp, false, " of stage " + key, source);
      if (value.contains("name") || value.contains("stages"))
        fail("{}: precision policy of stage {} holds \"name\" or \"stages\"", source, key);
      p.stages[size_t(*s)] = sp;
    }
  }
  return p;
}

PrecisionPolicy PrecisionPolicy::preset(std::string_view name) {
  for (PrecisionPolicy& p : presets())
    if (p.name == name) return p;
  fail("precision {} is not a preset ({})", name.substr(0, 60), fmt::join(preset_names(), ", "));
}

std::vector<std::string_view> PrecisionPolicy::preset_names() {
  return {"float64", "float32", "bfloat16", "float16", "vllm-like", "bf16-operands",
          "transformers-f64", "transformers-f32", "transformers-bf16", "transformers-f16"};
}

PrecisionPolicy PrecisionPolicy::float32(double function_ulps) {
  PrecisionPolicy p = named("float32", format(kUnitFloat32, kUnitFloat32, kUnitFloat32, function_ulps, 0x1p-126));
  if (function_ulps != 4) p.name.clear();
  return p;
}

PrecisionPolicy PrecisionPolicy::float64() { return preset("float64"); }

std::string PrecisionPolicy::describe() const {
  auto unit = [](double u) {
    const std::string_view f = storage_format_name(u);
    return f.empty() ? fmt::format("{:.3g}", u) : std::string(f);
  };
  size_t own = 0;
  for (const auto& s : stages) own += s && *s != all;
  std::string text = fmt::format("storage {}, accumulation {}, intermediates {}", unit(all.storage),
                                 unit(all.accumulation), unit(all.intermediate));
  if (all.operand > all.storage) text += fmt::format(", operands {}", unit(all.operand));
  if (own > 0) text += fmt::format("; {} stage{} of its own", own, own == 1 ? "" : "s");
  return name.empty() ? text : fmt::format("{} ({})", name, text);
}

}  // namespace parity
