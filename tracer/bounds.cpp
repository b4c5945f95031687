// The derived error bounds, one function per stage kind (see tracer/bounds.h for the rounding
// model and the choice of lambda). Notation: u_s, u_a, u_e, u_b, F as in bounds.h; u_in the
// rounding between a stored input and the operand the arithmetic uses (StagePrecision::
// input_rounding: u_s (+ u_o) under replay, only a coarser operand's u_o under recompute); x_e
// = u_e where the stage materializes an intermediate coarser than its arithmetic (u_e > u_a),
// else 0 (the rounding is then inside the sum's or the operation's own); y the reference
// output, x its inputs, n the number of terms of a sum; S(n) = min(lambda sqrt(n), n).
// With the defaults (replay, u_e = u_a, no operand or bias rounding) every formula is the one
// format version 2 traces were judged by, but for S(n) below n = 16.
#include "tracer/bounds.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "model/error.h"

namespace parity {
namespace {

struct Units {
  double us, ua, ue, in, ub, F, lambda, angle, tiny;
  double xe() const { return ue > ua ? ue : 0.0; }  // a materialized coarser intermediate
  // Sums of n terms: lambda sqrt(n) (probabilistic), or n (the worst case) where smaller.
  double sum(double n) const {
    n = std::max(n, 1.0);
    return std::min(lambda * std::sqrt(n), n);
  }
};

Units units(const StagePrecision& p, const BoundOptions& o) {
  return {p.storage, p.accumulation, p.intermediate, p.input_rounding(o.own_inputs), p.bias,
          p.function_ulps, o.lambda, o.angle_ulps, p.min_normal};
}

double abs_at(const StageData& d, size_t i) { return std::fabs(d.at(i)); }

size_t elements(const StageData& d) { return d.size(); }

// A sum of n terms whose absolute values add to `mag`, `rounded` of its operands read from
// storage: S(n) u_a mag for the sum, (1 + u_in)^rounded - 1 (to second order) mag for the
// operands' rounding (a product of two rounded operands errs by up to 2 u_in + u_in^2: with
// BF16 operands on both sides the square is 2^-16, more than the float32 roundings of a
// one-term sum), and (u_a + u_s) |y| for one last operation (a bias, a scale) and the store.
double sum_bound(const Units& u, double n, double mag, double y, int rounded) {
  const double operands = rounded * u.in + rounded * (rounded - 1) / 2 * u.in * u.in;
  return (u.sum(n) * u.ua + operands) * mag + (u.ua + u.us) * std::fabs(y);
}

const StageData& magnitude_of(BoundSource& src, Stage s, int layer) {
  const StageData* m = src.magnitude(s, layer);
  if (m == nullptr) throw MissingBoundInput{{s, layer}, Series::magnitude};
  return *m;
}

void check_size(const StageData& a, size_t n, Stage s, const char* what) {
  if (a.size() != n)
    fail("stage {}: {} has {} values where {} were expected", name(s), what, a.size(), n);
}

// Projections: y_j = sum_k W[j][k] x[k] + b_j, n = fan_in + 1 terms; the weights are exact in
// every policy (checkpoint dtypes), x is read from storage. A sum rounded before its bias errs
// by u_b |y_j - b_j| more, at most u_b (|y_j| + |b_j|).
std::vector<double> projection(const Units& u, Stage s, int layer, double n, BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const StageData& m = magnitude_of(src, s, layer);
  check_size(m, elements(y), s, "the magnitude row");
  const StageData* bias = u.ub > 0 ? src.bias(s, layer) : nullptr;
  if (bias != nullptr) check_size(*bias, elements(y), s, "the bias row");
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = sum_bound(u, n, m.at(i), y.at(i), 1);
    // Without the bias row, the sum's magnitude bounds the sum before its bias.
    if (u.ub > 0) b[i] += u.ub * (bias != nullptr ? abs_at(y, i) + abs_at(*bias, i) : m.at(i));
  }
  return b;
}

// RMSNorm: y_i = x_i r w_i, r = 1 / sqrt(ms + eps), ms = sum x^2 / n. The sum of squares errs
// by (S(n) + 1) u_a ms (+ 2 u_in ms from x's rounding); r inherits half of its relative error,
// scaled by ms / (ms + eps), plus u_a / 2 (eps added) and F u_a (sqrt and division): r_rel,
// shared by the row. Each y_i adds u_in (x_i read) + 2 u_a (two products) + x_e (x_i r
// materialized before the weight) + u_s (stored): its own.
struct NormParts {
  double shared = 0, own = 0;
};
NormParts norm_parts(const Units& u, const Config& c, Stage s, int layer, BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const auto in = resolve_input(info(s).inputs[0], layer, c.num_hidden_layers);
  const StageData& x = src.output(in->stage, in->layer);
  check_size(x, elements(y), s, "its input");
  double sq = 0;
  for (size_t i = 0; i < x.size(); ++i) sq += x.at(i) * x.at(i);
  const double n = double(x.size()), ms = sq / n, eps = c.rms_norm_eps;
  const double ms_rel = (u.sum(n) + 1) * u.ua + 2 * u.in;
  const double r_rel = 0.5 * ms_rel * (ms / (ms + eps)) + 0.5 * u.ua + u.F * u.ua;
  return {r_rel, u.in + u.us + 2 * u.ua + u.xe()};
}

std::vector<double> rmsnorm(const Units& u, const Config& c, Stage s, int layer,
                            BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const NormParts parts = norm_parts(u, c, s, layer, src);
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) b[i] = abs_at(y, i) * (parts.shared + parts.own);
  return b;
}

