// The derived error bounds, one function per stage kind (see tracer/bounds.h for the rounding
// model and the choice of lambda). Notation: u_s, u_a, F as in bounds.h; y the reference
// output, x its inputs (all reference values), n the number of terms of a sum.
#include "tracer/bounds.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "model/error.h"

namespace parity {
namespace {

struct Units {
  double us, ua, F, lambda, angle, tiny;
};

double abs_at(const StageData& d, size_t i) { return std::fabs(d.at(i)); }

size_t elements(const StageData& d) { return d.size(); }

// A sum of n terms whose absolute values add to `mag`, `rounded` of its operands read from
// storage: lambda sqrt(n) u_a mag for the sum, rounded u_s mag for the operands' rounding, and
// (u_a + u_s) |y| for one last operation (a bias added, a scale) and the storing of y.
double sum_bound(const Units& u, double n, double mag, double y, int rounded) {
  return (u.lambda * std::sqrt(std::max(n, 1.0)) * u.ua + rounded * u.us) * mag +
         (u.ua + u.us) * std::fabs(y);
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
// every policy (checkpoint dtypes), x is read from storage.
std::vector<double> projection(const Units& u, Stage s, int layer, double n, BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const StageData& m = magnitude_of(src, s, layer);
  check_size(m, elements(y), s, "the magnitude row");
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) b[i] = sum_bound(u, n, m.at(i), y.at(i), 1);
  return b;
}

// RMSNorm: y_i = x_i r w_i, r = 1 / sqrt(ms + eps), ms = sum x^2 / n. The sum of squares errs
// by (lambda sqrt(n) + 1) u_a ms (+ 2 u_s ms from x's rounding); r inherits half of its
// relative error, scaled by ms / (ms + eps), plus u_a / 2 (eps added) and F u_a (sqrt and
// division); each y_i adds u_s (x_i read) + 2 u_a (two products) + u_s (stored).
std::vector<double> rmsnorm(const Units& u, const Config& c, Stage s, int layer,
                            BoundSource& src) {
  const StageData& y = src.output(s, layer);
  const auto in = resolve_input(info(s).inputs[0], layer, c.num_hidden_layers);
  const StageData& x = src.output(in->stage, in->layer);
  check_size(x, elements(y), s, "its input");
  double sq = 0;
  for (size_t i = 0; i < x.size(); ++i) sq += x.at(i) * x.at(i);
  const double n = double(x.size()), ms = sq / n, eps = c.rms_norm_eps;
  const double ms_rel = (u.lambda * std::sqrt(n) + 1) * u.ua + 2 * u.us;
  const double r_rel = 0.5 * ms_rel * (ms / (ms + eps)) + 0.5 * u.ua + u.F * u.ua;
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) b[i] = abs_at(y, i) * (r_rel + 2 * u.us + 2 * u.ua);
  return b;
}

// RoPE on q or k: out_i = x1 c - x2 s, out_{i+d/2} = x2 c + x1 s with c, s = concentration
// (cos, sin)(pos inv_freq_i). The angle errs by angle_ulps u_a |angle| (inv_freq in float,
// the product): that error grows with the position. c and s err by concentration (angle error
// + (F + 1) u_a); the products and sums add (u_s + 2 u_a) |terms| and (u_a + u_s) |out|.
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
    for (int h = 0; h < heads; ++h) {
      const size_t lo = size_t(h) * d + size_t(i), hi = lo + size_t(half);
      const double x1 = std::fabs(qkv.at(offset + lo)), x2 = std::fabs(qkv.at(offset + hi));
      const double common = (x1 + x2) * dcs;
      b[lo] = common + (u.us + 2 * u.ua) * (x1 * std::fabs(cs) + x2 * std::fabs(sn)) +
              (u.ua + u.us) * abs_at(y, lo);
      b[hi] = common + (u.us + 2 * u.ua) * (x2 * std::fabs(cs) + x1 * std::fabs(sn)) +
              (u.ua + u.us) * abs_at(y, hi);
    }
  }
  return b;
}

