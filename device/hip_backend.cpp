// The `hip` backend over the forward graph (model/forward.h): one launcher per stage call, or
// none where an earlier fused kernel already wrote the stage's output, on the device runtime
// (device/runtime/runtime.h), which owns the weights, activations, KV cache and the step. Host
// code, compiled by the host compiler; the kernels live in the .hip files behind
// device/kernels.h.
//
// Fusion keeps every stage boundary visible (each fused kernel writes every stage output it
// covers) and stays exact under fault injection:
//   q_rope  writes q_rope, k_rope and v (all three depend on qkv only; k_rope, v run nothing);
//   o_proj  writes o_proj and resid_attn = residual + o_proj;
//   topk_idx writes topk_idx and topk_w;
//   mlp1    writes mlp1 and swiglu;
//   moe_out writes moe_out and resid_ffn = resid_attn + moe_out.
// When the graph overwrites a fused producer's output (write(): injection, replay), the
// consumer stage's run() recomputes its output from the written one with its own kernel.
#include "device/hip_backend.h"

#include <bitset>
#include <vector>

#include "device/build_facts.h"
#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/runtime/runtime.h"
#include "model/error.h"

namespace parity {
namespace device {
namespace {

class HipBackend final : public Backend {
 public:
  HipBackend(const Model& m, const DeviceOptions& options) : rt_(m, options), c_(m.config) {}

  std::string name() const override { return "hip"; }
  std::string precision() const override {
    return "weights in checkpoint dtypes on the device (BF16/F16/F32 matrices, MXFP4 experts "
           "decoded exactly in-kernel; biases and sinks as exact float32 copies), float32 "
           "activations and KV cache, float32 accumulation with explicit fma in a fixed order, "
           "no other contraction (" PARITY_DEVICE_FP_CONTRACT "), precise expf/sinf/cosf/sqrtf";
  }
  // CUDA's and HIP's expf, sinf, cosf and sqrtf (no fast-math) are within 2 ulp; the policy
  // allows twice that.
  PrecisionPolicy precision_policy() const override { return PrecisionPolicy::float32(4); }
  nlohmann::json facts() const override { return rt_.facts(); }
  const Config& config() const override { return c_; }

  void begin_step(const Batch& b) override;
  void run(Stage s, int layer) override;
  StageData read(Stage s, int layer, int row) override;
  void write(Stage s, int layer, int row, const StageData& data) override;
  void reset() override { rt_.clear(); }

 private:
  float* out(Stage s) const { return rt_.arena().out(s); }
  int32_t* index_out(Stage s) const { return rt_.arena().index_out(s); }
  int32_t* topk_idx() const { return index_out(Stage::topk_idx); }
  float* row_ptr(Stage s, int row) const {
    if (info(s).shape == Shape::keys)
      return (s == Stage::scores ? rt_.arena().scores() : rt_.arena().att()) +
             rt_.step().host().rows[size_t(row)].scores_offset;
    return out(s) + size_t(row) * stage_row_floats(c_, s);
  }
  // Input of the layer's attention block: the embedding, or the previous layer's resid_ffn.
  float* residual_in(int layer) const {
    return out(layer == 0 ? Stage::embedding : Stage::resid_ffn);
  }
  void gemv(const DeviceLinear& l, Stage in, Stage out_stage, GemvResidual residual = {});
  void check_row(const char* what, Stage s, int layer, int row) const;

  DeviceRuntime rt_;
  const Config& c_;