// RoPE on q or k: out_i = x1 c - x2 s, out_{i+d/2} = x2 c + x1 s with c, s = concentration
// (cos, sin)(pos inv_freq_i). The angle errs by angle_ulps u_a |angle| (inv_freq in float,
// the product): that error grows with the position. c and s err by concentration (angle error
// + (F + 1) u_a), and by x_e more where the tables are stored coarser (transformers casts them
// to the model's dtype); the products add (u_in + u_a + u_e) |terms| (x read, concentration,
// product) and the sum (u_a + u_s) |out|.
std::vector<double> rope(const Units& u, const Config& c, Stage s, int layer, int pos,
                         BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const StageData& qkv = src.output(Stage::qkv, layer);
  const bool is_q = s == Stage::q_rope;
  const int heads = is_q ? c.num_attention_heads : c.num_key_value_heads, d = c.head_dim,
            half = d / 2;
  const size_t offset = is_q ? 0 : size_t(c.q_dim());
  check_size(y, size_t(heads) * size_t(d), s, "its output");
  check_size(qkv, size_t(c.qkv_dim()), s, "its input qkv");
  const Rope r = Rope::from_config(c);
  std::vector<double> b(elements(y));
  for (int i = 0; i < half; ++i) {
    const double angle = double(pos) * r.inv_freq[size_t(i)];
    const double cs = r.concentration * std::cos(angle), sn = r.concentration * std::sin(angle);
    const double dcs = r.concentration * (u.angle * u.ua * std::fabs(angle) + (u.F + 1) * u.ua);
    const double per_term = u.in + u.ua + u.ue + u.xe();
    for (int h = 0; h < heads; ++h) {
      const size_t lo = size_t(h) * d + size_t(i), hi = lo + size_t(half);
      const double x1 = std::fabs(qkv.at(offset + lo)), x2 = std::fabs(qkv.at(offset + hi));
      const double common = (x1 + x2) * dcs;
      b[lo] = common + per_term * (x1 * std::fabs(cs) + x2 * std::fabs(sn)) +
              (u.ua + u.us) * abs_at(y, lo);
      b[hi] = common + per_term * (x2 * std::fabs(cs) + x1 * std::fabs(sn)) +
              (u.ua + u.us) * abs_at(y, hi);
    }
  }
  return b;
}

