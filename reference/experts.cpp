// Expert projections mlp1 (gate_up) and mlp2 (down), MXFP4 or dense weights, and the
// weighted expert sum. W[e] rows are decoded exactly, then dotted in the shared order.
#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void expert_linear(const ExpertLinear& w, int expert, const T* x, T* y) {
  std::vector<T> bias(size_t(w.out));
  read_row(*w.bias, expert, w.out, bias.data());
#pragma omp parallel
  {
    std::vector<T> row(static_cast<size_t>(w.in));
#pragma omp for schedule(static)
    for (int j = 0; j < w.out; ++j) {
      read_expert_row(w, expert, j, row.data());
      y[j] = dot(row.data(), x, w.in) + bias[size_t(j)];  // bias before the routing weight
    }
  }
}

template <typename T>
void moe_sum(const T* w, const T* expert_out, int k, int n, T* y) {
  for (int i = 0; i < n; ++i) {
    T acc = 0;
    for (int s = 0; s < k; ++s) acc += w[s] * expert_out[size_t(s) * n + i];
    y[i] = acc;
  }
}

template void expert_linear<double>(const ExpertLinear&, int, const double*, double*);
template void expert_linear<float>(const ExpertLinear&, int, const float*, float*);
template void moe_sum<double>(const double*, const double*, int, int, double*);
template void moe_sum<float>(const float*, const float*, int, int, float*);

}  // namespace parity::ref
