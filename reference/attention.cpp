// Attention with sinks, GQA and the sliding window (gpt_oss/torch/model.py sdpa):
// scores, softmax over keys plus the sink column, and the probability-weighted value sum.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/ops.h"

namespace parity::ref {
namespace {
bool worth_threads(int n_heads, int pos, int d) {
  return ref::worth_threads(int64_t(n_heads) * (pos + 1) * d);
}
}  // namespace

template <typename T>
void attention_scores(const T* q, const T* k_cache, const T* sinks, int n_heads, int n_kv, int d,
                      int pos, int window, T* scores) {
  const int group = n_heads / n_kv;  // query head h reads KV head h / group
  const int cols = pos + 2;
  const T scale = T(1) / std::sqrt(T(d));
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;  // window keys incl. self
#pragma omp parallel for schedule(static) if (worth_threads(n_heads, pos, d))
  for (int h = 0; h < n_heads; ++h) {
    const T* qh = q + size_t(h) * d;
    const int kv = h / group;
    T* row = scores + size_t(h) * cols;
    for (int j = 0; j <= pos; ++j)
      row[j] = j < first ? -std::numeric_limits<T>::infinity()
                         : dot(qh, k_cache + (size_t(j) * n_kv + kv) * d, d) * scale;
    row[pos + 1] = sinks[h];
  }
}

template <typename T>
void softmax_with_sink(const T* scores, int n_heads, int cols, T* probs) {
  for (int h = 0; h < n_heads; ++h) {
    const T* s = scores + size_t(h) * cols;
    T* p = probs + size_t(h) * cols;
    T m = -std::numeric_limits<T>::infinity();
    for (int j = 0; j < cols; ++j) m = std::max(m, s[j]);
    T z = 0;
    for (int j = 0; j < cols; ++j) {
      p[j] = std::exp(s[j] - m);
      z += p[j];
    }
    for (int j = 0; j < cols; ++j) p[j] /= z;
  }
}

template <typename T>
void attention_output(const T* probs, const T* v_cache, int n_heads, int n_kv, int d, int pos,
                      T* out) {
  const int group = n_heads / n_kv;
  const int cols = pos + 2;
#pragma omp parallel for schedule(static) if (worth_threads(n_heads, pos, d))
  for (int h = 0; h < n_heads; ++h) {
    const T* p = probs + size_t(h) * cols;
    const int kv = h / group;
    T* o = out + size_t(h) * d;
    for (int i = 0; i < d; ++i) o[i] = 0;
    for (int j = 0; j <= pos; ++j) {
      if (p[j] == T(0)) continue;  // masked keys contribute exactly nothing
      const T* vj = v_cache + (size_t(j) * n_kv + kv) * d;
      for (int i = 0; i < d; ++i) o[i] += p[j] * vj[i];
    }
  }
}

void attention_scores_magnitude(const double* q, const double* k_cache, const double* sinks,
                                int n_heads, int n_kv, int d, int pos, int window, double* m) {
  const int group = n_heads / n_kv;
  const int cols = pos + 2;
  const double scale = 1.0 / std::sqrt(double(d));
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
#pragma omp parallel for schedule(static) if (worth_threads(n_heads, pos, d))
  for (int h = 0; h < n_heads; ++h) {
    const double* qh = q + size_t(h) * d;
    const int kv = h / group;
    double* row = m + size_t(h) * cols;
    for (int j = 0; j <= pos; ++j)
      row[j] = j < first ? 0.0 : dot_magnitude(qh, k_cache + (size_t(j) * n_kv + kv) * d, d) * scale;
    row[pos + 1] = std::fabs(sinks[h]);
  }
}

void attention_output_magnitude(const double* probs, const double* v_cache, int n_heads, int n_kv,
                                int d, int pos, double* m) {
  const int group = n_heads / n_kv;
  const int cols = pos + 2;
#pragma omp parallel for schedule(static) if (worth_threads(n_heads, pos, d))
  for (int h = 0; h < n_heads; ++h) {
    const double* p = probs + size_t(h) * cols;
    const int kv = h / group;
    double* o = m + size_t(h) * d;
    for (int i = 0; i < d; ++i) o[i] = 0;
    for (int j = 0; j <= pos; ++j) {
      if (p[j] == 0.0) continue;
      const double* vj = v_cache + (size_t(j) * n_kv + kv) * d;
      for (int i = 0; i < d; ++i) o[i] += std::fabs(p[j]) * std::fabs(vj[i]);
    }
  }
}

#define PARITY_INSTANTIATE(T)                                                                  \
  template void attention_scores<T>(const T*, const T*, const T*, int, int, int, int, int, T*); \
  template void softmax_with_sink<T>(const T*, int, int, T*);                                  \
  template void attention_output<T>(const T*, const T*, int, int, int, int, T*);
PARITY_INSTANTIATE(double)
PARITY_INSTANTIATE(float)
#undef PARITY_INSTANTIATE

}  // namespace parity::ref