// Scores: s_hj = scale (q_h . k_j), d terms, q and k both read from storage, one more rounding
// for the scale; masked keys (-inf) must stay masked (bound 0; the differ accepts any value that
// underflows the softmax); the sink column is copied (u_s |sink|).
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
      b[i] = sum_bound(u, double(c.head_dim), m.at(i), v, 2) + u.ua * std::fabs(v);
  }
  return b;
}

// Softmax over n finite logits g (with the sink column for att; the k selected router logits
// for topk_w): p_j = e_j / Z, e_j = exp(g_j - m). Each e_j errs relatively by
// eps_j = u_s |g_j| (g read from storage) + u_a |g_j - m| (the subtraction) + F u_a (exp); Z by
// sum_k p_k eps_k + lambda sqrt(n) u_a (a sum of positive terms); p_j by eps_j + that + u_a
// (division) + u_s (stored). Masked entries (-inf) give exactly 0.
void softmax_row(const Units& u, std::span<const double> g, std::span<const double> p,
                 std::span<double> b) {
  double m = -std::numeric_limits<double>::infinity();
  size_t n = 0;
  for (double v : g)
    if (std::isfinite(v)) m = std::max(m, v), ++n;
  std::vector<double> eps(g.size(), 0);
  double z_rel = u.lambda * std::sqrt(double(std::max<size_t>(n, 1))) * u.ua;
  for (size_t j = 0; j < g.size(); ++j) {
    if (!std::isfinite(g[j])) continue;
    eps[j] = u.us * std::fabs(g[j]) + u.ua * std::fabs(g[j] - m) + u.F * u.ua;
    z_rel += std::fabs(p[j]) * eps[j];
  }
  for (size_t j = 0; j < g.size(); ++j)
    b[j] = std::isfinite(g[j]) ? std::fabs(p[j]) * (eps[j] + z_rel + u.ua + u.us) : 0.0;
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

// Residual adds: y = a + b, both read from storage, one rounding, stored.
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
    b[i] = u.us * terms + (u.ua + u.us) * abs_at(y, i);
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
// rounding u_s |h| reaches a through the slopes: da/dg = sigma (1 + alpha g (1 - sigma)) (l + 1)
// while the gate is below the clamp (or within its rounding of it), da/dl = g sigma while |l| is
// inside the clamp; the evaluation adds (1 - sigma)(alpha |g| + F) u_a (sigma) + 5 u_a (the
// products, the sum, the division) + u_s (stored) relative to a, and u_a |g sigma| (|l| + 1)
// for (l + 1) rounded or a written as g sigma l + g sigma.
std::vector<double> swiglu(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::swiglu, layer);
  const StageData& h = src.output(Stage::mlp1, layer);
  check_size(h, 2 * elements(y), Stage::swiglu, "its input mlp1");
  const double L = c.swiglu_limit, alpha = c.swiglu_alpha;
  std::vector<double> b(elements(y));
  for (size_t i = 0; i < b.size(); ++i) {
    const double hg = h.at(2 * i), hl = h.at(2 * i + 1);
    const double dg = u.us * std::fabs(hg), dl = u.us * std::fabs(hl);
    const double g = std::min(hg, L), l = std::clamp(hl, -L, L);
    const double sig = 1 / (1 + std::exp(-alpha * g));
    const double gs = g * sig, a = gs * (l + 1);
    const double slope_g = sig * (1 + alpha * g * (1 - sig)) * (l + 1);
    double e = 0;
    if (hg < L + dg) e += std::fabs(slope_g) * dg;
    if (std::fabs(hl) < L + dl) e += std::fabs(gs) * dl;
    e += std::fabs(a) * ((1 - sig) * (alpha * std::fabs(g) + u.F) * u.ua + 5 * u.ua + u.us);
    e += u.ua * std::fabs(gs) * (std::fabs(l) + 1);
    b[i] = e;
  }
  return b;
}