// Scores: s_hj = scale (q_h . k_j), d terms, q and k both read from storage, one more rounding
// for the scale (u_e), and x_e more where the product is stored before it is scaled; masked keys
// (-inf) must stay masked (bound 0; the differ accepts any value that underflows the softmax);
// the sink column is copied (u_s |sink|).
std::vector<double> scores(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::scores, layer);
  const StageData& m = magnitude_of(src, Stage::scores, layer);
  check_size(m, elements(y), Stage::scores, "the magnitude row");
  const size_t cols = y.dims.at(1);
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) {
    const double v = y.at(i);
    if (i % cols == cols - 1)
      b[i] = u.us * std::fabs(v);
    else if (std::isinf(v))
      b[i] = 0;
    else
      b[i] = sum_bound(u, double(c.head_dim), m.at(i), v, 2) + (u.ue + u.xe()) * std::fabs(v);
  }
  return b;
}

// Softmax over n finite logits g (with the sink column for att; the k selected router logits
// for topk_w): p_j = e_j / Z, e_j = exp(g_j - m). Each e_j errs relatively by
// eps_j = expm1(u_in |g_j| (g read from storage) + u_e |g_j - m| (the subtraction, stored
// before the exp by transformers)) + F u_a (exp); Z by sum_k p_k eps_k + S(n) u_a (a sum of positive
// terms); p_j by eps_j + that + u_a (division) + u_s (stored). Masked entries (-inf) give
// exactly 0.
void softmax_row(const Units& u, std::span<const double> g, std::span<const double> p,
                 std::span<double> b) {
  double m = -std::numeric_limits<double>::infinity();
  size_t n = 0;
  for (double v : g)
    if (std::isfinite(v)) m = std::max(m, v), ++n;
  // A logit this far below the maximum masks as -inf does (its weight underflows in float32 and
  // bfloat16: transformers masks with finfo.min): 0 to twice its weight, nothing in Z.
  constexpr double kMaskedGap = 110;
  auto masked = [&](double v) { return !std::isfinite(v) || v < m - kMaskedGap; };
  std::vector<double> eps(g.size(), 0);
  double z_rel = u.sum(double(n)) * u.ua;
  for (size_t j = 0; j < g.size(); ++j) {
    if (masked(g[j])) continue;
    // The argument's error d moves exp by a factor e^d: expm1, not d, once d is not small (a
    // bfloat16 subtraction of a logit 32 below the maximum errs by 0.125: 13 %).
    eps[j] = std::expm1(u.in * std::fabs(g[j]) + u.ue * std::fabs(g[j] - m)) + u.F * u.ua;
    z_rel += std::fabs(p[j]) * eps[j];
  }
  for (size_t j = 0; j < g.size(); ++j)
    b[j] = !std::isfinite(g[j]) ? 0.0
           : masked(g[j])       ? std::fabs(p[j])
                                : std::fabs(p[j]) * (eps[j] + z_rel + u.ua + u.us);
}

std::vector<double> att(const Units& u, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::att, layer);
  const StageData& s = src.output(Stage::scores, layer);
  check_size(s, elements(y), Stage::att, "its input scores");
  const size_t cols = y.dims.at(1), rows = y.dims.at(0);
  std::vector<double> b(elements(y)), g(cols), p(cols);
  for (size_t h = 0; h < rows; ++h) {
    for (size_t j = 0; j < cols; ++j) g[j] = s.at(h * cols + j), p[j] = y.at(h * cols + j);
    softmax_row(u, g, p, std::span<double>(b).subspan(h * cols, cols));
  }
  return b;
}

// attn_out: o_hi = sum_j p_hj v_ji over the n_h keys head h attends to (p > 0), p and v both
// read from storage.
std::vector<double> attn_out(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::attn_out, layer);
  const StageData& m = magnitude_of(src, Stage::attn_out, layer);
  const StageData& p = src.output(Stage::att, layer);
  check_size(m, elements(y), Stage::attn_out, "the magnitude row");
  const size_t cols = p.dims.at(1), d = size_t(c.head_dim);
  std::vector<double> b(elements(y));
  for (size_t h = 0; h < size_t(c.num_attention_heads); ++h) {
    double n = 0;
    for (size_t j = 0; j + 1 < cols; ++j) n += p.at(h * cols + j) != 0;
    for (size_t i = 0; i < d; ++i) b[h * d + i] = sum_bound(u, n, m.at(h * d + i), y.at(h * d + i), 2);
  }
  return b;
}

