// The `hip` backend over the forward graph (model/forward.h): one launcher per stage call, or
// none where an earlier fused kernel already wrote the stage's output. Host code, compiled by
// the host compiler; the kernels live in the .hip files behind device/kernels.h.
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

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <vector>

#include "device/build_facts.h"
#include "device/device_buffer.h"
#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/plan.h"
#include "model/error.h"

namespace parity {
namespace device {
namespace {

struct DeviceNorm {
  WeightType type = WeightType::bf16;
  const void* data = nullptr;
};

struct DeviceLinear {
  Matrix w;
  const float* bias = nullptr;
};

struct DeviceLayer {
  DeviceNorm attn_norm, ffn_norm;
  DeviceLinear q, k, v, o, router;
  const float* sinks = nullptr;
  ExpertWeights mlp1, mlp2;
};

// One sequence's KV cache: K then V, each [layers][max_context][nKV d] float.
struct SequenceCache {
  DeviceBuffer kv;
  float* k = nullptr;
  float* v = nullptr;
};

class Stream {
 public:
  Stream() { HIP_CHECK(hipStreamCreateWithFlags(&s_, hipStreamNonBlocking)); }
  ~Stream() {
    (void)hipStreamSynchronize(s_);
    (void)hipStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  hipStream_t get() const { return s_; }

 private:
  hipStream_t s_ = nullptr;
};

class Event {
 public:
  Event() { HIP_CHECK(hipEventCreateWithFlags(&e_, hipEventDisableTiming)); }
  ~Event() { (void)hipEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  hipEvent_t get() const { return e_; }

 private:
  hipEvent_t e_ = nullptr;
};

class HipBackend final : public Backend {
 public:
  explicit HipBackend(const Model& m);
  ~HipBackend() override { (void)hipStreamSynchronize(stream_.get()); }

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
  nlohmann::json facts() const override { return facts_; }
  const Config& config() const override { return c_; }

  void begin_step(const Batch& b) override;
  void run(Stage s, int layer) override;
  StageData read(Stage s, int layer, int row) override;
  void write(Stage s, int layer, int row, const StageData& data) override;
  void reset() override {
    for (auto& [seq, cache] : caches_) free_caches_.push_back(std::move(cache));
    caches_.clear();
    sequences_.clear();
  }

 private:
  void check_supported() const;
  void upload_weights();
  void ensure_rows(int rows);
  void ensure_scores(int64_t floats);
  SequenceCache& cache_for(int seq);
  AttentionShape attention_shape(int layer) const;

  float* out(Stage s) const { return act_.as<float>(stage_offset_[size_t(s)]); }
  // Index stages (topk_idx, sampled) keep int32 rows in their slot of the activations.
  int32_t* index_out(Stage s) const { return act_.as<int32_t>(stage_offset_[size_t(s)]); }
  int32_t* topk_idx() const { return index_out(Stage::topk_idx); }
  float* row_ptr(Stage s, int row) const {
    if (info(s).shape == Shape::keys)
      return (s == Stage::scores ? scores_ : att_) + rows_host_[size_t(row)].scores_offset;
    return out(s) + size_t(row) * stage_row_floats(c_, s);
  }
  // Input of the layer's attention block: the embedding, or the previous layer's resid_ffn.
  float* residual_in(int layer) const {
    return out(layer == 0 ? Stage::embedding : Stage::resid_ffn);
  }
  const void* weight(const TensorView* t) const {
    return t == nullptr ? nullptr : weights_.as<char>(plan_.find(t).offset);
  }
  const float* weight_f32(const TensorView* t) const {
    return static_cast<const float*>(weight(t));
  }
  Matrix matrix(const TensorView* t) const;
  DeviceLinear linear(const Linear& l) const { return {matrix(l.weight), weight_f32(l.bias)}; }
  ExpertWeights experts(const ExpertLinear& w) const;
  void gemv(const DeviceLinear& l, Stage in, Stage out_stage, GemvResidual residual = {});

  const Model& m_;
  const Config& c_;
  int device_ = 0;
  int warp_ = 0;
  int max_context_ = 0;
  Stream stream_;
  Event rows_uploaded_;
  nlohmann::json facts_;

  WeightPlan plan_;
  DeviceBuffer weights_;
  Matrix embed_, lm_head_;
  DeviceNorm final_norm_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer inv_freq_;
  float concentration_ = 1;

