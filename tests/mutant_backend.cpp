// The host re-implementations of the mutated stages (see tests/mutant_backend.h). Each follows
// the math stated in reference/ops.h (gpt_oss/torch/model.py), written afresh rather than
// calling the reference ops, so that each bug is a switch in this file and nowhere else.
// Inputs and outputs are float32 rows, as the candidates store them; sums and elementary
// functions run in double and are rounded once when stored, so the re-implementation's own
// rounding stays far inside the derived bounds and any divergence is the bug's.
#include "tests/mutant_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "model/error.h"
#include "model/numerics.h"

namespace parity::test {
namespace {

constexpr Stage kSwiglu[] = {Stage::swiglu};
constexpr Stage kAttnNorm[] = {Stage::attn_norm};
constexpr Stage kRope[] = {Stage::q_rope, Stage::k_rope};
constexpr Stage kRopeK[] = {Stage::k_rope};
constexpr Stage kScores[] = {Stage::scores};
constexpr Stage kAtt[] = {Stage::att};
constexpr Stage kMlp1[] = {Stage::mlp1};
constexpr Stage kExpertBias[] = {Stage::mlp2, Stage::moe_out};
constexpr Stage kTopkW[] = {Stage::topk_w};
constexpr Stage kTopkIdx[] = {Stage::topk_idx};
constexpr Stage kOProj[] = {Stage::o_proj};
constexpr Stage kResidAttn[] = {Stage::resid_attn};
constexpr Stage kLogits[] = {Stage::logits};

constexpr MutationInfo kMutations[] = {
    {Mutation::swiglu_gate_clamped_both_sides, "swiglu_gate_clamped_both_sides", kSwiglu},
    {Mutation::swiglu_without_linear_plus_one, "swiglu_without_linear_plus_one", kSwiglu},
    {Mutation::swiglu_silu_gate, "swiglu_silu_gate", kSwiglu},
    {Mutation::swiglu_halves_not_interleaved, "swiglu_halves_not_interleaved", kSwiglu},
    {Mutation::rmsnorm_eps_1e6, "rmsnorm_eps_1e6", kAttnNorm},
    {Mutation::attn_norm_with_ffn_norm_weights, "attn_norm_with_ffn_norm_weights", kAttnNorm},
    {Mutation::rope_interleaved_pairs, "rope_interleaved_pairs", kRope},
    {Mutation::yarn_bounds_truncated, "yarn_bounds_truncated", kRope},
    {Mutation::rope_without_concentration, "rope_without_concentration", kRope},
    {Mutation::sink_of_next_head, "sink_of_next_head", kScores},
    {Mutation::sink_scaled_by_score_scale, "sink_scaled_by_score_scale", kScores},
    {Mutation::sliding_window_one_key_too_many, "sliding_window_one_key_too_many", kScores},
    {Mutation::gqa_head_modulo, "gqa_head_modulo", kScores},
    {Mutation::softmax_without_sink, "softmax_without_sink", kAtt},
    {Mutation::k_rope_bf16_truncated, "k_rope_bf16_truncated", kRopeK},
    {Mutation::mxfp4_mlp1_nibbles_swapped, "mxfp4_mlp1_nibbles_swapped", kMlp1},
    {Mutation::expert_bias_after_routing_weight, "expert_bias_after_routing_weight", kExpertBias},
    {Mutation::router_softmax_over_all_experts, "router_softmax_over_all_experts", kTopkW},
    {Mutation::topk_ascending, "topk_ascending", kTopkIdx},
    {Mutation::o_proj_without_bias, "o_proj_without_bias", kOProj},
    {Mutation::resid_attn_without_residual, "resid_attn_without_residual", kResidAttn},
    {Mutation::lm_head_tied_to_embedding, "lm_head_tied_to_embedding", kLogits},
};
static_assert(std::size(kMutations) == size_t(Mutation::lm_head_tied_to_embedding) + 1,
              "one entry per mutation, in enum order");

StageData f32_row(std::vector<size_t> dims, std::vector<float> values) {
  StageData d;
  d.type = StageData::Type::F32;
  d.dims = std::move(dims);
  d.f32 = std::move(values);
  return d;
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Round toward zero to bfloat16: the high 16 bits kept, the low 16 dropped.
float truncate_to_bf16(float x) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
}

std::vector<float> dense_row(const TensorView& t, int64_t row, int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  read_row(t, row, n, w.data());
  return w;
}

// y (rows,) = W x + b for a [rows, n] matrix, b optional.
std::vector<float> matvec(const TensorView& w, const TensorView* bias, int rows, int n,
                          const std::vector<float>& x) {
  std::vector<float> b;
  if (bias != nullptr) b = dense_row(*bias, 0, rows);
  std::vector<float> y(static_cast<size_t>(rows));
  for (int j = 0; j < rows; ++j) {
    const std::vector<float> wj = dense_row(w, j, n);
    double acc = bias != nullptr ? double(b[size_t(j)]) : 0.0;
    for (int k = 0; k < n; ++k) acc += double(wj[size_t(k)]) * double(x[size_t(k)]);
    y[size_t(j)] = float(acc);
  }
  return y;
}

// Row `row` of W[expert]. MXFP4 packs elements 2j and 2j+1 of a block into byte j, the even one
// in the low nibble; `high_nibble_even` is the swapped reading.
std::vector<float> expert_weight_row(const ExpertLinear& w, int expert, int row,
                                     bool high_nibble_even) {
  std::vector<float> out(size_t(w.in));
  if (w.layout != ExpertLayout::Mxfp4) {
    if (high_nibble_even)
      fail("the MXFP4 nibble-swap mutation needs MXFP4 experts, not {}",
           expert_layout_name(w.layout));
    read_expert_row(w, expert, row, out.data());
    return out;
  }
  const int groups = w.in / kMxfp4Block;
  const size_t r = size_t(expert) * size_t(w.out) + size_t(row);
  const uint8_t* blocks = w.blocks->data + r * size_t(groups) * kMxfp4BlockBytes;
  const uint8_t* scales = w.scales->data + r * size_t(groups);
  for (int g = 0; g < groups; ++g) {
    const double scale = e8m0_to_double(scales[g]);
    for (int j = 0; j < kMxfp4BlockBytes; ++j) {
      const uint8_t byte = blocks[size_t(g) * kMxfp4BlockBytes + size_t(j)];
      const uint8_t even = high_nibble_even ? byte >> 4 : byte & 0x0f;
      const uint8_t odd = high_nibble_even ? byte & 0x0f : byte >> 4;
      out[size_t(g) * kMxfp4Block + 2 * size_t(j)] = float(kFp4Values[even] * scale);
      out[size_t(g) * kMxfp4Block + 2 * size_t(j) + 1] = float(kFp4Values[odd] * scale);
    }
  }
  return out;
}

// The YaRN tables of gpt_oss/torch/model.py RotaryEmbedding: per rotary pair i the inverse
// frequency, blended between theta^(-2i/d) and that over `factor` by a ramp between the
// correction dims `low` and `high`; and the concentration 0.1 ln(factor) + 1 on cos and sin.
struct YarnTable {
  std::vector<double> inv_freq;
  double concentration = 1;
};

YarnTable yarn_table(const Config& c, bool truncate_bounds) {
  YarnTable t;
  const int half = c.head_dim / 2;
  const double d = c.head_dim;
  t.inv_freq.resize(size_t(half));
  if (c.rope_type != "yarn" || c.rope_factor <= 1.0) {
    for (int i = 0; i < half; ++i) t.inv_freq[size_t(i)] = std::pow(c.rope_theta, -2.0 * i / d);
    return t;
  }
  const auto correction_dim = [&](double rotations) {
    return d / 2 * std::log(c.rope_original_max_position / (rotations * 2 * std::numbers::pi)) /
           std::log(c.rope_theta);
  };
  double low = correction_dim(c.rope_beta_fast), high = correction_dim(c.rope_beta_slow);
  if (truncate_bounds) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  for (int i = 0; i < half; ++i) {
    const double extrapolation = std::pow(c.rope_theta, -2.0 * i / d);
    const double interpolation = extrapolation / c.rope_factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    t.inv_freq[size_t(i)] = interpolation * ramp + extrapolation * (1 - ramp);
  }
  t.concentration = 0.1 * std::log(c.rope_factor) + 1.0;
  return t;
}

struct RopeBugs {
  bool interleaved_pairs = false;
  bool truncated_bounds = false;
  bool without_concentration = false;
};

// Rotates `heads` heads of size d at `pos`: pair i is (i, i + d/2) (half-split, NeoX), or
// (2i, 2i + 1) with the interleaved-pairs bug.
std::vector<float> rotate(const Config& c, const std::vector<float>& x, int heads, int pos,
                          const RopeBugs& bugs) {
  const YarnTable t = yarn_table(c, bugs.truncated_bounds);
  const double conc = bugs.without_concentration ? 1.0 : t.concentration;
  const int d = c.head_dim, half = d / 2;
  std::vector<float> out(x.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i) {
      const double angle = pos * t.inv_freq[size_t(i)];
      const double cs = std::cos(angle) * conc, sn = std::sin(angle) * conc;
      const size_t a = size_t(h) * d + size_t(bugs.interleaved_pairs ? 2 * i : i);
      const size_t b = bugs.interleaved_pairs ? a + 1 : a + size_t(half);
      out[a] = float(x[a] * cs - x[b] * sn);
      out[b] = float(x[b] * cs + x[a] * sn);
    }
  return out;
}

}  // namespace

std::span<const MutationInfo> all_mutations() {
  return kMutations;
}

const MutationInfo& mutation_info(Mutation m) {
  return kMutations[size_t(m)];
}

MutantBackend::MutantBackend(std::unique_ptr<Backend> inner, const Model& model,
                             MutantOptions options)
    : ForwardingBackend(std::move(inner)),
      model_(model),
      c_(this->inner().config()),
      options_(options) {
  if (options_.layer && (*options_.layer < 0 || *options_.layer >= c_.num_hidden_layers))
    fail("mutant: layer {} is out of range (0..{})", *options_.layer, c_.num_hidden_layers - 1);
}

std::string MutantBackend::name() const {
  return inner().name() +
         (options_.with_bug ? " with bug " : " with the bug-free recomputation of ") +
         std::string(mutation_info(options_.mutation).name);
}

nlohmann::json MutantBackend::facts() const {
  nlohmann::json j = inner().facts();
  j["mutation"] = mutation_info(options_.mutation).name;
  j["mutation_bug"] = options_.with_bug;
  j["mutated_layer"] = options_.layer ? nlohmann::json(*options_.layer) : nlohmann::json("all");
  return j;
}

void MutantBackend::begin_step(const Batch& batch) {
  inner().begin_step(batch);
  batch_ = batch;
  // A sequence restarting at an earlier position drops its later keys, as the caches do.
  std::map<int, int> first;
  for (int r = 0; r < batch.rows(); ++r) {
    const auto [it, fresh] = first.emplace(batch.seqs[size_t(r)], batch.positions[size_t(r)]);
    if (!fresh) it->second = std::min(it->second, batch.positions[size_t(r)]);
  }
  for (const auto& [seq, pos] : first)
    for (auto& [layer, rows] : keys_[seq]) rows.resize(std::min(rows.size(), size_t(pos)));
}

void MutantBackend::reset() {
  inner().reset();
  keys_.clear();
}

std::vector<StageData> MutantBackend::partials(Stage s, int layer, int row) {
  if (mutates(s, layer)) return {};
  return inner().partials(s, layer, row);
}

bool MutantBackend::mutates(Stage s, int layer) const {
  const auto stages = mutation_info(options_.mutation).stages;
  if (std::find(stages.begin(), stages.end(), s) == stages.end()) return false;
  return layer == kModelLayer || !options_.layer || *options_.layer == layer;
}

void MutantBackend::run(Stage s, int layer) {
  const bool mutated = mutates(s, layer);
  // The step's k_rope rows, as scores is about to append them to the cache (replay rows hold
  // the reference's by now).
  if (mutated && s == Stage::scores) remember_keys(layer);
  inner().run(s, layer);
  if (!mutated) return;
  for (int r = 0; r < batch_.rows(); ++r) inner().write(s, layer, r, recompute(s, layer, r));
}

std::vector<float> MutantBackend::input(Stage s, int layer, int row) {
  const StageData d = inner().read(s, layer, row);
  std::vector<float> v(d.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(d.at(i));
  return v;
}

void MutantBackend::remember_keys(int layer) {
  for (int r = 0; r < batch_.rows(); ++r) {
    auto& rows = keys_[batch_.seqs[size_t(r)]][layer];
    const size_t pos = size_t(batch_.positions[size_t(r)]);
    if (rows.size() <= pos) rows.resize(pos + 1);
    rows[pos] = input(Stage::k_rope, layer, r);
  }
}

StageData MutantBackend::recompute(Stage s, int layer, int row) {
  const Mutation m = options_.mutation;
  const auto bug = [&](Mutation which) { return options_.with_bug && m == which; };
  const int pos = batch_.positions[size_t(row)];
  const std::vector<size_t> dims = stage_dims(c_, s, pos);
  const int H = c_.hidden_size, d = c_.head_dim, nH = c_.num_attention_heads,
            nKV = c_.num_key_value_heads, k = c_.num_experts_per_tok, I = c_.intermediate_size,
            E = c_.num_local_experts;
  const LayerWeights* lw = layer >= 0 ? &model_.layers[size_t(layer)] : nullptr;

  switch (s) {
    case Stage::attn_norm: {
      // y = x / sqrt(mean(x^2) + eps) * w (gpt_oss/torch/model.py RMSNorm).
      const StageRef in = residual_input(layer);
      const std::vector<float> x = input(in.stage, in.layer, row);
      std::vector<float> w(static_cast<size_t>(H));
      read_vector(bug(Mutation::attn_norm_with_ffn_norm_weights) ? *lw->ffn_norm : *lw->attn_norm,
                  w.data());
      const double eps = bug(Mutation::rmsnorm_eps_1e6) ? 1e-6 : c_.rms_norm_eps;
      double sq = 0;
      for (float v : x) sq += double(v) * v;
      const double r = 1.0 / std::sqrt(sq / H + eps);
      std::vector<float> y(static_cast<size_t>(H));
      for (int i = 0; i < H; ++i) y[size_t(i)] = float(x[size_t(i)] * r * w[size_t(i)]);
      return f32_row(dims, std::move(y));
    }
    case Stage::q_rope:
    case Stage::k_rope: {
      const bool is_q = s == Stage::q_rope;
      const std::vector<float> qkv = input(Stage::qkv, layer, row);
      const auto first = qkv.begin() + (is_q ? 0 : c_.q_dim());
      const std::vector<float> x(first, first + (is_q ? c_.q_dim() : c_.kv_dim()));
      const RopeBugs bugs{bug(Mutation::rope_interleaved_pairs),
                          bug(Mutation::yarn_bounds_truncated),
                          bug(Mutation::rope_without_concentration)};
      std::vector<float> y = rotate(c_, x, is_q ? nH : nKV, pos, bugs);
      if (bug(Mutation::k_rope_bf16_truncated))
        for (float& v : y) v = truncate_to_bf16(v);
      return f32_row(dims, std::move(y));
    }
    case Stage::scores: {
      // S[h][j] = q_h . k_{kv(h), j} / sqrt(d) for visible keys, -inf for masked ones; the last
      // column is head h's sink, in logit units already.
      const std::vector<float> q = input(Stage::q_rope, layer, row);
      const auto& keys = keys_.at(batch_.seqs[size_t(row)]).at(layer);
      std::vector<float> sinks(static_cast<size_t>(nH));
      read_vector(*lw->sinks, sinks.data());
      const int cols = pos + 2, group = nH / nKV;
      const double scale = 1.0 / std::sqrt(double(d));
      const int window = c_.sliding(layer) ? c_.sliding_window : 0;
      const int reach = bug(Mutation::sliding_window_one_key_too_many) ? window + 1 : window;
      std::vector<float> y(size_t(nH) * size_t(cols));
      for (int h = 0; h < nH; ++h) {
        const int kv = bug(Mutation::gqa_head_modulo) ? h % nKV : h / group;
        for (int j = 0; j <= pos; ++j) {
          float& out = y[size_t(h) * cols + size_t(j)];
          if (window > 0 && pos - j >= reach) {
            out = -std::numeric_limits<float>::infinity();
            continue;
          }
          const std::vector<float>& kj = keys.at(size_t(j));
          double dot = 0;
          for (int i = 0; i < d; ++i)
            dot += double(q[size_t(h) * d + size_t(i)]) * kj[size_t(kv) * d + size_t(i)];
          out = float(dot * scale);
        }
        double sink = sinks[size_t(bug(Mutation::sink_of_next_head) ? (h + 1) % nH : h)];
        if (bug(Mutation::sink_scaled_by_score_scale)) sink *= scale;
        y[size_t(h) * cols + size_t(pos) + 1] = float(sink);
      }
      return f32_row(dims, std::move(y));
    }
    case Stage::att: {
      // P = softmax over the keys and the sink column; the sink takes mass, has no value.
      const std::vector<float> scores = input(Stage::scores, layer, row);
      const int cols = pos + 2;
      const int summed = bug(Mutation::softmax_without_sink) ? cols - 1 : cols;
      std::vector<float> y(scores.size(), 0.0f);
      for (int h = 0; h < nH; ++h) {
        const float* sh = scores.data() + size_t(h) * cols;
        const double mx = *std::max_element(sh, sh + summed);
        double z = 0;
        for (int j = 0; j < summed; ++j) z += std::exp(sh[j] - mx);
        for (int j = 0; j < summed; ++j)
          y[size_t(h) * cols + size_t(j)] = float(std::exp(sh[j] - mx) / z);
      }
      return f32_row(dims, std::move(y));
    }
    case Stage::o_proj: {
      const std::vector<float> x = input(Stage::attn_out, layer, row);
      const TensorView* bias = bug(Mutation::o_proj_without_bias) ? nullptr : lw->o.bias;
      return f32_row(dims, matvec(*lw->o.weight, bias, lw->o.out, lw->o.in, x));
    }
    case Stage::resid_attn: {
      std::vector<float> y = input(Stage::o_proj, layer, row);
      if (!bug(Mutation::resid_attn_without_residual)) {
        const StageRef in = residual_input(layer);
        const std::vector<float> x = input(in.stage, in.layer, row);
        for (int i = 0; i < H; ++i) y[size_t(i)] = float(double(x[size_t(i)]) + y[size_t(i)]);
      }
      return f32_row(dims, std::move(y));
    }
    case Stage::topk_idx: {
      // The k largest router logits, descending, the lowest expert first among equal ones.
      const std::vector<float> g = input(Stage::router, layer, row);
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return g[size_t(a)] > g[size_t(b)]; });
      order.resize(size_t(k));
      if (bug(Mutation::topk_ascending)) std::reverse(order.begin(), order.end());
      StageData out;
      out.type = StageData::Type::I32;
      out.dims = dims;
      out.i32 = std::move(order);
      return out;
    }
    case Stage::topk_w: {
      // w = softmax of the k selected logits; the bug normalizes over all E instead.
      const std::vector<float> g = input(Stage::router, layer, row);
      const std::vector<float> idx = input(Stage::topk_idx, layer, row);
      std::vector<int> over;
      if (bug(Mutation::router_softmax_over_all_experts)) {
        over.resize(size_t(E));
        std::iota(over.begin(), over.end(), 0);
      } else {
        for (float e : idx) over.push_back(int(e));
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int e : over) mx = std::max(mx, double(g[size_t(e)]));
      double z = 0;
      for (int e : over) z += std::exp(g[size_t(e)] - mx);
      std::vector<float> w(static_cast<size_t>(k));
      for (int slot = 0; slot < k; ++slot)
        w[size_t(slot)] = float(std::exp(g[size_t(idx[size_t(slot)])] - mx) / z);
      return f32_row(dims, std::move(w));
    }
    case Stage::mlp1: {
      // h[slot] = W1[e] t + b1[e], e the slot's expert; rows interleaved (even gate, odd linear).
      const std::vector<float> t = input(Stage::ffn_norm, layer, row);
      const std::vector<float> idx = input(Stage::topk_idx, layer, row);
      const ExpertLinear& w = lw->mlp1;
      std::vector<float> y(size_t(k) * w.out);
      for (int slot = 0; slot < k; ++slot) {
        const int e = int(idx[size_t(slot)]);
        const std::vector<float> b = dense_row(*w.bias, e, w.out);
        for (int j = 0; j < w.out; ++j) {
          const std::vector<float> wj =
              expert_weight_row(w, e, j, bug(Mutation::mxfp4_mlp1_nibbles_swapped));
          double acc = b[size_t(j)];
          for (int i = 0; i < w.in; ++i) acc += double(wj[size_t(i)]) * t[size_t(i)];
          y[size_t(slot) * w.out + size_t(j)] = float(acc);
        }
      }
      return f32_row(dims, std::move(y));
    }
    case Stage::swiglu: {
      // a = g sigmoid(alpha g) (l + 1), g = min(h_gate, L), l = clamp(h_lin, -L, L)
      // (gpt_oss/torch/model.py swiglu, alpha = 1.702, L = 7).
      const std::vector<float> h = input(Stage::mlp1, layer, row);
      const double L = c_.swiglu_limit;
      const double alpha = bug(Mutation::swiglu_silu_gate) ? 1.0 : c_.swiglu_alpha;
      const double plus = bug(Mutation::swiglu_without_linear_plus_one) ? 0.0 : 1.0;
      const bool halves = bug(Mutation::swiglu_halves_not_interleaved);
      std::vector<float> a(size_t(k) * I);
      for (int slot = 0; slot < k; ++slot)
        for (int i = 0; i < I; ++i) {
          const float* hs = h.data() + size_t(slot) * 2 * I;
          const double hg = halves ? hs[i] : hs[2 * i];
          const double hl = halves ? hs[I + i] : hs[2 * i + 1];
          const double g = bug(Mutation::swiglu_gate_clamped_both_sides) ? std::clamp(hg, -L, L)
                                                                         : std::min(hg, L);
          const double l = std::clamp(hl, -L, L);
          a[size_t(slot) * I + size_t(i)] = float(g * sigmoid(alpha * g) * (l + plus));
        }
      return f32_row(dims, std::move(a));
    }
    case Stage::mlp2: {
      // y[slot] = W2[e] a[slot] + b2[e]; the bug leaves b2 to moe_out.
      const std::vector<float> a = input(Stage::swiglu, layer, row);
      const std::vector<float> idx = input(Stage::topk_idx, layer, row);
      const ExpertLinear& w = lw->mlp2;
      std::vector<float> y(size_t(k) * w.out);
      for (int slot = 0; slot < k; ++slot) {
        const int e = int(idx[size_t(slot)]);
        const std::vector<float> b = dense_row(*w.bias, e, w.out);
        for (int j = 0; j < w.out; ++j) {
          const std::vector<float> wj = expert_weight_row(w, e, j, false);
          double acc = bug(Mutation::expert_bias_after_routing_weight) ? 0.0 : double(b[size_t(j)]);
          for (int i = 0; i < w.in; ++i)
            acc += double(wj[size_t(i)]) * a[size_t(slot) * I + size_t(i)];
          y[size_t(slot) * w.out + size_t(j)] = float(acc);
        }
      }
      return f32_row(dims, std::move(y));
    }
    case Stage::moe_out: {
      // y = sum_s w_s mlp2[s]; the bug adds each expert's b2 after its routing weight.
      const std::vector<float> w = input(Stage::topk_w, layer, row);
      const std::vector<float> e_out = input(Stage::mlp2, layer, row);
      const std::vector<float> idx = input(Stage::topk_idx, layer, row);
      std::vector<double> acc(size_t(H), 0.0);
      for (int slot = 0; slot < k; ++slot) {
        for (int i = 0; i < H; ++i)
          acc[size_t(i)] += double(w[size_t(slot)]) * e_out[size_t(slot) * H + size_t(i)];
        if (bug(Mutation::expert_bias_after_routing_weight)) {
          const std::vector<float> b = dense_row(*lw->mlp2.bias, int(idx[size_t(slot)]), H);
          for (int i = 0; i < H; ++i) acc[size_t(i)] += b[size_t(i)];
        }
      }
      return f32_row(dims, std::vector<float>(acc.begin(), acc.end()));
    }
    case Stage::logits: {
      const std::vector<float> x = input(Stage::final_norm, kModelLayer, row);
      const TensorView& w =
          bug(Mutation::lm_head_tied_to_embedding) ? *model_.embed : *model_.lm_head.weight;
      return f32_row(dims, matvec(w, nullptr, c_.vocab_size, H, x));
    }
    default:
      fail("mutant: no host re-implementation of stage {}", parity::name(s));
  }
}

}  // namespace parity::test
