// Greedy sampling: the argmax of the logits, the decision the `sampled` stage traces.
#include <cmath>

#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void argmax(const T* logits, int vocab, int32_t* token) {
  int best = -1;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;  // strict: the lowest index on ties
  }
  *token = best < 0 ? 0 : best;
}

template void argmax<double>(const double*, int, int32_t*);
template void argmax<float>(const float*, int, int32_t*);

}  // namespace parity::ref
