// RMSNorm and the embedding gather.
#include <cmath>

#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void embedding(const TensorView& embed, int token, T* x) {
  read_row(embed, token, embed.dim(1), x);
}

template <typename T>
void rmsnorm(const T* x, const T* scale, int n, double eps, T* y) {
  const T ms = dot(x, x, n) / T(n);
  const T inv = T(1) / std::sqrt(ms + T(eps));
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * scale[i];
}

template void embedding<double>(const TensorView&, int, double*);
template void embedding<float>(const TensorView&, int, float*);
template void rmsnorm<double>(const double*, const double*, int, double, double*);
template void rmsnorm<float>(const float*, const float*, int, double, float*);

}  // namespace parity::ref