  // The current step, as the graph sees it.
  Batch batch_;
  std::bitset<kNumStages> ran_;          // stages run in this step
  std::bitset<kNumStages> overwritten_;  // written by write() since they last ran
  std::array<int, kNumStages> ran_layer_{};
};

void HipBackend::begin_step(const Batch& b) {
  rt_.begin_step(b);  // validates; throws before anything changes
  batch_ = b;
  ran_.reset();
  overwritten_.reset();
}

void HipBackend::gemv(const DeviceLinear& l, Stage in, Stage out_stage, GemvResidual residual) {
  const GemvSegment seg{l.w, l.bias, 0};
  launch_f32_gemv_bias(std::span<const GemvSegment>(&seg, 1), out(in), l.w.cols, batch_.rows(),
                       out(out_stage), l.w.rows, residual, rt_.stream());
}

void HipBackend::run(Stage s, int layer) {
  if (batch_.rows() == 0) fail("hip backend: run({}) before begin_step", parity::name(s));
  if (is_model_scope(s) ? layer != kModelLayer : (layer < 0 || layer >= c_.num_hidden_layers))
    fail("hip backend: run({}) at layer {}: out of range", parity::name(s), layer);
  const int B = batch_.rows();
  const int H = c_.hidden_size, k = c_.num_experts_per_tok, I = c_.intermediate_size;
  const float alpha = float(c_.swiglu_alpha), limit = float(c_.swiglu_limit);
  const float eps = float(c_.rms_norm_eps);
  const hipStream_t st = rt_.stream();
  const StepRow* rows = rt_.step().device_rows();
  const int max_pos = rt_.step().max_pos();
  const DeviceWeights& w = rt_.weights();
  const DeviceLayer* L = layer >= 0 ? &w.layer(layer) : nullptr;
  const ActivationArena& arena = rt_.arena();
  ran_.set(size_t(s));
  ran_layer_[size_t(s)] = layer;
  const bool stale = [&] {  // was the fused producer of this stage overwritten after it ran?
    switch (s) {
      case Stage::resid_attn:
        return overwritten_.test(size_t(Stage::o_proj));
      case Stage::topk_w:
        return overwritten_.test(size_t(Stage::topk_idx));
      case Stage::swiglu:
        return overwritten_.test(size_t(Stage::mlp1));
      case Stage::resid_ffn:
        return overwritten_.test(size_t(Stage::moe_out));
      default:
        return false;
    }
  }();
  overwritten_.reset(size_t(s));

  switch (s) {
    case Stage::embedding:
      launch_f32_embedding_gather(w.embed(), rows, B, out(s), st);
      break;
    case Stage::attn_norm:
      launch_f32_rmsnorm(residual_in(layer), L->attn_norm.type, L->attn_norm.data, B, H, eps,
                         out(s), st);
      break;
    case Stage::qkv: {
      const int qd = c_.q_dim(), kvd = c_.kv_dim();
      const GemvSegment segs[3] = {
          {L->q.w, L->q.bias, 0}, {L->k.w, L->k.bias, qd}, {L->v.w, L->v.bias, qd + kvd}};
      launch_f32_gemv_bias(segs, out(Stage::attn_norm), H, B, out(s), c_.qkv_dim(), {}, st);
      break;
    }
    case Stage::q_rope:
      launch_f32_qkv_split_yarn_rope(out(Stage::qkv), rows, B, c_.num_attention_heads,
                                     c_.num_key_value_heads, c_.head_dim, w.inv_freq(),
                                     w.concentration(), out(Stage::q_rope), out(Stage::k_rope),
                                     out(Stage::v), st);
      break;
    case Stage::k_rope:
    case Stage::v:
      break;  // written by q_rope's kernel
    case Stage::scores: {
      const AttentionShape a = rt_.attention_shape(layer);
      const KvCacheView kv = rt_.kv_view();
      launch_f32_kv_cache_append(a, kv, rows, B, out(Stage::k_rope), out(Stage::v), st);
      launch_f32_attention_scores(a, kv, rows, B, max_pos, out(Stage::q_rope), L->sinks,
                                  arena.scores(), st);
      break;
    }
    case Stage::att:
      launch_f32_softmax_with_sink(c_.num_attention_heads, rows, B, arena.scores(), arena.att(),
                                   st);
      break;
    case Stage::attn_out:
      launch_f32_attention_pv(rt_.attention_shape(layer), rt_.kv_view(), rows, B, max_pos,
                              arena.att(), arena.workspace(), out(s), st);
      break;
    case Stage::o_proj:
      gemv(L->o, Stage::attn_out, s, {residual_in(layer), out(Stage::resid_attn), H});
      break;
    case Stage::resid_attn:
      if (stale) launch_f32_add(residual_in(layer), out(Stage::o_proj), int64_t(B) * H, out(s), st);
      break;
    case Stage::ffn_norm:
      launch_f32_rmsnorm(out(Stage::resid_attn), L->ffn_norm.type, L->ffn_norm.data, B, H, eps,
                         out(s), st);
      break;
    case Stage::router:
      gemv(L->router, Stage::ffn_norm, s);
      break;
    case Stage::topk_idx:
      launch_f32_router_topk_softmax(out(Stage::router), B, c_.num_local_experts, k, true,
                                     topk_idx(), out(Stage::topk_w), st);
      break;
    case Stage::topk_w:
      if (stale)
        launch_f32_router_topk_softmax(out(Stage::router), B, c_.num_local_experts, k, false,
                                       topk_idx(), out(s), st);
      break;
    case Stage::mlp1:
      launch_f32_moe_gemv(L->mlp1, topk_idx(), B, k, out(Stage::ffn_norm), H, 0, out(s),
                          out(Stage::swiglu), alpha, limit, st);
      break;
    case Stage::swiglu:
      if (stale) launch_f32_swiglu(out(Stage::mlp1), B * k, I, alpha, limit, out(s), st);
      break;
    case Stage::mlp2:
      launch_f32_moe_gemv(L->mlp2, topk_idx(), B, k, out(Stage::swiglu), k * I, I, out(s), nullptr,
                          alpha, limit, st);
      break;
    case Stage::moe_out:
      launch_f32_moe_weighted_sum_residual(out(Stage::topk_w), out(Stage::mlp2), B, k, H,
                                           out(Stage::resid_attn), out(s), out(Stage::resid_ffn),
                                           st);
      break;
    case Stage::resid_ffn:
      if (stale)
        launch_f32_add(out(Stage::resid_attn), out(Stage::moe_out), int64_t(B) * H, out(s), st);
      break;
    case Stage::final_norm:
      launch_f32_rmsnorm(out(Stage::resid_ffn), w.final_norm().type, w.final_norm().data, B, H, eps,
                         out(s), st);
      break;
    case Stage::logits:
      gemv({w.lm_head(), nullptr}, Stage::final_norm, s);
      break;
    case Stage::sampled:
      launch_f32_argmax(out(Stage::logits), B, c_.vocab_size, index_out(s), st);
      break;
  }
}

void HipBackend::check_row(const char* what, Stage s, int layer, int row) const {
  if (row < 0 || row >= batch_.rows())
    fail("hip backend: {}({}) row {} of {}", what, parity::name(s), row, batch_.rows());
  if (!ran_.test(size_t(s)) || ran_layer_[size_t(s)] != layer)
    fail("hip backend: {}({}, layer {}) before that stage ran in this step", what, parity::name(s),
         layer);
}

StageData HipBackend::read(Stage s, int layer, int row) {
  check_row("read", s, layer, row);
  StageData d;
  d.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
  size_t n = 1;
  for (size_t x : d.dims) n *= x;
  const hipStream_t st = rt_.stream();
  if (info(s).kind == ValueKind::Index) {
    d.type = StageData::Type::I32;
    d.i32.resize(n);
    HIP_CHECK(hipMemcpyAsync(d.i32.data(), index_out(s) + size_t(row) * n, n * sizeof(int32_t),
                             hipMemcpyDeviceToHost, st));
  } else {
    d.type = StageData::Type::F32;
    d.f32.resize(n);
    HIP_CHECK(hipMemcpyAsync(d.f32.data(), row_ptr(s, row), n * sizeof(float),
                             hipMemcpyDeviceToHost, st));
  }
  HIP_CHECK(hipStreamSynchronize(st));
  return d;
}

void HipBackend::write(Stage s, int layer, int row, const StageData& data) {
  check_row("write", s, layer, row);
  size_t n = 1;
  for (size_t x : stage_dims(c_, s, batch_.positions[size_t(row)])) n *= x;
  if (data.size() != n)
    fail("write {}: {} values for a row of {}", parity::name(s), data.size(), n);
  const hipStream_t st = rt_.stream();
  if (info(s).kind == ValueKind::Index) {
    std::vector<int32_t> idx(n);
    const double limit = s == Stage::sampled ? c_.vocab_size : c_.num_local_experts;
    for (size_t i = 0; i < n; ++i) {
      const double e = data.at(i);
      if (!(e >= 0 && e < limit)) fail("write {}: index {} out of range", parity::name(s), e);
      idx[i] = int32_t(e);
    }
    HIP_CHECK(hipMemcpyAsync(index_out(s) + size_t(row) * n, idx.data(), n * sizeof(int32_t),
                             hipMemcpyHostToDevice, st));
    HIP_CHECK(hipStreamSynchronize(st));
  } else {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(data.at(i));
    HIP_CHECK(
        hipMemcpyAsync(row_ptr(s, row), v.data(), n * sizeof(float), hipMemcpyHostToDevice, st));
    HIP_CHECK(hipStreamSynchronize(st));
  }
  overwritten_.set(size_t(s));
}

}  // namespace
}  // namespace device

std::unique_ptr<Backend> make_hip_backend(const Model& m, const device::DeviceOptions& options) {
  return std::make_unique<device::HipBackend>(m, options);
}

std::unique_ptr<Backend> make_hip_backend(const Model& m) {
  return make_hip_backend(m, device::device_options_from_environment());
}

}  // namespace parity