// Residual adds: y = a + b, both read from storage (u_in), one rounding, stored.
std::vector<double> add(const Units& u, const Config& c, Stage s, int layer, BoundSource& src) {
  const StageData& y = src.output(s, layer);
  std::vector<const StageData*> ins;
  for (const StageInput& in : info(s).inputs) {
    const auto r = resolve_input(in, layer, c.num_hidden_layers);
    ins.push_back(&src.output(r->stage, r->layer));
    check_size(*ins.back(), elements(y), s, "an input");
  }
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) {
    double terms = 0;
    for (const StageData* x : ins) terms += abs_at(*x, i);
    b[i] = u.in * terms + (u.ua + u.us) * abs_at(y, i);
  }
  return b;
}

// topk_w: the softmax of the k selected router logits (selected by the reference).
std::vector<double> topk_w(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& w = src.output(Stage::topk_w, layer);
  const StageData& g = src.output(Stage::router, layer);
  const StageData& idx = src.output(Stage::topk_idx, layer);
  check_size(idx, elements(w), Stage::topk_w, "topk_idx");
  std::vector<double> sel(w.size()), p(w.size()), b(w.size());
  for (size_t s = 0; s < w.size(); ++s) {
    const double e = idx.at(s);
    if (!(e >= 0 && e < double(c.num_local_experts)) || size_t(e) >= g.size())
      fail("stage topk_w at layer {}: reference topk_idx names expert {}", layer, e);
    sel[s] = g.at(size_t(e));
    p[s] = w.at(s);
  }
  softmax_row(u, sel, p, b);
  return b;
}

// SwiGLU: a = g sigma(alpha g) (l + 1), g = min(h_even, L), l = clamp(h_odd, -L, L). Input
// rounding u_in |h| reaches a through the slopes: da/dg = sigma (1 + alpha g (1 - sigma)) (l + 1)
// while the gate is below the clamp (or within its rounding of it), da/dl = g sigma while |l| is
// inside the clamp; the evaluation adds (1 - sigma)(alpha |g| u_e + F u_a) (sigma of a rounded
// alpha g) + 2 u_a + 3 u_e (the products, the sum, the division; sigma, g sigma and the product
// stored between operations by an eager port) + u_s (stored) relative to a, and
// u_e |g sigma| (|l| + 1) for (l + 1) rounded or a written as g sigma l + g sigma.
std::vector<double> swiglu(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::swiglu, layer);
  const StageData& h = src.output(Stage::mlp1, layer);
  check_size(h, 2 * elements(y), Stage::swiglu, "its input mlp1");
  const double L = c.swiglu_limit, alpha = c.swiglu_alpha;
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) {
    const double hg = h.at(2 * i), hl = h.at(2 * i + 1);
    const double dg = u.in * std::fabs(hg), dl = u.in * std::fabs(hl);
    const double g = std::min(hg, L), l = std::clamp(hl, -L, L);
    const double sig = 1 / (1 + std::exp(-alpha * g));
    const double gs = g * sig, a = gs * (l + 1);
    const double slope_g = sig * (1 + alpha * g * (1 - sig)) * (l + 1);
    double e = 0;
    if (hg < L + dg) e += std::fabs(slope_g) * dg;
    if (std::fabs(hl) < L + dl) e += std::fabs(gs) * dl;
    e += std::fabs(a) *
         ((1 - sig) * (alpha * std::fabs(g) * u.ue + u.F * u.ua) + 2 * u.ua + 3 * u.ue + u.us);
    e += u.ue * std::fabs(gs) * (std::fabs(l) + 1);
    b[i] = e;
  }
  return b;
}

