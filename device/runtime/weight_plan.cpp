#include "device/runtime/weight_plan.h"

#include <utility>

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

namespace {

// A tensor's whole extent as WeightSlice counts it: experts, output rows, input columns.
WeightSlice whole(int experts, int rows, int cols) {
  return {{0, experts}, {0, rows}, {0, cols}};
}

// Which part of each tensor the device holds: the whole tensor without a shard plan, rank
// shard->rank's part with one (plan_weights's comment).
class Slicer {
 public:
  Slicer(const Config& c, const ShardPlan* shard) : c_(c), shard_(shard) {}
  bool sharded() const { return shard_ != nullptr; }
  // The rows of q, k and v a rank computes, each within its own projection.
  ShardRange q_rows() const { return sharded() ? shard_->q_rows : ShardRange{0, c_.q_dim()}; }
  ShardRange k_rows() const {
    return within(sharded() ? shard_->k_rows : ShardRange{}, c_.q_dim());
  }
  ShardRange v_rows() const {
    return within(sharded() ? shard_->v_rows : ShardRange{}, c_.q_dim() + c_.kv_dim());
  }
  ShardRange o_cols() const { return sharded() ? shard_->o_proj_cols : ShardRange{0, c_.q_dim()}; }
  ShardRange heads() const {
    return sharded() ? shard_->q_heads : ShardRange{0, c_.num_attention_heads};
  }
  ShardRange vocab(int rows) const { return sharded() ? shard_->vocab : ShardRange{0, rows}; }
  ShardRange experts(int n) const { return sharded() ? shard_->experts : ShardRange{0, n}; }
  // The intermediate slice (by_intermediate; whole by_expert and unsharded).
  ShardRange intermediate(int n) const {
    return sharded() ? shard_->intermediate : ShardRange{0, n};
  }

 private:
  // Rows of the fused [q | k | v] output from `at` on, as rows of k or v (all kv_dim unsharded).
  ShardRange within(ShardRange fused, int at) const {
    return sharded() ? ShardRange{fused.begin - at, fused.end - at} : ShardRange{0, c_.kv_dim()};
  }

