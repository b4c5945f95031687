// Reference ops, templated on the scalar: double is the oracle, float the cpu-f32 control.
// Each op documents its math and shapes; every output element is produced by one thread in a
// fixed summation order, so results do not depend on the OpenMP thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "model/checkpoint.h"

namespace parity::ref {

// sum_i a[i] b[i] in a fixed order: 8 interleaved partial sums (lane l takes i = l mod 8),
// combined as ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)). Vectorizes without reassociation.
template <typename T>
T dot(const T* a, const T* b, int n);

// embedding: x (H,) = embed[token] (BF16 row, no scaling)
template <typename T>
void embedding(const TensorView& embed, int token, T* x);

// rmsnorm: y (H,) = x / sqrt(mean(x^2) + eps) * scale  (gpt_oss/torch/model.py RMSNorm)
template <typename T>
void rmsnorm(const T* x, const T* scale, int n, double eps, T* y);

// linear: Y (B, out) = X (B, in) @ W^T + b, W stored [out, in]; OpenMP over output rows.
template <typename T>
void linear(const Linear& w, const T* x, int batch, T* y);

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

// softmax_with_sink: P (nH, n+1) = softmax over each row including the sink column; the sink
// takes probability mass and has no value vector. m = max(row); masked (-inf) entries give 0.
template <typename T>
void softmax_with_sink(const T* scores, int n_heads, int cols, T* probs);

// attention_output: O (nH d,) with O_h = sum_{j<=pos} P[h][j] v_{h/g, j} (sink column unused).
template <typename T>
void attention_output(const T* probs, const T* v_cache, int n_heads, int n_kv, int d, int pos,
                      T* out);

// router_topk: the k largest of g (E,) (ties: lowest expert index first), in descending order.
template <typename T>
void router_topk(const T* g, int n_experts, int k, int32_t* idx);

// topk_softmax: w (k,) = softmax(g[idx]) over the k selected logits only.
template <typename T>
void topk_softmax(const T* g, const int32_t* idx, int k, T* w);

// expert_linear: y (out,) = W[e] x + b[e] for one expert of an MXFP4 or dense expert tensor.
template <typename T>
void expert_linear(const ExpertLinear& w, int expert, const T* x, T* y);

// swiglu: a (I,) from h (2I,) interleaved (even = gate, odd = linear), gpt_oss swiglu:
//   gate = min(h[2i], limit); lin = clamp(h[2i+1], -limit, limit);
//   a[i] = gate * sigmoid(alpha * gate) * (lin + 1)
template <typename T>
void swiglu(const T* h, int inter, T alpha, T limit, T* a);

// moe_sum: y (H,) = sum_s w[s] * e[s] (H,), slots in order 0..k-1.
template <typename T>
void moe_sum(const T* w, const T* expert_out, int k, int n, T* y);

}  // namespace parity::ref
