// Reference ops, templated on the scalar: double is the oracle, float the cpu-f32 control.
// Each op documents its math and shapes; every output element is produced by one thread in a
// fixed summation order, so results do not depend on the OpenMP thread count.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "model/checkpoint.h"

namespace parity::ref {

// Below this many multiply-adds an op runs on one thread: a parallel region costs a few
// microseconds, more than the work of the small models and short rows, and far more when
// another process holds a core. Results do not depend on it (one thread computes each element
// in a fixed order either way).
inline constexpr int64_t kParallelMacs = int64_t(1) << 17;
constexpr bool worth_threads(int64_t macs) { return macs >= kParallelMacs; }

// sum_i a[i] b[i] in a fixed order: 8 interleaved partial sums (lane l takes i = l mod 8),
// combined as ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)). Vectorizes without reassociation.
template <typename T>
T dot(const T* a, const T* b, int n);

// dot_magnitude: sum_i |a[i] b[i]| in dot's order, the scale of dot's rounding error.
double dot_magnitude(const double* a, const double* b, int n);

// dot_block: out (rows, count) with out[j][r] = dot(ws[j], xs[r], n), bit for bit: several
// weight rows against several input rows in register tiles, on the widest vector unit the CPU
// has. The Simd overload runs one named level; tests compare every level with dot.
enum class Simd { Baseline, Avx2, Avx512 };
bool simd_supported(Simd s);
std::string_view simd_name(Simd s);
Simd widest_simd();
template <typename T>
void dot_block(const T* const* ws, int rows, const T* const* xs, int count, int n, T* out);
template <typename T>
void dot_block(Simd simd, const T* const* ws, int rows, const T* const* xs, int count, int n,
               T* out);

// embedding: x (H,) = embed[token] (BF16 row, no scaling)
template <typename T>
void embedding(const TensorView& embed, int token, T* x);

// rmsnorm: y (H,) = x / sqrt(mean(x^2) + eps) * scale  (gpt_oss/torch/model.py RMSNorm)
template <typename T>
void rmsnorm(const T* x, const T* scale, int n, double eps, T* y);

// weight_row: w (n,) = row `row` of a dense weight [rows, n], the values read_row gives; BF16
// widened with the vector unit (the Simd overload runs one level, for tests).
template <typename T>
void weight_row(const TensorView& t, int64_t row, int64_t n, T* out);
template <typename T>
void weight_row(Simd simd, const TensorView& t, int64_t row, int64_t n, T* out);

// linear: Y (B, out) = X (B, in) @ W^T + b, W stored [out, in]; OpenMP over output rows.
template <typename T>
void linear(const Linear& w, const T* x, int batch, T* y);

// linear_magnitude: m (out,) = sum_k |W[j][k] * x[k]| + |b[j]| for ONE input row x (in,), in
// double; the scale of the rounding error of y[j]. Summed in dot's lane order.
void linear_magnitude(const Linear& w, const double* x, double* m);

// rope: in-place YaRN rotation of `heads` heads of size d, half-split (NeoX) pairs:
//   out[i] = x[i] c_i - x[i+d/2] s_i,  out[i+d/2] = x[i+d/2] c_i + x[i] s_i,
//   c_i = cos(pos inv_freq_i) * concentration, s_i = sin(pos inv_freq_i) * concentration.
template <typename T>
void rope(T* x, int heads, int d, int pos, const std::vector<T>& inv_freq, T concentration);

// attention_scores: S (nH, pos+2): S[h][j] = (q_h . k_{h/g, j}) / sqrt(d) for visible j
// (j <= pos; on sliding layers also pos - j < window), -inf for masked j; S[h][pos+1] = sink_h.
template <typename T>
void attention_scores(const T* q, const T* k_cache, const T* sinks, int n_heads, int n_kv,
                      int d, int pos, int window, T* scores);

// attention_scores_magnitude: M (nH, pos+2): M[h][j] = sum_i |q_h[i] k_{h/g, j}[i]| / sqrt(d) for
// visible j, 0 for masked j, M[h][pos+1] = |sink_h|: the scale of the rounding error of S.
void attention_scores_magnitude(const double* q, const double* k_cache, const double* sinks,
                                int n_heads, int n_kv, int d, int pos, int window, double* m);

// softmax_with_sink: P (nH, n+1) = softmax over each row including the sink column; the sink
// takes probability mass and has no value vector. m = max(row); masked (-inf) entries give 0.
template <typename T>
void softmax_with_sink(const T* scores, int n_heads, int cols, T* probs);

// attention_output: O (nH d,) with O_h = sum_{j<=pos} P[h][j] v_{h/g, j} (sink column unused).
template <typename T>
void attention_output(const T* probs, const T* v_cache, int n_heads, int n_kv, int d, int pos,
                      T* out);

// attention_output_magnitude: M (nH d,) with M_h = sum_{j<=pos} P[h][j] |v_{h/g, j}| (P >= 0).
void attention_output_magnitude(const double* probs, const double* v_cache, int n_heads, int n_kv,
                                int d, int pos, double* m);

// router_topk: the k largest of g (E,) (ties: lowest expert index first), in descending order.
template <typename T>
void router_topk(const T* g, int n_experts, int k, int32_t* idx);

// topk_softmax: w (k,) = softmax(g[idx]) over the k selected logits only.
template <typename T>
void topk_softmax(const T* g, const int32_t* idx, int k, T* w);

// expert_row: w (in,) = row `row` of W[expert], the values read_expert_row gives; MXFP4 decoded
// by AVX-512 permutes where the CPU has them, else through a per-block table of the 16 values
// (the Simd overload runs one level, for tests).
template <typename T>
void expert_row(const ExpertLinear& w, int expert, int row, T* out);
template <typename T>
void expert_row(Simd simd, const ExpertLinear& w, int expert, int row, T* out);

// expert_linear: y (out,) = W[e] x + b[e] for one expert of an MXFP4 or dense expert tensor.
template <typename T>
void expert_linear(const ExpertLinear& w, int expert, const T* x, T* y);

// expert_linear_batch: for every job, y (out,) = W[expert] x (in,) + b[expert], each element
// bit-identical to expert_linear (dot(row, x) + b[j]). Jobs are grouped by expert so each decoded
// weight row serves every job of its expert; jobs may name experts in any order and repeat them;
// the y of different jobs must not overlap. Holds 8 decoded rows per thread, never a matrix.
template <typename T>
struct ExpertJob {
  int expert;
  const T* x;  // (in,)
  T* y;        // (out,)
};
template <typename T>
void expert_linear_batch(const ExpertLinear& w, std::span<const ExpertJob<T>> jobs);

// expert_linear_magnitude: m (out,) = sum_k |W[e][j][k] * x[k]| + |b[e][j]|, as linear_magnitude.
void expert_linear_magnitude(const ExpertLinear& w, int expert, const double* x, double* m);

// swiglu: a (I,) from h (2I,) interleaved (even = gate, odd = linear), gpt_oss swiglu:
//   gate = min(h[2i], limit); lin = clamp(h[2i+1], -limit, limit);
//   a[i] = gate * sigmoid(alpha * gate) * (lin + 1)
template <typename T>
void swiglu(const T* h, int inter, T alpha, T limit, T* a);

// moe_sum: y (H,) = sum_s w[s] * e[s] (H,), slots in order 0..k-1.
template <typename T>
void moe_sum(const T* w, const T* expert_out, int k, int n, T* y);

// argmax: the greedy sampled token, the index of the largest of logits (V,); ties and NaN: the
// lowest index among the largest numbers (NaN never wins unless every value is NaN: index 0).
template <typename T>
void argmax(const T* logits, int vocab, int32_t* token);

}  // namespace parity::ref
