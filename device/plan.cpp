#include "device/plan.h"

#include <algorithm>
#include <cstdlib>

#include "model/error.h"

namespace parity::device {

namespace {
int parse_positive(const char* env, const char* name) {
  const std::string s = env;
  try {
    size_t used = 0;
    const long v = std::stol(s, &used);
    if (used == s.size() && v > 0 && v <= (1l << 30)) return int(v);
  } catch (const std::exception&) {
  }
  fail("{}=\"{}\": expected a positive integer", name, s);
}
}  // namespace

int resolve_max_context(const Config& c, const char* env) {
  if (env == nullptr || *env == 0) return std::min(kDefaultMaxContext, c.max_position_embeddings);
  const int v = parse_positive(env, "PARITY_DEVICE_MAX_CONTEXT");
  if (v > c.max_position_embeddings)
    fail("PARITY_DEVICE_MAX_CONTEXT={} exceeds the model's context of {} positions", v,
         c.max_position_embeddings);
  return v;
}

int resolve_initial_rows(const char* env) {
  if (env == nullptr || *env == 0) return kDefaultRows;
  return parse_positive(env, "PARITY_DEVICE_ROWS");
}

WeightType weight_type_of(const TensorView& t) {
  switch (t.dtype) {
    case DType::BF16:
      return WeightType::bf16;
    case DType::F16:
      return WeightType::f16;
    case DType::F32:
      return WeightType::f32;
    default:
      break;
  }
  fail("{}: tensor \"{}\" has dtype {}; the device keeps BF16, F16 or F32 weights", t.file, t.name,
       dtype_name(t.dtype));
}

const WeightEntry& WeightPlan::find(const TensorView* t) const {
  for (const auto& e : entries)
    if (e.tensor == t) return e;
  fail("device weight plan: tensor \"{}\" was not placed", t != nullptr ? t->name : "(null)");
}

WeightPlan plan_weights(const Model& m) {
  WeightPlan p;
  auto place = [&](const TensorView* t, bool to_f32, const std::string& kind) {
    if (t == nullptr) return;
    for (const auto& e : p.entries)
      if (e.tensor == t) return;  // placed once
    WeightEntry e;
    e.tensor = t;
    e.to_f32 = to_f32;
    e.bytes = to_f32 ? size_t(t->numel()) * sizeof(float) : t->nbytes;
    if (to_f32 && !(t->dtype == DType::BF16 || t->dtype == DType::F16 || t->dtype == DType::F32))
      weight_type_of(*t);  // throws with the tensor's name
    e.offset = p.total;
    p.total += (e.bytes + 255) / 256 * 256;
    p.bytes_by_kind[kind] += e.bytes;
    p.entries.push_back(e);
  };
  auto raw = [&](const TensorView* t) {
    if (t == nullptr) return;
    weight_type_of(*t);
    place(t, false, std::string(dtype_name(t->dtype)));
  };
  auto vec = [&](const TensorView* t) {
    if (t != nullptr)
      place(t, true, fmt::format("F32 (biases, sinks; from {})", dtype_name(t->dtype)));
  };
  auto linear = [&](const Linear& l) {
    raw(l.weight);
    vec(l.bias);
  };
  auto experts = [&](const ExpertLinear& w) {
    if (w.layout == ExpertLayout::Mxfp4) {
      place(w.blocks, false, "U8 (MXFP4 blocks + scales)");
      place(w.scales, false, "U8 (MXFP4 blocks + scales)");
    } else {
      raw(w.dense);
    }
    vec(w.bias);
  };
  raw(m.embed);
  for (const auto& l : m.layers) {
    raw(l.attn_norm);
    linear(l.q);
    linear(l.k);
    linear(l.v);
    linear(l.o);
    vec(l.sinks);
    raw(l.ffn_norm);
    linear(l.router);
    experts(l.mlp1);
    experts(l.mlp2);
  }
  raw(m.final_norm);
  linear(m.lm_head);
  return p;
}

size_t stage_row_floats(const Config& c, Stage s) {
  PARITY_CHECK(info(s).shape != Shape::keys, "stage {} has rows that grow with the position",
               name(s));
  size_t n = 1;
  for (size_t d : stage_dims(c, s, 0)) n *= d;
  return n;
}

int64_t pack_scores(const Config& c, std::span<const int32_t> positions,
                    std::vector<int64_t>& offsets) {
  offsets.resize(positions.size());
  int64_t at = 0;
  for (size_t r = 0; r < positions.size(); ++r) {
    offsets[r] = at;
    at += int64_t(c.num_attention_heads) * (int64_t(positions[r]) + 2);
  }
  return at;
}

size_t kv_cache_bytes(const Config& c, int max_context) {
  return 2 * size_t(c.num_hidden_layers) * size_t(max_context) * size_t(c.kv_dim()) * sizeof(float);
}

size_t activation_bytes(const Config& c, int rows, int max_context) {
  size_t floats = 0;
  for (const auto& s : kStages)
    if (s.shape != Shape::keys) floats += stage_row_floats(c, s.stage);
  floats *= size_t(rows);
  AttentionShape a;
  a.n_heads = c.num_attention_heads;
  a.n_kv = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.max_context = max_context;
  floats += attention_workspace_floats(a, rows);
  return floats * sizeof(float);
}

std::string format_bytes(size_t b) {
  const double x = double(b);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return fmt::format("{:.1f} KiB", x / 1024.0);
  return fmt::format("{} B", b);
}

void SequenceTable::begin(const Batch& b, const Config& c, int max_context) {
  const auto steps = check_batch(b, c, max_context, [&](int seq) { return length(seq); });
  for (const auto& [seq, step] : steps) length_[seq] = step.end;
}

int SequenceTable::length(int seq) const {
  auto it = length_.find(seq);
  return it == length_.end() ? 0 : it->second;
}

}  // namespace parity::device
