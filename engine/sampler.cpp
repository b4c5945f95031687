#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "model/error.h"

namespace parity {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature)) fail("temperature {}: not a finite number", temperature);
  if (top_k < 0) fail("top-k {}: cannot be negative (0 turns it off)", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail("top-p {}: must be in (0, 1] (1 turns it off)", top_p);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double sampling_uniform(uint64_t seed, uint64_t request, uint64_t step) {
  uint64_t x = splitmix64(seed);
  x = splitmix64(x ^ request);
  x = splitmix64(x ^ step);
  return double(x >> 11) * 0x1p-53;
}

namespace {

template <typename T>
TokenId argmax(std::span<const T> logits) {
  int64_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[size_t(best)]) best = int64_t(i);
  }
  return best < 0 ? 0 : TokenId(best);
}

struct Candidate {
  double z;
  TokenId id;
};

// Steps 2-5: the kept candidates in draw order, with their unnormalised weights.
struct Kept {
  std::vector<Candidate> order;
  std::vector<double> weight;
};

Kept kept_candidates(std::span<const double> logits, const SamplingParams& p) {
  Kept k;
  k.order.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) k.order.push_back({logits[i] / p.temperature, TokenId(i)});
  if (k.order.empty()) return k;
  const auto before = [](const Candidate& a, const Candidate& b) {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  };
  if (p.top_k > 0 && size_t(p.top_k) < k.order.size()) {
    std::partial_sort(k.order.begin(), k.order.begin() + p.top_k, k.order.end(), before);
    k.order.resize(size_t(p.top_k));
  } else {
    std::sort(k.order.begin(), k.order.end(), before);
  }
  const double zmax = k.order.front().z;
  k.weight.resize(k.order.size());
  double total = 0;
  for (size_t i = 0; i < k.order.size(); ++i) total += k.weight[i] = std::exp(k.order[i].z - zmax);
  if (p.top_p < 1) {
    double cumulative = 0;
    size_t keep = k.order.size();
    for (size_t i = 0; i < k.order.size(); ++i) {
      cumulative += k.weight[i] / total;
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    k.order.resize(keep);
    k.weight.resize(keep);
  }
  return k;
}

}  // namespace

TokenId greedy_token(std::span<const double> logits) {
  return argmax(logits);
}
TokenId greedy_token(std::span<const float> logits) {
  return argmax(logits);
}

TokenId sample_token(std::span<const double> logits, const SamplingParams& p, uint64_t request,
                     uint64_t step) {
  if (p.greedy()) return greedy_token(logits);
  const Kept k = kept_candidates(logits, p);
  if (k.order.empty()) return 0;
  const double total = std::accumulate(k.weight.begin(), k.weight.end(), 0.0);
  const double target = sampling_uniform(p.seed, request, step) * total;
  double cumulative = 0;
  for (size_t i = 0; i < k.order.size(); ++i) {
    cumulative += k.weight[i];
    if (cumulative > target) return k.order[i].id;
  }
  return k.order.back().id;
}

std::vector<double> sampling_distribution(std::span<const double> logits, const SamplingParams& p) {
  std::vector<double> dist(logits.size(), 0.0);
  if (logits.empty()) return dist;
  if (p.greedy()) {
    dist[size_t(greedy_token(logits))] = 1;
    return dist;
  }
  const Kept k = kept_candidates(logits, p);
  if (k.order.empty()) {
    dist[0] = 1;
    return dist;
  }
  const double total = std::accumulate(k.weight.begin(), k.weight.end(), 0.0);
  for (size_t i = 0; i < k.order.size(); ++i) dist[size_t(k.order[i].id)] = k.weight[i] / total;
  return dist;
}

}  // namespace parity