// moe_out: y_i = sum over the k slots of w_s e_si, w and e read from storage, each product
// stored (x_e) before the sum by an eager port. A tensor-parallel group whose mlp2 rows are the
// gathered sums of its ranks' partial rows p_rs (BoundSource::partials) summed the k x ranks
// products w_s p_rsi itself, and its traced e_s is their sum rounded once to storage: the sum's
// terms are those products (their magnitude sum |w_s| sum_r |p_rsi| >= sum |w_s e_si|, more
// where the ranks' parts cancel), and e's rounding adds u_s sum |w_s e_si|.
std::vector<double> moe_out(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::moe_out, layer);
  const StageData& w = src.output(Stage::topk_w, layer);
  const StageData& e = src.output(Stage::mlp2, layer);
  const size_t k = w.size(), H = elements(y);
  check_size(e, k * H, Stage::moe_out, "its input mlp2");
  const std::vector<const StageData*> parts = src.partials(Stage::mlp2, layer);
  for (const StageData* p : parts) check_size(*p, k * H, Stage::moe_out, "a rank's partial mlp2");
  const double terms = double(c.num_experts_per_tok) * double(std::max<size_t>(parts.size(), 1));
  std::vector<double> b(H);
  for (size_t i = 0; i < H; ++i) {
    double mag = 0, split = 0;
    for (size_t s = 0; s < k; ++s) {
      mag += std::fabs(w.at(s) * e.at(s * H + i));
      for (const StageData* p : parts) split += std::fabs(w.at(s) * p->at(s * H + i));
    }
    b[i] = parts.empty() ? sum_bound(u, terms, mag, y.at(i), 2) + u.xe() * mag
                         : sum_bound(u, terms, split, y.at(i), 2) + u.xe() * split + u.us * mag;
  }
  return b;
}

}  // namespace

bool bound_is_rounding(Stage s) { return s == Stage::embedding || s == Stage::v; }

bool bound_needs_magnitude(Stage s) {
  switch (s) {
    case Stage::qkv:
    case Stage::scores:
    case Stage::attn_out:
    case Stage::o_proj:
    case Stage::router:
    case Stage::mlp1:
    case Stage::mlp2:
    case Stage::logits:
      return true;
    default:
      return false;
  }
}

std::vector<double> derive_bound(const Config& c, Stage s, int layer, int position,
                                 BoundSource& src, const PrecisionPolicy& p,
                                 const BoundOptions& o) {
  const Units u = units(p.at(s), o);
  const double H = c.hidden_size, I = c.intermediate_size;
  std::vector<double> b;
  switch (s) {
    case Stage::embedding:
    case Stage::v: {  // copies of exact or stored values
      const StageData& y = src.output(s, layer);
      b.resize(elements(y));
      for (size_t i = 0; i < b.size(); ++i) b[i] = u.us * abs_at(y, i);
      break;
    }
    case Stage::attn_norm:
    case Stage::ffn_norm:
    case Stage::final_norm:
      b = rmsnorm(u, c, s, layer, src);
      break;
    case Stage::qkv:
    case Stage::router:
    case Stage::mlp1:
      b = projection(u, s, layer, H + 1, src);
      break;
    case Stage::o_proj:
      b = projection(u, s, layer, double(c.q_dim()) + 1, src);
      break;
    case Stage::mlp2:
      b = projection(u, s, layer, I + 1, src);
      break;
    case Stage::logits:
      b = projection(u, s, layer, H, src);
      break;
    case Stage::q_rope:
    case Stage::k_rope:
      b = rope(u, c, s, layer, position, src);
      break;
    case Stage::scores:
      b = scores(u, c, layer, src);
      break;
    case Stage::att:
      b = att(u, layer, src);
      break;
    case Stage::attn_out:
      b = attn_out(u, c, layer, src);
      break;
    case Stage::resid_attn:
    case Stage::resid_ffn:
      b = add(u, c, s, layer, src);
      break;
    case Stage::topk_idx:
      return derive_bound(c, Stage::router, layer, position, src, p, o);
    case Stage::topk_w:
      b = topk_w(u, c, layer, src);
      break;
    case Stage::swiglu:
      b = swiglu(u, c, layer, src);
      break;
    case Stage::moe_out:
      b = moe_out(u, c, layer, src);
      break;
    case Stage::sampled:
      return derive_bound(c, Stage::logits, kModelLayer, position, src, p, o);
  }
  // Values below the smallest normal number may be flushed to zero by a correct device.
  for (double& x : b) x = o.safety * x + u.tiny;
  return b;
}

