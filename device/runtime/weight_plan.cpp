#include "device/runtime/weight_plan.h"

#include "model/error.h"

namespace parity::device {

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
  auto place = [&](const TensorView* t, bool to_f32, const std::string& kind,
                   const ExpertLinear* packed = nullptr,
                   WeightEntry::Pack pack = WeightEntry::Pack::none) {
    if (t == nullptr) return;
    for (const auto& e : p.entries)
      if (e.tensor == t) return;  // placed once
    WeightEntry e;
    e.tensor = t;
    e.to_f32 = to_f32;
    e.bytes = to_f32 ? size_t(t->numel()) * sizeof(float) : t->nbytes;
    if (packed != nullptr) {
      e.pack = pack;
      e.experts = packed->experts, e.out = packed->out, e.in = packed->in;
      const Mxfp4Packing pk(e.out, e.in);
      e.bytes = size_t(pack == WeightEntry::Pack::mxfp4_blocks ? pk.block_bytes(e.experts)
                                                               : pk.scale_bytes(e.experts));
    }
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
      place(w.blocks, false, "U8 (MXFP4 blocks + scales, packed)", &w,
            WeightEntry::Pack::mxfp4_blocks);
      place(w.scales, false, "U8 (MXFP4 blocks + scales, packed)", &w,
            WeightEntry::Pack::mxfp4_scales);
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

}  // namespace parity::device
