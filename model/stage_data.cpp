// StageData (one row of a stage's output on the host) and the shape rule of every stage.
#include <cmath>

#include "model/backend.h"
#include "model/error.h"

namespace parity {

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
    case Shape::token:
      return {1};
  }
  return {};
}

}  // namespace parity