  // Activations for row_capacity_ rows: one buffer, every stage at its offset.
  int row_capacity_ = 0;
  DeviceBuffer act_;
  std::array<size_t, kNumStages> stage_offset_{};
  size_t workspace_offset_ = 0;
  DeviceBuffer rows_dev_;
  PinnedBuffer rows_pinned_;
  // Packed scores and att rows of the step ([nH, pos + 2] per row, at StepRow::scores_offset).
  int64_t scores_capacity_ = 0;
  DeviceBuffer scores_buffer_;
  float* scores_ = nullptr;
  float* att_ = nullptr;

  SequenceTable sequences_;
  std::map<int, SequenceCache> caches_;
  std::vector<SequenceCache> free_caches_;

  // The current step.
  Batch batch_;
  std::vector<StepRow> rows_host_;
  int max_pos_ = 0;
  std::bitset<kNumStages> ran_;          // stages run in this step
  std::bitset<kNumStages> overwritten_;  // written by write() since they last ran
  std::array<int, kNumStages> ran_layer_{};
};

HipBackend::HipBackend(const Model& m) : m_(m), c_(m.config) {
  HIP_CHECK(hipGetDevice(&device_));
  std::string device_name, arch;
  HIP_CHECK(device_name_and_arch(device_, device_name, arch));
  warp_ = device_warp_size();
  const int compiled = compiled_warp_size(stream_.get());
  if (compiled != warp_)
    fail(
        "device {} ({}): the device code was compiled for a warp of {} lanes but the device "
        "runs {} (HINT: build for this GPU's architecture: CMAKE_CUDA_ARCHITECTURES or "
        "PARITY_HIP_ARCHITECTURES)",
        device_name, arch, compiled, warp_);
  max_context_ = resolve_max_context(c_, std::getenv("PARITY_DEVICE_MAX_CONTEXT"));
  const int rows = resolve_initial_rows(std::getenv("PARITY_DEVICE_ROWS"));
  check_supported();

  // Memory: weights, one sequence's KV cache, activations for `rows` rows and their scores.
  plan_ = plan_weights(m);
  const size_t kv = kv_cache_bytes(c_, max_context_);
  const size_t act = activation_bytes(c_, rows, max_context_);
  const int64_t scores_floats = int64_t(c_.num_attention_heads) * (max_context_ + 1);
  const size_t scores = 2 * size_t(scores_floats) * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  HIP_CHECK(hipMemGetInfo(&free_bytes, &total_bytes));
  std::string by_kind;
  for (const auto& [kind, bytes] : plan_.bytes_by_kind)
    by_kind += fmt::format("{}{} {}", by_kind.empty() ? "" : ", ", kind, format_bytes(bytes));
  const size_t need = plan_.total + kv + act + scores;
  const std::string report = fmt::format(
      "hip backend on {} ({}): {} free of {}\n"
      "  weights      {} ({})\n"
      "  KV cache     {} per sequence ({} layers x {} positions x {} x K,V x f32)\n"
      "  activations  {} for {} rows per step, scores/att {} (both grow with the step)\n"
      "  total        {}\n",
      device_name, arch, format_bytes(free_bytes), format_bytes(total_bytes),
      format_bytes(plan_.total), by_kind, format_bytes(kv), c_.num_hidden_layers, max_context_,
      c_.kv_dim(), format_bytes(act), rows, format_bytes(scores), format_bytes(need));
  std::cerr << report;
  if (need > free_bytes)
    fail(
        "{}: the model does not fit on {} ({}): weights {} + KV cache {} (one sequence of {} "
        "positions) + activations {} = {}, but only {} is free (HINT: lower "
        "PARITY_DEVICE_MAX_CONTEXT or PARITY_DEVICE_ROWS, or use a larger GPU)",
        m.dir, device_name, arch, format_bytes(plan_.total), format_bytes(kv), max_context_,
        format_bytes(act + scores), format_bytes(need), format_bytes(free_bytes));

  upload_weights();
  ensure_rows(rows);
  ensure_scores(scores_floats);
  cache_for(0);  // sequence 0 is preallocated; others on first use
  free_caches_.push_back(std::move(caches_.at(0)));
  caches_.clear();

  int driver = 0, runtime = 0, sms = 0;
  HIP_CHECK(hipDriverGetVersion(&driver));
  HIP_CHECK(hipRuntimeGetVersion(&runtime));
  HIP_CHECK(hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, device_));
  facts_ = {
      {"device", device_name},
      {"arch", arch},
      {"vendor", PARITY_DEVICE_VENDOR},
      {"driver_version", driver},
      {"runtime_version", runtime},
      {"compiler", PARITY_DEVICE_COMPILER},
      {"targets", PARITY_DEVICE_TARGETS},
      {"compile_flags", PARITY_DEVICE_FLAGS},
      {"fp_contract", PARITY_DEVICE_FP_CONTRACT},
      {"warp_size", warp_},
      {"multiprocessors", sms},
      {"memory_total_bytes", total_bytes},
      {"max_context", max_context_},
      {"weights_bytes", plan_.total},
  };
}

void HipBackend::check_supported() const {
  const int g = c_.heads_per_kv(), d = c_.head_dim;
  if (g * d > 1024)
    fail(
        "{}: {} query heads per KV head of dimension {} exceed the attention kernel's block of "
        "1024 threads",
        m_.dir, g, d);
  if (c_.num_local_experts > 8 * warp_)
    fail("{}: {} experts exceed the router kernel's limit of {} on this device", m_.dir,
         c_.num_local_experts, 8 * warp_);
  if (c_.num_experts_per_tok > 32)
    fail("{}: {} experts per token exceed the router kernel's limit of 32", m_.dir,
         c_.num_experts_per_tok);
}

Matrix HipBackend::matrix(const TensorView* t) const {
  Matrix mm;
  mm.type = weight_type_of(*t);
  mm.data = weight(t);
  mm.rows = int(t->dim(0));
  mm.cols = int(t->numel() / t->dim(0));
  return mm;
}

ExpertWeights HipBackend::experts(const ExpertLinear& w) const {
  ExpertWeights e;
  e.mxfp4 = w.layout == ExpertLayout::Mxfp4;
  e.experts = w.experts;
  e.out = w.out;
  e.in = w.in;
  e.bias = weight_f32(w.bias);
  if (e.mxfp4) {
    e.blocks = static_cast<const uint8_t*>(weight(w.blocks));
    e.scales = static_cast<const uint8_t*>(weight(w.scales));
  } else {
    e.dense_type = weight_type_of(*w.dense);
    e.dense = weight(w.dense);
  }
  return e;
}

void HipBackend::upload_weights() {
  weights_.allocate(plan_.total);
  std::vector<float> converted;
  for (const auto& e : plan_.entries) {
    char* dst = weights_.as<char>(e.offset);
    if (e.to_f32) {
      converted.resize(size_t(e.tensor->numel()));
      read_vector(*e.tensor, converted.data());
      HIP_CHECK(hipMemcpy(dst, converted.data(), e.bytes, hipMemcpyHostToDevice));
    } else {
      HIP_CHECK(hipMemcpy(dst, e.tensor->data, e.bytes, hipMemcpyHostToDevice));
    }
  }
  embed_ = matrix(m_.embed);
  lm_head_ = matrix(m_.lm_head.weight);
  final_norm_ = {weight_type_of(*m_.final_norm), weight(m_.final_norm)};
  for (const auto& l : m_.layers) {
    DeviceLayer d;
    d.attn_norm = {weight_type_of(*l.attn_norm), weight(l.attn_norm)};
    d.ffn_norm = {weight_type_of(*l.ffn_norm), weight(l.ffn_norm)};
    d.q = linear(l.q);
    d.k = linear(l.k);
    d.v = linear(l.v);
    d.o = linear(l.o);
    d.router = linear(l.router);
    d.sinks = weight_f32(l.sinks);
    d.mlp1 = experts(l.mlp1);
    d.mlp2 = experts(l.mlp2);
    layers_.push_back(d);
  }
  // YaRN table: computed in double (model/config.cpp), kept as float on the device.
  const Rope rope = Rope::from_config(c_);
  std::vector<float> inv(rope.inv_freq.begin(), rope.inv_freq.end());
  concentration_ = float(rope.concentration);
  inv_freq_.allocate(inv.size() * sizeof(float));
  HIP_CHECK(
      hipMemcpy(inv_freq_.as(), inv.data(), inv.size() * sizeof(float), hipMemcpyHostToDevice));
  // The copies ran on the default stream; the kernels run on a non-blocking one.
  HIP_CHECK(hipDeviceSynchronize());
}

void HipBackend::ensure_rows(int rows) {
  if (rows <= row_capacity_) return;
  const int cap = std::max(rows, 2 * row_capacity_);
  size_t bytes = 0;
  for (const auto& s : kStages) {
    if (s.shape == Shape::keys) continue;
    stage_offset_[size_t(s.stage)] = bytes;
    bytes += (size_t(cap) * stage_row_floats(c_, s.stage) * sizeof(float) + 255) / 256 * 256;
  }
  workspace_offset_ = bytes;
  AttentionShape a = attention_shape(0);
  bytes += attention_workspace_floats(a, cap) * sizeof(float);
  HIP_CHECK(hipStreamSynchronize(stream_.get()));  // old buffers may still be in use
  HIP_CHECK(hipEventSynchronize(rows_uploaded_.get()));
  act_.allocate(bytes);
  rows_dev_.allocate(size_t(cap) * sizeof(StepRow));
  rows_pinned_.allocate(size_t(cap) * sizeof(StepRow));
  row_capacity_ = cap;
}

void HipBackend::ensure_scores(int64_t floats) {
  if (floats <= scores_capacity_) return;
  const int64_t cap = std::max(floats, 2 * scores_capacity_);
  HIP_CHECK(hipStreamSynchronize(stream_.get()));
  scores_buffer_.allocate(2 * size_t(cap) * sizeof(float));
  scores_ = scores_buffer_.as<float>();
  att_ = scores_ + cap;
  scores_capacity_ = cap;
}

SequenceCache& HipBackend::cache_for(int seq) {
  auto it = caches_.find(seq);
  if (it != caches_.end()) return it->second;
  SequenceCache c;
  if (!free_caches_.empty()) {
    c = std::move(free_caches_.back());
    free_caches_.pop_back();
  } else {
    const size_t bytes = kv_cache_bytes(c_, max_context_);
    c.kv.allocate(bytes);
    HIP_CHECK(hipMemsetAsync(c.kv.as(), 0, bytes, stream_.get()));
    c.k = c.kv.as<float>();
    c.v = c.k + bytes / sizeof(float) / 2;
  }
  return caches_.emplace(seq, std::move(c)).first->second;
}

AttentionShape HipBackend::attention_shape(int layer) const {
  AttentionShape a;
  a.n_heads = c_.num_attention_heads;
  a.n_kv = c_.num_key_value_heads;
  a.head_dim = c_.head_dim;
  a.window = c_.sliding(layer) ? c_.sliding_window : 0;
  a.max_context = max_context_;
  a.layer = layer;
  a.scale = float(1.0 / std::sqrt(double(c_.head_dim)));
  return a;
}

void HipBackend::begin_step(const Batch& b) {
  sequences_.begin(b, c_, max_context_);  // validates; throws before anything changes
  const int B = b.rows();
  ensure_rows(B);
  std::vector<int64_t> offsets;
  const int64_t scores_floats = pack_scores(c_, b.positions, offsets);
  ensure_scores(scores_floats);
  rows_host_.resize(size_t(B));
  max_pos_ = 0;
  for (int r = 0; r < B; ++r) {
    SequenceCache& cache = cache_for(b.seqs[size_t(r)]);
    StepRow& row = rows_host_[size_t(r)];
    row.token = b.tokens[size_t(r)];
    row.pos = b.positions[size_t(r)];
    row.scores_offset = offsets[size_t(r)];
    row.k_cache = cache.k;
    row.v_cache = cache.v;
    max_pos_ = std::max(max_pos_, row.pos);
  }
  // The pinned staging rows may still be in flight from the previous step's upload.
  HIP_CHECK(hipEventSynchronize(rows_uploaded_.get()));
  std::copy(rows_host_.begin(), rows_host_.end(), rows_pinned_.as<StepRow>());
  HIP_CHECK(hipMemcpyAsync(rows_dev_.as(), rows_pinned_.as<StepRow>(), size_t(B) * sizeof(StepRow),
                           hipMemcpyHostToDevice, stream_.get()));
  HIP_CHECK(hipEventRecord(rows_uploaded_.get(), stream_.get()));
  batch_ = b;
  ran_.reset();
  overwritten_.reset();
}

void HipBackend::gemv(const DeviceLinear& l, Stage in, Stage out_stage, GemvResidual residual) {
  const GemvSegment seg{l.w, l.bias, 0};
  launch_f32_gemv_bias(std::span<const GemvSegment>(&seg, 1), out(in), l.w.cols, batch_.rows(),
                       out(out_stage), l.w.rows, residual, stream_.get());
}

void HipBackend::run(Stage s, int layer) {
  if (batch_.rows() == 0) fail("hip backend: run({}) before begin_step", parity::name(s));
  if (is_model_scope(s) ? layer != kModelLayer : (layer < 0 || layer >= c_.num_hidden_layers))
    fail("hip backend: run({}) at layer {}: out of range", parity::name(s), layer);
  const int B = batch_.rows();
  const int H = c_.hidden_size, k = c_.num_experts_per_tok, I = c_.intermediate_size;
  const float alpha = float(c_.swiglu_alpha), limit = float(c_.swiglu_limit);
  const float eps = float(c_.rms_norm_eps);
  const hipStream_t st = stream_.get();
  const auto* rows = rows_dev_.as<const StepRow>();
  const DeviceLayer* L = layer >= 0 ? &layers_[size_t(layer)] : nullptr;
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
      launch_f32_embedding_gather(embed_, rows, B, out(s), st);
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
                                     c_.num_key_value_heads, c_.head_dim, inv_freq_.as<float>(),
                                     concentration_, out(Stage::q_rope), out(Stage::k_rope),
                                     out(Stage::v), st);
      break;
    case Stage::k_rope:
    case Stage::v:
      break;  // written by q_rope's kernel
    case Stage::scores: {
      const AttentionShape a = attention_shape(layer);
      launch_f32_kv_cache_append(a, rows, B, out(Stage::k_rope), out(Stage::v), st);
      launch_f32_attention_scores(a, rows, B, max_pos_, out(Stage::q_rope), L->sinks, scores_, st);
      break;
    }
    case Stage::att:
      launch_f32_softmax_with_sink(c_.num_attention_heads, rows, B, scores_, att_, st);
      break;
    case Stage::attn_out:
      launch_f32_attention_pv(attention_shape(layer), rows, B, max_pos_, att_,
                              act_.as<float>(workspace_offset_), out(s), st);
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
      launch_f32_rmsnorm(out(Stage::resid_ffn), final_norm_.type, final_norm_.data, B, H, eps,
                         out(s), st);
      break;
    case Stage::logits:
      gemv({lm_head_, nullptr}, Stage::final_norm, s);
      break;
    case Stage::sampled:
      launch_f32_argmax(out(Stage::logits), B, c_.vocab_size, index_out(s), st);
      break;
  }
}

StageData HipBackend::read(Stage s, int layer, int row) {
  if (row < 0 || row >= batch_.rows())
    fail("hip backend: read({}) row {} of {}", parity::name(s), row, batch_.rows());
  if (!ran_.test(size_t(s)) || ran_layer_[size_t(s)] != layer)
    fail("hip backend: read({}, layer {}) before that stage ran in this step", parity::name(s),
         layer);
  StageData d;
  d.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
  size_t n = 1;
  for (size_t x : d.dims) n *= x;
  const hipStream_t st = stream_.get();
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
  if (row < 0 || row >= batch_.rows())
    fail("hip backend: write({}) row {} of {}", parity::name(s), row, batch_.rows());
  if (!ran_.test(size_t(s)) || ran_layer_[size_t(s)] != layer)
    fail("hip backend: write({}, layer {}) before that stage ran in this step", parity::name(s),
         layer);
  size_t n = 1;
  for (size_t x : stage_dims(c_, s, batch_.positions[size_t(row)])) n *= x;
  if (data.size() != n)
    fail("write {}: {} values for a row of {}", parity::name(s), data.size(), n);
  const hipStream_t st = stream_.get();
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

bool device_available() {
  return device_unavailable_reason().empty();
}

std::string device_unavailable_reason() {
  int n = 0;
  const hipError_t err = hipGetDeviceCount(&n);
  if (err != hipSuccess) {
    (void)hipGetLastError();  // clear the sticky runtime error
    return device::error_text(err);
  }
  return n > 0 ? std::string() : std::string("no devices");
}

std::unique_ptr<Backend> make_hip_backend(const Model& m) {
  return std::make_unique<device::HipBackend>(m);
}

double device_copy_bandwidth_gbs(size_t bytes, int reps) {
  if (bytes == 0 || reps <= 0) fail("copy bandwidth: {} bytes, {} repetitions", bytes, reps);
  device::DeviceBuffer src(bytes), dst(bytes);
  device::Stream stream;
  HIP_CHECK(hipMemsetAsync(src.as(), 0x5a, bytes, stream.get()));  // never time on untouched pages
  hipEvent_t start = nullptr, stop = nullptr;
  HIP_CHECK(hipEventCreate(&start));
  HIP_CHECK(hipEventCreate(&stop));
  std::vector<double> seconds;
  for (int i = 0; i <= reps; ++i) {  // the first copy is the warm-up
    HIP_CHECK(hipEventRecord(start, stream.get()));
    HIP_CHECK(hipMemcpyAsync(dst.as(), src.as(), bytes, hipMemcpyDeviceToDevice, stream.get()));
    HIP_CHECK(hipEventRecord(stop, stream.get()));
    HIP_CHECK(hipEventSynchronize(stop));
    float ms = 0;
    HIP_CHECK(hipEventElapsedTime(&ms, start, stop));
    if (i > 0) seconds.push_back(double(ms) / 1e3);
  }
  (void)hipEventDestroy(start);
  (void)hipEventDestroy(stop);
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * double(bytes) / seconds[seconds.size() / 2] / 1e9;
}

}  // namespace parity
