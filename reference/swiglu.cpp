// gpt-oss SwiGLU (gpt_oss/torch/model.py swiglu, alpha = 1.702, limit = 7): the gate is
// clamped from above only, the linear half on both sides, and +1 is added to the linear half.
#include <algorithm>
#include <cmath>

#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void swiglu(const T* h, int inter, T alpha, T limit, T* a) {
  for (int i = 0; i < inter; ++i) {
    const T gate = std::min(h[2 * i], limit);
    const T lin = std::clamp(h[2 * i + 1], -limit, limit);
    const T sig = T(1) / (T(1) + std::exp(-alpha * gate));
    a[i] = gate * sig * (lin + T(1));
  }
}

template void swiglu<double>(const double*, int, double, double, double*);
template void swiglu<float>(const float*, int, float, float, float*);

}  // namespace parity::ref
