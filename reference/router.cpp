// MoE router: top-k of the biased router logits, then softmax over the k selected only
// (gpt_oss/torch/model.py MLPBlock: torch.topk(sorted=True), softmax(dim=1)).
#include <cmath>

#include "reference/ops.h"

namespace parity::ref {

template <typename T>
void router_topk(const T* g, int n_experts, int k, int32_t* idx) {
  // Selection by repeated arg-max; a strict > keeps the lowest index among equal logits.
  std::vector<bool> taken(size_t(n_experts), false);
  for (int s = 0; s < k; ++s) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e)
      if (!taken[size_t(e)] && (best < 0 || g[e] > g[best])) best = e;
    taken[size_t(best)] = true;
    idx[s] = best;
  }
}

template <typename T>
void topk_softmax(const T* g, const int32_t* idx, int k, T* w) {
  T m = g[idx[0]];
  for (int s = 1; s < k; ++s) m = std::max(m, g[idx[s]]);
  T z = 0;
  for (int s = 0; s < k; ++s) {
    w[s] = std::exp(g[idx[s]] - m);
    z += w[s];
  }
  for (int s = 0; s < k; ++s) w[s] /= z;
}

template void router_topk<double>(const double*, int, int, int32_t*);
template void router_topk<float>(const float*, int, int, int32_t*);
template void topk_softmax<double>(const double*, const int32_t*, int, double*);
template void topk_softmax<float>(const float*, const int32_t*, int, float*);

}  // namespace parity::ref
