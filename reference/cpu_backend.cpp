// The CPU backends over the forward graph: CpuBackend<double> is `reference`, CpuBackend<float>
// is `cpu-f32`. Activations are kept per row of the current batch; the KV cache per sequence.
#include "reference/cpu_backend.h"

#include <omp.h>

#include <cmath>
#include <array>
#include <limits>
#include <map>
#include <optional>
#include <span>

#include "model/error.h"
#include "reference/ops.h"

namespace parity {
namespace {

template <typename T>
constexpr StageData::Type data_type() {
  return std::is_same_v<T, double> ? StageData::Type::F64 : StageData::Type::F32;
}

template <typename T>
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Model& m) : m_(m), c_(m.config) {
    const Rope r = Rope::from_config(c_);
    for (double f : r.inv_freq) inv_freq_.push_back(T(f));
    concentration_ = T(r.concentration);
    for (const auto& l : m.layers) {
      LayerVectors v;
      v.attn_norm.resize(size_t(c_.hidden_size));
      v.ffn_norm.resize(size_t(c_.hidden_size));
      v.sinks.resize(size_t(c_.num_attention_heads));
      read_vector(*l.attn_norm, v.attn_norm.data());
      read_vector(*l.ffn_norm, v.ffn_norm.data());
      read_vector(*l.sinks, v.sinks.data());
      layer_vectors_.push_back(std::move(v));
    }
    final_norm_.resize(size_t(c_.hidden_size));
    read_vector(*m.final_norm, final_norm_.data());
  }

  std::string name() const override { return std::is_same_v<T, double> ? "reference" : "cpu-f32"; }
  std::string precision() const override {
    return std::is_same_v<T, double>
               ? "weights exact (BF16/MXFP4 decoded), activations and accumulation in float64"
               : "weights exact (BF16/MXFP4 decoded), activations and accumulation in float32";
  }
  // cpu-f32's exp, sin, cos and sqrt are the C library's float functions (within 1 ulp in
  // glibc); the policy allows 4.
  PrecisionPolicy precision_policy() const override {
    return std::is_same_v<T, double> ? PrecisionPolicy::float64() : PrecisionPolicy::float32(4);
  }
  nlohmann::json facts() const override {
    return {{"device", "cpu"}, {"omp_max_threads", omp_get_max_threads()}};
  }
  const Config& config() const override { return c_; }

  void begin_step(const Batch& b) override {
    const auto steps =
        check_batch(b, c_, c_.max_position_embeddings, [&](int seq) { return cached(seq); });
    // Re-running a sequence from an earlier position drops the later cache.
    for (const auto& [seq, step] : steps) truncate(seq, step.first);
    batch_ = b;
    for (auto& rows : out_) rows.assign(size_t(b.rows()), {});
    for (auto& rows : idx_) rows.assign(size_t(b.rows()), {});
  }