std::optional<RowScaleBound> row_scale_bound(const Config& c, Stage s, int layer,
                                             BoundSource& src, const PrecisionPolicy& p,
                                             const BoundOptions& o) {
  if (s != Stage::attn_norm && s != Stage::ffn_norm && s != Stage::final_norm) return std::nullopt;
  const Units u = units(p.at(s), o);
  const StageData& y = src.output(s, layer);
  const NormParts parts = norm_parts(u, c, s, layer, src);
  RowScaleBound r;
  r.shared = o.safety * parts.shared;
  r.element.resize(elements(y));
  for (size_t i = 0; i < r.element.size(); ++i)
    r.element[i] = o.safety * abs_at(y, i) * parts.own + u.tiny;
  return r;
}

std::string_view bound_formula(Stage s) {
  static constexpr std::array<std::string_view, kNumStages> kFormulas = {
      "u_s |y| (an exact row copy, stored)",                                        // embedding
      "|y| (r_rel + u_in + u_s + 2 u_a + x_e), r_rel = ((S(n) + 1) u_a + 2 u_in) ms / (2 (ms + eps)) + (F + 1/2) u_a; the row's common error within r_rel",  // attn_norm
      "(S(H + 1) u_a + u_in) sum |w x| + (u_a + u_s) |y| (+ u_b |y - b|)",          // qkv
      "(|x1| + |x2|) conc (angle_ulps u_a |pos inv_freq| + (F + 1) u_a) + (u_in + u_a + u_e + x_e)(|x1 c| + |x2 s|) + (u_a + u_s) |y|",  // q_rope
      "as q_rope",                                                                   // k_rope
      "u_s |y| (a copy of qkv)",                                                     // v
      "(S(d) u_a + 2 u_in) sum |q k| scale + (u_a + u_s + u_e + x_e) |y|; masked stays masked; sink u_s |sink|",  // scores
      "p_j (eps_j + sum_k p_k eps_k + S(n) u_a + u_a + u_s), eps_j = expm1(u_in |s_j| + u_e |s_j - m|) + F u_a",  // att
      "(S(n_keys) u_a + 2 u_in) sum |p v| + (u_a + u_s) |y|",                        // attn_out
      "(S(nH d + 1) u_a + u_in) sum |w x| + (u_a + u_s) |y| (+ u_b |y - b|)",        // o_proj
      "u_in (|residual| + |o_proj|) + (u_a + u_s) |y|",                              // resid_attn
      "as attn_norm",                                                                // ffn_norm
      "(S(H + 1) u_a + u_in) sum |w x| + (u_a + u_s) |y| (+ u_b |y - b|)",           // router
      "a flip is drift when |g_a - g_b| <= bound(router)_a + bound(router)_b",       // topk_idx
      "softmax over the k selected router logits, as att with n = k",               // topk_w
      "(S(H + 1) u_a + u_in) sum |w x| + (u_a + u_s) |y| (+ u_b |y - b|) per slot",  // mlp1
      "|da/dg| u_in |h_g| + |da/dl| u_in |h_l| (inside the clamps) + |a| ((1 - sigma)(alpha |g| u_e + F u_a) + 2 u_a + 3 u_e + u_s) + u_e |g sigma| (|l| + 1)",  // swiglu
      "(S(I + 1) u_a + u_in) sum |w x| + (u_a + u_s) |y| (+ u_b |y - b|) per slot",  // mlp2
      "(S(k) u_a + 2 u_in + x_e) sum |w_s e_s| + (u_a + u_s) |y|",                   // moe_out
      "u_in (|resid_attn| + |moe_out|) + (u_a + u_s) |y|",                           // resid_ffn
      "as attn_norm",                                                                // final_norm
      "(S(H) u_a + u_in) sum |w x| + (u_a + u_s) |y|",                               // logits
      "a flip is drift when |l_a - l_b| <= bound(logits)_a + bound(logits)_b",      // sampled
  };
  static_assert(kFormulas.size() == size_t(kNumStages), "one formula per stage");
  return kFormulas[size_t(s)];
}

}  // namespace parity
