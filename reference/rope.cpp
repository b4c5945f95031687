// RoPE with gpt-oss YaRN scaling (gpt_oss/torch/model.py _apply_rotary_emb), half-split pairs.
#include <cmath>

#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void rope(T* x, int heads, int d, int pos, const std::vector<T>& inv_freq, T concentration) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const T angle = T(pos) * inv_freq[size_t(i)];
    const T c = std::cos(angle) * concentration;
    const T s = std::sin(angle) * concentration;
    for (int h = 0; h < heads; ++h) {
      T* xh = x + size_t(h) * d;
      const T x1 = xh[i], x2 = xh[i + half];
      xh[i] = x1 * c - x2 * s;
      xh[i + half] = x2 * c + x1 * s;
    }
  }
}

template void rope<double>(double*, int, int, int, const std::vector<double>&, double);
template void rope<float>(float*, int, int, int, const std::vector<float>&, float);

}  // namespace parity::ref