  const Config& c_;
  const ShardPlan* shard_;
};

WeightPlan plan(const Model& m, const ShardPlan* shard) {
  const Config& c = m.config;
  const Slicer sl(c, shard);
  WeightPlan p;
  // `dims`: the tensor's whole extent (experts, rows, cols), whose product is its element count
  // (packed MXFP4 entries: the projection's experts, out and in); `slice`: the part held.
  auto place = [&](const TensorView* t, bool to_f32, const std::string& kind, WeightSlice dims,
                   WeightSlice slice, const ExpertLinear* packed = nullptr,
                   WeightEntry::Pack pack = WeightEntry::Pack::none) {
    if (t == nullptr) return;
    for (const auto& e : p.entries)
      if (e.tensor == t) return;  // placed once
    if (to_f32 && !(t->dtype == DType::BF16 || t->dtype == DType::F16 || t->dtype == DType::F32))
      weight_type_of(*t);  // throws with the tensor's name
    for (const auto& [d, s] : {std::pair{dims.experts, slice.experts},
                               std::pair{dims.rows, slice.rows}, std::pair{dims.cols, slice.cols}})
      PARITY_CHECK(s.begin >= 0 && s.begin <= s.end && s.end <= d.end,
                   "device weight plan: slice [{}, {}) of \"{}\" outside [0, {})", s.begin, s.end,
                   t->name, d.end);
    WeightEntry e;
    e.tensor = t;
    e.to_f32 = to_f32;
    e.slice = slice;
    const int64_t elements = int64_t(slice.experts.size()) * slice.rows.size() * slice.cols.size();
    if (packed != nullptr) {
      e.pack = pack;
      e.experts = slice.experts.size(), e.out = slice.rows.size(), e.in = slice.cols.size();
      const Mxfp4Packing pk(e.out, e.in);
      e.bytes = size_t(pack == WeightEntry::Pack::mxfp4_blocks ? pk.block_bytes(e.experts)
                                                               : pk.scale_bytes(e.experts));
    } else {
      PARITY_CHECK(int64_t(dims.experts.size()) * dims.rows.size() * dims.cols.size() == t->numel(),
                   "device weight plan: \"{}\" {} is not {} x {} x {}", t->name, t->shape_str(),
                   dims.experts.size(), dims.rows.size(), dims.cols.size());
      e.bytes = size_t(elements) * (to_f32 ? sizeof(float) : t->nbytes / size_t(t->numel()));
    }
    e.offset = p.total;
    p.total += (e.bytes + 255) / 256 * 256;
    p.bytes_by_kind[kind] += e.bytes;
    p.entries.push_back(e);
  };
  auto raw = [&](const TensorView* t, WeightSlice dims, WeightSlice slice) {
    if (t == nullptr) return;
    weight_type_of(*t);
    place(t, false, std::string(dtype_name(t->dtype)), dims, slice);
  };
  auto raw_whole = [&](const TensorView* t) {  // replicated: the norms, the embedding
    if (t == nullptr) return;
    const WeightSlice all = t->shape.size() == 2 ? whole(1, int(t->dim(0)), int(t->dim(1)))
                                                 : whole(1, int(t->numel()), 1);
    raw(t, all, all);
  };
  auto vec = [&](const TensorView* t, WeightSlice dims, WeightSlice slice) {
    if (t != nullptr)
      place(t, true, fmt::format("F32 (biases, sinks; from {})", dtype_name(t->dtype)), dims,
            slice);
  };
  // A dense linear's weight [out, in] and bias [out], rows `rows` and columns `cols` held.
  auto linear = [&](const Linear& l, ShardRange rows, ShardRange cols, bool bias_whole = false) {
    raw(l.weight, whole(1, l.out, l.in), {{0, 1}, rows, cols});
    vec(l.bias, whole(1, l.out, 1), {{0, 1}, bias_whole ? ShardRange{0, l.out} : rows, {0, 1}});
  };
  // An expert projection: experts `experts`, output rows `rows`, input columns `cols`; its bias
  // [E, out] the experts' rows `bias_rows`.
  auto experts = [&](const ExpertLinear& w, ShardRange ex, ShardRange rows, ShardRange cols,
                     ShardRange bias_rows) {
    const WeightSlice dims = whole(w.experts, w.out, w.in), slice{ex, rows, cols};
    if (w.layout == ExpertLayout::Mxfp4) {
      place(w.blocks, false, "U8 (MXFP4 blocks + scales, packed)", dims, slice, &w,
            WeightEntry::Pack::mxfp4_blocks);
      place(w.scales, false, "U8 (MXFP4 blocks + scales, packed)", dims, slice, &w,
            WeightEntry::Pack::mxfp4_scales);
    } else {
      raw(w.dense, dims, slice);  // [E, in, out]: the same extent, counted E x out x in
    }
    vec(w.bias, whole(w.experts, w.out, 1), {ex, bias_rows, {0, 1}});
  };
  raw_whole(m.embed);
  for (const auto& l : m.layers) {
    raw_whole(l.attn_norm);
    linear(l.q, sl.q_rows(), {0, l.q.in});
    linear(l.k, sl.k_rows(), {0, l.k.in});
    linear(l.v, sl.v_rows(), {0, l.v.in});
    linear(l.o, {0, l.o.out}, sl.o_cols(), true);
    vec(l.sinks, whole(1, c.num_attention_heads, 1), {{0, 1}, sl.heads(), {0, 1}});
    raw_whole(l.ffn_norm);
    linear(l.router, {0, l.router.out}, {0, l.router.in});
    const ShardRange ex = sl.experts(l.mlp1.experts), inter = sl.intermediate(l.mlp2.in);
    experts(l.mlp1, ex, {2 * inter.begin, 2 * inter.end}, {0, l.mlp1.in},
            {2 * inter.begin, 2 * inter.end});
    experts(l.mlp2, ex, {0, l.mlp2.out}, inter, {0, l.mlp2.out});
  }
  raw_whole(m.final_norm);
  linear(m.lm_head, sl.vocab(m.lm_head.out), {0, m.lm_head.in});
  return p;
}

}  // namespace

WeightPlan plan_weights(const Model& m) {
  return plan(m, nullptr);
}

WeightPlan plan_weights(const Model& m, const ShardPlan& shard) {
  return plan(m, &shard);
}

}  // namespace parity::device
