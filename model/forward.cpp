#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/error.h"

namespace parity {

std::map<int, SequenceStep> check_batch(const Batch& b, const Config& c, int max_positions,
                                        const std::function<int(int)>& cached_length) {
  if (b.positions.size() != b.tokens.size() || b.seqs.size() != b.tokens.size())
    fail("batch: tokens, positions and seqs differ in length");
  if (b.rows() == 0) fail("batch: no tokens");
  std::map<int, SequenceStep> steps;
  for (int r = 0; r < b.rows(); ++r) {
    const int tok = b.tokens[size_t(r)], pos = b.positions[size_t(r)], seq = b.seqs[size_t(r)];
    if (tok < 0 || tok >= c.vocab_size)
      fail("token id {} out of range: the model's vocabulary has {} entries (0..{})", tok,
           c.vocab_size, c.vocab_size - 1);
    if (pos < 0 || pos >= c.max_position_embeddings)
      fail("position {} out of range: the model's context is {} positions (0..{})", pos,
           c.max_position_embeddings, c.max_position_embeddings - 1);
    if (pos >= max_positions)
      fail(
          "position {} is past the device KV cache of {} positions (HINT: set "
          "PARITY_DEVICE_MAX_CONTEXT, up to the model's {})",
          pos, max_positions, c.max_position_embeddings);
    auto it = steps.find(seq);
    if (it == steps.end()) {
      const int cached = cached_length(seq);
      if (pos > cached)
        fail(
            "sequence {}: position {} does not follow position {} (positions must be "
            "contiguous from 0)",
            seq, pos, cached - 1);
      steps[seq] = {pos, pos + 1};
    } else {
      if (pos != it->second.end)
        fail(
            "sequence {}: position {} does not follow position {} (positions must be "
            "contiguous from 0)",
            seq, pos, it->second.end - 1);
      it->second.end = pos + 1;
    }
  }
  return steps;
}

size_t StageData::size() const {
  switch (type) {
    case Type::F64:
      return f64.size();
    case Type::F32:
      return f32.size();
    case Type::I32:
      return i32.size();
  }
  return 0;
}

double StageData::at(size_t i) const {
  switch (type) {
    case Type::F64:
      return f64[i];
    case Type::F32:
      return f32[i];
    case Type::I32:
      return i32[i];
  }
  return 0;
}

void StageData::set(size_t i, double v) {
  switch (type) {
    case Type::F64:
      f64[i] = v;
      break;
    case Type::F32:
      f32[i] = float(v);
      break;
    case Type::I32:
      i32[i] = int32_t(v);
      break;
  }
}

std::vector<size_t> stage_dims(const Config& c, Stage s, int pos) {
  const size_t H = size_t(c.hidden_size), d = size_t(c.head_dim),
               nH = size_t(c.num_attention_heads), nKV = size_t(c.num_key_value_heads),
               k = size_t(c.num_experts_per_tok), I = size_t(c.intermediate_size);
  switch (info(s).shape) {
    case Shape::hidden:
      return {H};
    case Shape::qkv:
      return {size_t(c.qkv_dim())};
    case Shape::q:
      return {nH, d};
    case Shape::kv:
      return {nKV, d};
    case Shape::keys:
      return {nH, size_t(pos) + 2};
    case Shape::head_out:
      return {nH * d};
    case Shape::experts:
      return {size_t(c.num_local_experts)};
    case Shape::topk:
      return {k};
    case Shape::mlp1:
      return {k, 2 * I};
    case Shape::inter:
      return {k, I};
    case Shape::expert_hidden:
      return {k, H};
    case Shape::vocab:
      return {size_t(c.vocab_size)};
  }
  return {};
}

std::vector<std::pair<int, Stage>> stage_sequence(const Config& c) {
  std::vector<std::pair<int, Stage>> seq;
  for (const auto& s : kStages)
    if (s.scope == Scope::Model && s.stage < Stage::attn_norm)
      seq.emplace_back(kModelLayer, s.stage);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (const auto& s : kStages)
      if (s.scope != Scope::Model) seq.emplace_back(l, s.stage);
  for (const auto& s : kStages)
    if (s.scope == Scope::Model && s.stage > Stage::attn_norm)
      seq.emplace_back(kModelLayer, s.stage);
  return seq;
}

int stages_per_position(const Config& c) {
  int model = 0, layer = 0;
  for (const auto& s : kStages) (s.scope == Scope::Model ? model : layer)++;
  return model + layer * c.num_hidden_layers;
}

int execution_order(const Config& c, int layer, Stage s) {
  int per_layer = 0, before = 0;
  for (const auto& i : kStages) {
    if (i.scope != Scope::Model) ++per_layer;
    if (i.scope == Scope::Model && i.stage < Stage::attn_norm) ++before;
  }
  if (layer == kModelLayer) {
    if (s < Stage::attn_norm) return int(s);
    int idx = 0;
    for (const auto& i : kStages)
      if (i.scope == Scope::Model && i.stage > Stage::attn_norm && i.stage < s) ++idx;
    return before + per_layer * c.num_hidden_layers + idx;
  }
  int idx = 0;
  for (const auto& i : kStages)
    if (i.scope != Scope::Model && i.stage < s) ++idx;
  return before + per_layer * layer + idx;
}

Injection Injection::parse(const std::string& text, const Config& c) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t p = text.find(':', start);
    parts.push_back(text.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  Injection inj;
  auto st = stage_from_name(parts[0]);
  if (!st) fail("--inject {}: unknown stage \"{}\"", text, parts[0]);
  inj.stage = *st;
  size_t next = 1;
  if (is_model_scope(inj.stage)) {
    inj.layer = kModelLayer;
  } else {
    if (parts.size() < 2 || parts[1].empty())
      fail("--inject {}: stage {} is per layer; write {}:LAYER", text, parts[0], parts[0]);
    try {
      size_t used = 0;
      inj.layer = std::stoi(parts[1], &used);
      if (used != parts[1].size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      fail("--inject {}: layer \"{}\" is not a number", text, parts[1]);
    }
    if (inj.layer < 0 || inj.layer >= c.num_hidden_layers)
      fail("--inject {}: layer {} out of range (the model has {} layers)", text, inj.layer,
           c.num_hidden_layers);
    next = 2;
  }
  if (parts.size() > next) {
    const std::string& m = parts[next];
    if (m == "add")
      inj.mode = Mode::Add;
    else if (m == "nan")
      inj.mode = Mode::NaN;
    else if (m == "zero")
      inj.mode = Mode::Zero;
    else
      fail("--inject {}: unknown mode \"{}\" (add, nan, zero)", text, m);
  }
  if (parts.size() > next + 1) fail("--inject {}: too many fields", text);
  return inj;
}

std::string Injection::str() const {
  std::string s(name(stage));
  if (layer != kModelLayer) s += ":" + std::to_string(layer);
  s += mode == Mode::Add ? ":add" : mode == Mode::NaN ? ":nan" : ":zero";
  return s;
}

void apply_injection(const Injection& inj, const Config& c, StageData& row) {
  if (info(inj.stage).kind == ValueKind::Index) {
    // Route slot 0 to the lowest expert the row did not select.
    for (int e = 0; e < c.num_local_experts; ++e) {
      if (std::find(row.i32.begin(), row.i32.end(), e) == row.i32.end()) {
        row.i32[0] = e;
        return;
      }
    }
    return;
  }
  if (inj.mode == Injection::Mode::Zero) {
    for (size_t i = 0; i < row.size(); ++i) row.set(i, 0.0);
    return;
  }
  for (size_t i = 0; i < row.size(); ++i) {
    const double x = row.at(i);
    if (!std::isfinite(x)) continue;
    row.set(i, inj.mode == Injection::Mode::NaN ? std::numeric_limits<double>::quiet_NaN()
                                                : x + 0.5 + 0.5 * std::fabs(x));
    return;
  }
}

void forward(Backend& b, const Batch& batch, Observer* observer, const Injection* injection) {
  const Config& c = b.config();
  b.begin_step(batch);
  auto stage = [&](int layer, Stage s) {
    b.run(s, layer);
    const bool inject = injection != nullptr && injection->stage == s && injection->layer == layer;
    if (!inject && observer == nullptr) return;
    for (int r = 0; r < batch.rows(); ++r) {
      const int pos = batch.positions[size_t(r)];
      if (inject) {
        StageData row = b.read(s, layer, r);
        apply_injection(*injection, c, row);
        b.write(s, layer, r, row);
      }
      if (observer != nullptr && batch.seqs[size_t(r)] == 0 && observer->wants(pos, layer, s))
        observer->record({pos, layer, s, execution_order(c, layer, s)}, b.read(s, layer, r));
    }
  };
  // The layer as a list: attention block, then the MoE block (gpt-oss/torch/model.py).
  stage(kModelLayer, Stage::embedding);
  for (int L = 0; L < c.num_hidden_layers; ++L) {
    stage(L, Stage::attn_norm);
    stage(L, Stage::qkv);
    stage(L, Stage::q_rope);
    stage(L, Stage::k_rope);
    stage(L, Stage::v);
    stage(L, Stage::scores);
    stage(L, Stage::att);
    stage(L, Stage::attn_out);
    stage(L, Stage::o_proj);
    stage(L, Stage::resid_attn);
    stage(L, Stage::ffn_norm);
    stage(L, Stage::router);
    stage(L, Stage::topk_idx);
    stage(L, Stage::topk_w);
    stage(L, Stage::mlp1);
    stage(L, Stage::swiglu);
    stage(L, Stage::mlp2);
    stage(L, Stage::moe_out);
    stage(L, Stage::resid_ffn);
  }
  stage(kModelLayer, Stage::final_norm);
  stage(kModelLayer, Stage::logits);
}

}  // namespace parity
