// Dense GEMV/GEMM with BF16/F16/F32 weights stored [out, in], and the shared dot product.
#include <omp.h>

#include "model/error.h"
#include "model/numerics.h"
#include "reference/ops.h"

namespace parity::ref {

template <typename T>
T dot(const T* a, const T* b, int n) {
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) s[l] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

template <typename T>
void linear(const Linear& w, const T* x, int batch, T* y) {
  const int out = w.out, in = w.in;
  std::vector<T> bias(size_t(out), T(0));
  if (w.bias != nullptr) read_vector(*w.bias, bias.data());
#pragma omp parallel
  {
    std::vector<T> row(static_cast<size_t>(in));
#pragma omp for schedule(static)
    for (int j = 0; j < out; ++j) {
      read_row(*w.weight, j, in, row.data());
      for (int b = 0; b < batch; ++b)
        y[size_t(b) * out + j] = dot(row.data(), x + size_t(b) * in, in) + bias[size_t(j)];
    }
  }
}

template double dot<double>(const double*, const double*, int);
template float dot<float>(const float*, const float*, int);
template void linear<double>(const Linear&, const double*, int, double*);
template void linear<float>(const Linear&, const float*, int, float*);

}  // namespace parity::ref