// moe_out: y_i = sum over the k slots of w_s e_si, w and e read from storage.
std::vector<double> moe_out(const Units& u, const Config& c, int layer, BoundSource& src) {
  const StageData& y = src.output(Stage::moe_out, layer);
  const StageData& w = src.output(Stage::topk_w, layer);
  const StageData& e = src.output(Stage::mlp2, layer);
  const size_t k = w.size(), H = elements(y);
  check_size(e, k * H, Stage::moe_out, "its input mlp2");
  std::vector<double> b(H);
  for (size_t i = 0; i < H; ++i) {
    double mag = 0;
    for (size_t s = 0; s < k; ++s) mag += std::fabs(w.at(s) * e.at(s * H + i));
    b[i] = sum_bound(u, double(c.num_experts_per_tok), mag, y.at(i), 2);
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
  const Units u{p.storage_unit_roundoff, p.accumulation_unit_roundoff, p.function_ulps, o.lambda,
                o.angle_ulps, p.storage_min_normal};
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

std::string_view bound_formula(Stage s) {
  static constexpr std::array<std::string_view, kNumStages> kFormulas = {
      "u_s |y| (an exact row copy, stored)",                                        // embedding
      "|y| (r_rel + 2 u_s + 2 u_a), r_rel = ((lambda sqrt(n) + 1) u_a + 2 u_s) ms / (2 (ms + eps)) + (F + 1/2) u_a",  // attn_norm
      "(lambda sqrt(H + 1) u_a + u_s) sum |w x| + (u_a + u_s) |y|",                  // qkv
      "(|x1| + |x2|) conc (angle_ulps u_a |pos inv_freq| + (F + 1) u_a) + (u_s + 2 u_a)(|x1 c| + |x2 s|) + (u_a + u_s) |y|",  // q_rope
      "as q_rope",                                                                   // k_rope
      "u_s |y| (a copy of qkv)",                                                     // v
      "(lambda sqrt(d) u_a + 2 u_s) sum |q k| scale + (2 u_a + u_s) |y|; masked stays masked; sink u_s |sink|",  // scores
      "p_j (eps_j + sum_k p_k eps_k + lambda sqrt(n) u_a + u_a + u_s), eps_j = u_s |s_j| + u_a |s_j - m| + F u_a",  // att
      "(lambda sqrt(n_keys) u_a + 2 u_s) sum |p v| + (u_a + u_s) |y|",               // attn_out
      "(lambda sqrt(nH d + 1) u_a + u_s) sum |w x| + (u_a + u_s) |y|",               // o_proj
      "u_s (|residual| + |o_proj|) + (u_a + u_s) |y|",                               // resid_attn
      "as attn_norm",                                                                // ffn_norm
      "(lambda sqrt(H + 1) u_a + u_s) sum |w x| + (u_a + u_s) |y|",                  // router
      "a flip is drift when |g_a - g_b| <= bound(router)_a + bound(router)_b",       // topk_idx
      "softmax over the k selected router logits, as att with n = k",               // topk_w
      "(lambda sqrt(H + 1) u_a + u_s) sum |w x| + (u_a + u_s) |y| per slot",         // mlp1
      "|da/dg| u_s |h_g| + |da/dl| u_s |h_l| (inside the clamps) + |a| ((1 - sigma)(alpha |g| + F) u_a + 5 u_a + u_s) + u_a |g sigma| (|l| + 1)",  // swiglu
      "(lambda sqrt(I + 1) u_a + u_s) sum |w x| + (u_a + u_s) |y| per slot",         // mlp2
      "(lambda sqrt(k) u_a + 2 u_s) sum |w_s e_s| + (u_a + u_s) |y|",                // moe_out
      "u_s (|resid_attn| + |moe_out|) + (u_a + u_s) |y|",                            // resid_ffn
      "as attn_norm",                                                                // final_norm
      "(lambda sqrt(H) u_a + u_s) sum |w x| + (u_a + u_s) |y|",                      // logits
      "a flip is drift when |l_a - l_b| <= bound(logits)_a + bound(logits)_b",      // sampled
  };
  static_assert(kFormulas.size() == size_t(kNumStages), "one formula per stage");
  return kFormulas[size_t(s)];
}

}  // namespace parity