  void run(Stage s, int layer) override {
    const int B = batch_.rows();
    int max_pos = 0;
    for (int32_t p : batch_.positions) max_pos = std::max(max_pos, int(p));
    // Attention over the step's rows in parallel when there is enough of it (see kParallelMacs).
    const bool rows_in_parallel =
        B > 1 && ref::worth_threads(int64_t(B) * c_.num_attention_heads * (max_pos + 1) * c_.head_dim);
    const int H = c_.hidden_size, d = c_.head_dim, nH = c_.num_attention_heads,
              nKV = c_.num_key_value_heads, k = c_.num_experts_per_tok, I = c_.intermediate_size;
    const LayerWeights* lw = layer >= 0 ? &m_.layers[size_t(layer)] : nullptr;
    const LayerVectors* lv = layer >= 0 ? &layer_vectors_[size_t(layer)] : nullptr;
    switch (s) {
      case Stage::embedding:
        for (int r = 0; r < B; ++r)
          ref::embedding(*m_.embed, batch_.tokens[size_t(r)], alloc(s, r, H));
        break;
      case Stage::attn_norm:
        for (int r = 0; r < B; ++r)
          ref::rmsnorm(residual(layer, r), lv->attn_norm.data(), H, c_.rms_norm_eps,
                       alloc(s, r, H));
        break;
      case Stage::qkv: {
        // q, k and v projections written side by side: [q (nH d) | k (nKV d) | v (nKV d)].
        const int qd = c_.q_dim(), kvd = c_.kv_dim();
        std::vector<T> x = gather(Stage::attn_norm, H), yq(size_t(B) * qd), yk(size_t(B) * kvd),
                       yv(size_t(B) * kvd);
        ref::linear(lw->q, x.data(), B, yq.data());
        ref::linear(lw->k, x.data(), B, yk.data());
        ref::linear(lw->v, x.data(), B, yv.data());
        for (int r = 0; r < B; ++r) {
          T* o = alloc(s, r, c_.qkv_dim());
          std::copy_n(yq.data() + size_t(r) * qd, qd, o);
          std::copy_n(yk.data() + size_t(r) * kvd, kvd, o + qd);
          std::copy_n(yv.data() + size_t(r) * kvd, kvd, o + qd + kvd);
        }
        break;
      }
      case Stage::q_rope:
        for (int r = 0; r < B; ++r) {
          T* q = alloc(s, r, nH * d);
          std::copy_n(get(Stage::qkv, r), nH * d, q);
          ref::rope(q, nH, d, batch_.positions[size_t(r)], inv_freq_, concentration_);
        }
        break;
      case Stage::k_rope:
        for (int r = 0; r < B; ++r) {
          T* kk = alloc(s, r, nKV * d);
          std::copy_n(get(Stage::qkv, r) + nH * d, nKV * d, kk);
          ref::rope(kk, nKV, d, batch_.positions[size_t(r)], inv_freq_, concentration_);
        }
        break;
      case Stage::v:
        for (int r = 0; r < B; ++r)
          std::copy_n(get(Stage::qkv, r) + (nH + nKV) * d, nKV * d, alloc(s, r, nKV * d));
        break;
      case Stage::scores:
        for (int r = 0; r < B; ++r) {  // the cache write: every row of the step first
          Cache& cache = caches_[batch_.seqs[size_t(r)]];
          const size_t at = size_t(batch_.positions[size_t(r)]) * nKV * d;
          auto& kc = cache.k[size_t(layer)];
          auto& vc = cache.v[size_t(layer)];
          if (kc.size() < at + size_t(nKV * d)) kc.resize(at + size_t(nKV * d));
          if (vc.size() < at + size_t(nKV * d)) vc.resize(at + size_t(nKV * d));
          std::copy_n(get(Stage::k_rope, r), nKV * d, kc.begin() + long(at));
          std::copy_n(get(Stage::v, r), nKV * d, vc.begin() + long(at));
        }
        // Rows in parallel when the step has several (each row's heads then run on one
        // thread; a single row runs its heads in parallel inside the op). One thread computes
        // each element in a fixed order either way.
#pragma omp parallel for schedule(dynamic) if (rows_in_parallel)
        for (int r = 0; r < B; ++r) {
          const int pos = batch_.positions[size_t(r)];
          ref::attention_scores(
              get(Stage::q_rope, r), caches_.at(batch_.seqs[size_t(r)]).k[size_t(layer)].data(),
              lv->sinks.data(), nH, nKV, d, pos, window(layer), alloc(s, r, nH * (pos + 2)));
        }
        break;
      case Stage::att:
#pragma omp parallel for schedule(dynamic) if (rows_in_parallel)
        for (int r = 0; r < B; ++r) {
          const int cols = batch_.positions[size_t(r)] + 2;
          ref::softmax_with_sink(get(Stage::scores, r), nH, cols, alloc(s, r, nH * cols));
        }
        break;
      case Stage::attn_out:
#pragma omp parallel for schedule(dynamic) if (rows_in_parallel)
        for (int r = 0; r < B; ++r)
          ref::attention_output(get(Stage::att, r),
                                caches_.at(batch_.seqs[size_t(r)]).v[size_t(layer)].data(), nH,
                                nKV, d, batch_.positions[size_t(r)], alloc(s, r, nH * d));
        break;
      case Stage::o_proj:
        project(lw->o, Stage::attn_out, s);
        break;
      case Stage::resid_attn:
        for (int r = 0; r < B; ++r)
          add(residual(layer, r), get(Stage::o_proj, r), H, alloc(s, r, H));
        break;
      case Stage::ffn_norm:
        for (int r = 0; r < B; ++r)
          ref::rmsnorm(get(Stage::resid_attn, r), lv->ffn_norm.data(), H, c_.rms_norm_eps,
                       alloc(s, r, H));
        break;
      case Stage::router:
        project(lw->router, Stage::ffn_norm, s);
        break;
      case Stage::topk_idx:
        for (int r = 0; r < B; ++r)
          ref::router_topk(get(Stage::router, r), c_.num_local_experts, k, alloc_idx(s, r, k));
        break;
      case Stage::topk_w:
        for (int r = 0; r < B; ++r)
          ref::topk_softmax(get(Stage::router, r), get_idx(Stage::topk_idx, r), k, alloc(s, r, k));
        break;
      case Stage::mlp1: {
        // Every (row, slot) of the step at once, grouped by expert: each weight row is decoded
        // once per step, not once per token.
        std::vector<ref::ExpertJob<T>> jobs;
        for (int r = 0; r < B; ++r) {
          T* h = alloc(s, r, k * 2 * I);
          for (int slot = 0; slot < k; ++slot)
            jobs.push_back({expert(r, slot), get(Stage::ffn_norm, r), h + size_t(slot) * 2 * I});
        }
        ref::expert_linear_batch(lw->mlp1, std::span<const ref::ExpertJob<T>>(jobs));
        break;
      }
      case Stage::swiglu:
        for (int r = 0; r < B; ++r) {
          T* a = alloc(s, r, k * I);
          for (int slot = 0; slot < k; ++slot)
            ref::swiglu(get(Stage::mlp1, r) + size_t(slot) * 2 * I, I, T(c_.swiglu_alpha),
                        T(c_.swiglu_limit), a + size_t(slot) * I);
        }
        break;
      case Stage::mlp2: {
        std::vector<ref::ExpertJob<T>> jobs;
        for (int r = 0; r < B; ++r) {
          T* y = alloc(s, r, k * H);
          for (int slot = 0; slot < k; ++slot)
            jobs.push_back(
                {expert(r, slot), get(Stage::swiglu, r) + size_t(slot) * I, y + size_t(slot) * H});
        }
        ref::expert_linear_batch(lw->mlp2, std::span<const ref::ExpertJob<T>>(jobs));
        break;
      }
      case Stage::moe_out:
        for (int r = 0; r < B; ++r)
          ref::moe_sum(get(Stage::topk_w, r), get(Stage::mlp2, r), k, H, alloc(s, r, H));
        break;
      case Stage::resid_ffn:
        for (int r = 0; r < B; ++r)
          add(get(Stage::resid_attn, r), get(Stage::moe_out, r), H, alloc(s, r, H));
        break;
      case Stage::final_norm:
        for (int r = 0; r < B; ++r)
          ref::rmsnorm(get(Stage::resid_ffn, r), final_norm_.data(), H, c_.rms_norm_eps,
                       alloc(s, r, H));
        break;
      case Stage::logits:
        project(m_.lm_head, Stage::final_norm, s);
        break;
      case Stage::sampled:
        for (int r = 0; r < B; ++r)
          ref::argmax(get(Stage::logits, r), c_.vocab_size, alloc_idx(s, r, 1));
        break;
    }
  }

  StageData read(Stage s, int /*layer*/, int row) override {
    StageData d;
    d.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
    if (info(s).kind == ValueKind::Index) {
      d.type = StageData::Type::I32;
      d.i32 = idx_[size_t(s)][size_t(row)];
      return d;
    }
    d.type = data_type<T>();
    const auto& v = out_[size_t(s)][size_t(row)];
    if constexpr (std::is_same_v<T, double>)
      d.f64 = v;
    else
      d.f32 = v;
    return d;
  }

  void write(Stage s, int /*layer*/, int row, const StageData& d) override {
    if (info(s).kind == ValueKind::Index) {
      auto& v = idx_[size_t(s)][size_t(row)];
      if (d.size() != v.size()) fail("write {}: {} values for a row of {}", parity::name(s), d.size(), v.size());
      const double limit = s == Stage::sampled ? c_.vocab_size : c_.num_local_experts;
      for (size_t i = 0; i < d.size(); ++i) {
        const double e = d.at(i);
        if (!(e >= 0 && e < limit)) fail("write {}: index {} out of range", parity::name(s), e);
        v[i] = int32_t(e);
      }
      return;
    }
    auto& v = out_[size_t(s)][size_t(row)];
    if (d.size() != v.size())
      fail("write {}: {} values for a row of {}", parity::name(s), d.size(), v.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = T(d.at(i));
  }

  // The reference's magnitude rows: per element, the sum of |terms| of its sum, from the row's
  // inputs as they are now (right after the stage ran).
  std::optional<StageData> magnitude(Stage s, int layer, int row) override {
    if constexpr (!std::is_same_v<T, double>) {
      return std::nullopt;
    } else {
      const int H = c_.hidden_size, d = c_.head_dim, nH = c_.num_attention_heads,
                nKV = c_.num_key_value_heads, k = c_.num_experts_per_tok, I = c_.intermediate_size;
      const LayerWeights* lw = layer >= 0 ? &m_.layers[size_t(layer)] : nullptr;
      const int pos = batch_.positions[size_t(row)];
      StageData m;
      m.type = StageData::Type::F64;
      m.dims = stage_dims(c_, s, pos);
      size_t n = 1;
      for (size_t x : m.dims) n *= x;
      m.f64.assign(n, 0.0);
      double* out = m.f64.data();
      switch (s) {
        case Stage::qkv: {
          const double* x = get(Stage::attn_norm, row);
          ref::linear_magnitude(lw->q, x, out);
          ref::linear_magnitude(lw->k, x, out + c_.q_dim());
          ref::linear_magnitude(lw->v, x, out + c_.q_dim() + c_.kv_dim());
          return m;
        }
        case Stage::o_proj:
          ref::linear_magnitude(lw->o, get(Stage::attn_out, row), out);
          return m;
        case Stage::router:
          ref::linear_magnitude(lw->router, get(Stage::ffn_norm, row), out);
          return m;
        case Stage::logits:
          ref::linear_magnitude(m_.lm_head, get(Stage::final_norm, row), out);
          return m;
        case Stage::mlp1:
          for (int slot = 0; slot < k; ++slot)
            ref::expert_linear_magnitude(lw->mlp1, expert(row, slot), get(Stage::ffn_norm, row),
                                         out + size_t(slot) * 2 * I);
          return m;
        case Stage::mlp2:
          for (int slot = 0; slot < k; ++slot)
            ref::expert_linear_magnitude(lw->mlp2, expert(row, slot),
                                         get(Stage::swiglu, row) + size_t(slot) * I,
                                         out + size_t(slot) * H);
          return m;
        case Stage::scores: {
          const Cache& cache = caches_.at(batch_.seqs[size_t(row)]);
          ref::attention_scores_magnitude(get(Stage::q_rope, row), cache.k[size_t(layer)].data(),
                                          layer_vectors_[size_t(layer)].sinks.data(), nH, nKV, d,
                                          pos, window(layer), out);
          return m;
        }
        case Stage::attn_out: {
          const Cache& cache = caches_.at(batch_.seqs[size_t(row)]);
          ref::attention_output_magnitude(get(Stage::att, row), cache.v[size_t(layer)].data(), nH,
                                          nKV, d, pos, out);
          return m;
        }
        default:
          return std::nullopt;
      }
    }
  }

  std::optional<StageData> bias(Stage s, int layer, int row) override {
    if constexpr (!std::is_same_v<T, double>) {
      return std::nullopt;
    } else {
      if (layer < 0) return std::nullopt;
      const LayerWeights& lw = m_.layers[size_t(layer)];
      StageData b;
      b.type = StageData::Type::F64;
      b.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
      size_t n = 1;
      for (size_t x : b.dims) n *= x;
      b.f64.assign(n, 0.0);
      double* out = b.f64.data();
      auto linear = [](const Linear& w, double* o) {
        if (w.bias != nullptr) read_vector(*w.bias, o);
      };
      auto experts = [&](const ExpertLinear& w) {
        for (int slot = 0; slot < c_.num_experts_per_tok; ++slot)
          read_row(*w.bias, expert(row, slot), w.out, out + size_t(slot) * size_t(w.out));
      };
      switch (s) {
        case Stage::qkv:
          linear(lw.q, out);
          linear(lw.k, out + c_.q_dim());
          linear(lw.v, out + c_.q_dim() + c_.kv_dim());
          break;
        case Stage::o_proj: linear(lw.o, out); break;
        case Stage::router: linear(lw.router, out); break;
        case Stage::mlp1: experts(lw.mlp1); break;
        case Stage::mlp2: experts(lw.mlp2); break;
        default: return std::nullopt;
      }
      for (double& x : b.f64) x = std::fabs(x);
      return b;
    }
  }

  std::optional<KvRows> cache_rows(int seq, int layer, int first, int count) override {
    const auto it = caches_.find(seq);
    const size_t kv = size_t(c_.kv_dim());
    if (it == caches_.end() || layer < 0 || layer >= c_.num_hidden_layers || first < 0 || count < 0 ||
        size_t(first + count) * kv > it->second.k[size_t(layer)].size())
      fail("{}: cache rows {}..{} of sequence {}, layer {}: not cached", name(), first,
           first + count - 1, seq, layer);
    KvRows r;
    r.count = count;
    const auto& k = it->second.k[size_t(layer)];
    const auto& v = it->second.v[size_t(layer)];
    r.k.assign(k.begin() + long(size_t(first) * kv), k.begin() + long(size_t(first + count) * kv));
    r.v.assign(v.begin() + long(size_t(first) * kv), v.begin() + long(size_t(first + count) * kv));
    return r;
  }

  // attn_out from another backend's att row and value rows: the same sum as run()'s, in T, and
  // its magnitude in float64, over the keys the layer lets the row see (its window's: a key
  // outside it has no probability in a right att row, and the attention kernels never read it,
  // so mass an upstream bug put there is that bug's, not attn_out's).
  std::optional<std::pair<StageData, StageData>> recompute_row(Stage s, int layer, int position,
                                                               const std::vector<StageData>& inputs,
                                                               const KvRows& cache) override {
    const int nH = c_.num_attention_heads, nKV = c_.num_key_value_heads, d = c_.head_dim;
    if (s != Stage::attn_out) return std::nullopt;
    const size_t cols = size_t(position) + 2;
    if (layer < 0 || layer >= c_.num_hidden_layers || position < 0 || inputs.size() != 1 ||
        inputs[0].size() != size_t(nH) * cols || cache.count <= position ||
        cache.v.size() != size_t(cache.count) * size_t(c_.kv_dim()))
      fail(
          "{}: recompute of attn_out at layer {}, position {}: {} input rows, att of {} values "
          "(a row is {}), {} cached positions",
          name(), layer, position, inputs.size(), inputs.empty() ? 0 : inputs[0].size(),
          size_t(nH) * cols, cache.count);
    const int first = window(layer) > 0 ? std::max(0, position - window(layer) + 1) : 0;
    std::vector<double> pd(inputs[0].size());
    for (size_t i = 0; i < pd.size(); ++i) pd[i] = int(i % cols) < first ? 0.0 : inputs[0].at(i);
    const auto prefix_end = cache.v.begin() + long(size_t(position + 1) * size_t(c_.kv_dim()));
    std::vector<T> probs(pd.begin(), pd.end()), v(cache.v.begin(), prefix_end);
    std::vector<T> out(size_t(nH) * size_t(d));
    ref::attention_output(probs.data(), v.data(), nH, nKV, d, position, out.data());
    StageData o, m;
    o.dims = m.dims = stage_dims(c_, s, position);
    o.type = data_type<T>();
    if constexpr (std::is_same_v<T, double>)
      o.f64 = std::move(out);
    else
      o.f32 = std::move(out);
    m.type = StageData::Type::F64;
    m.f64.resize(size_t(nH) * size_t(d));
    ref::attention_output_magnitude(pd.data(), cache.v.data(), nH, nKV, d, position, m.f64.data());
    return std::pair{std::move(o), std::move(m)};
  }

  void load_cache(int seq, int layer, const KvRows& rows) override {
    const size_t kv = size_t(c_.kv_dim()), n = size_t(rows.count) * kv;
    if (layer < 0 || layer >= c_.num_hidden_layers || rows.count < 0 || rows.k.size() != n ||
        rows.v.size() != n)
      fail("{}: load_cache: {} rows of layer {} with {} and {} values (a row is {})", name(),
           rows.count, layer, rows.k.size(), rows.v.size(), kv);
    Cache& cache = caches_[seq];
    cache.k.resize(size_t(c_.num_hidden_layers));
    cache.v.resize(size_t(c_.num_hidden_layers));
    auto& k = cache.k[size_t(layer)];
    auto& v = cache.v[size_t(layer)];
    k.insert(k.end(), rows.k.begin(), rows.k.end());
    v.insert(v.end(), rows.v.begin(), rows.v.end());
  }

  void reset() override { caches_.clear(); }

 private:
  struct LayerVectors {
    std::vector<T> attn_norm, ffn_norm, sinks;
  };
  struct Cache {  // [pos][nKV][d] per layer, rotated keys and raw values
    std::vector<std::vector<T>> k, v;
  };

  T* alloc(Stage s, int r, int n) {
    auto& v = out_[size_t(s)][size_t(r)];
    v.assign(size_t(n), T(0));
    return v.data();
  }
  const T* get(Stage s, int r) const { return out_[size_t(s)][size_t(r)].data(); }
  int32_t* alloc_idx(Stage s, int r, int n) {
    auto& v = idx_[size_t(s)][size_t(r)];
    v.assign(size_t(n), 0);
    return v.data();
  }
  const int32_t* get_idx(Stage s, int r) const { return idx_[size_t(s)][size_t(r)].data(); }
  // Each layer's buffers hold the last layer run, so the residual entering `layer` is there.
  const T* residual(int layer, int r) const { return get(residual_input(layer).stage, r); }
  int expert(int r, int slot) const { return idx_[size_t(Stage::topk_idx)][size_t(r)][size_t(slot)]; }
  int window(int layer) const { return c_.sliding(layer) ? c_.sliding_window : 0; }
  std::vector<T> gather(Stage s, int n) const {
    std::vector<T> x(size_t(batch_.rows()) * n);
    for (int r = 0; r < batch_.rows(); ++r) std::copy_n(get(s, r), n, x.data() + size_t(r) * n);
    return x;
  }
  void project(const Linear& w, Stage in, Stage out) {
    std::vector<T> x = gather(in, w.in), y(size_t(batch_.rows()) * w.out);
    ref::linear(w, x.data(), batch_.rows(), y.data());
    for (int r = 0; r < batch_.rows(); ++r)
      std::copy_n(y.data() + size_t(r) * w.out, w.out, alloc(out, r, w.out));
  }
  static void add(const T* a, const T* b, int n, T* y) {
    for (int i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
  int cached(int seq) {
    auto it = caches_.find(seq);
    if (it == caches_.end()) return 0;
    return int(it->second.k[0].size() / size_t(c_.kv_dim()));
  }
  void truncate(int seq, int pos) {
    Cache& c = caches_[seq];
    c.k.resize(size_t(c_.num_hidden_layers));
    c.v.resize(size_t(c_.num_hidden_layers));
    for (auto& k : c.k) k.resize(std::min(k.size(), size_t(pos) * c_.kv_dim()));
    for (auto& v : c.v) v.resize(std::min(v.size(), size_t(pos) * c_.kv_dim()));
  }

  const Model& m_;
  const Config& c_;
  std::vector<T> inv_freq_;
  T concentration_;
  std::vector<LayerVectors> layer_vectors_;
  std::vector<T> final_norm_;
  Batch batch_;
  std::array<std::vector<std::vector<T>>, kNumStages> out_;        // real stages
  std::array<std::vector<std::vector<int32_t>>, kNumStages> idx_;  // index stages
  std::map<int, Cache> caches_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Model& m) {
  return std::make_unique<CpuBackend<double>>(m);
}
std::unique_ptr<Backend> make_cpu_f32_backend(const Model& m) {
  return std::make_unique<CpuBackend<float>>(m);
}

}  // namespace parity
