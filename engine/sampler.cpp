#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "model/error.h"

namespace parity {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature)) fail("temperature {}: not a finite number", temperature);
  if (temperature < 0) fail("temperature {}: cannot be negative (0 is greedy)", temperature);
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

// The twins of these three live in device/sample.hip; tests/device_sampler_test.cpp holds them
// to the same tokens.
uint32_t sampling_descending_bits(float logit) {
  uint32_t b = std::bit_cast<uint32_t>(logit);
  if ((b & 0x7fffffffu) == 0) b = 0;  // -0 ranks as +0
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~ascending;
}

uint64_t sampling_order_key(float logit, TokenId id) {
  return (uint64_t(sampling_descending_bits(logit)) << 32) | uint32_t(id);
}

uint64_t sampling_weight(float logit, float max_logit, double temperature) {
  const double x = (double(logit) - double(max_logit)) / temperature;
  if (x < -28.5) return 0;  // exp(-28.5) 2^40 = 0.46: rounds to 0 whatever exp's last bit
  return uint64_t(std::nearbyint(std::exp(x) * kSampleWeightScale));
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

// Inverse of sampling_descending_bits (on the canonical bits).
float logit_of_key(uint64_t key) {
  const uint32_t ascending = ~uint32_t(key >> 32);
  const uint32_t b = (ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending;
  return std::bit_cast<float>(b);
}

}  // namespace

TokenId greedy_token(std::span<const double> logits) {
  return argmax(logits);
}
TokenId greedy_token(std::span<const float> logits) {
  return argmax(logits);
}

SamplingCandidates sampling_candidates(std::span<const float> logits, const SamplingParams& p) {
  if (logits.size() > kMaxSampleCandidates)
    fail("sampling: {} logits, more than the {} whose weights sum exactly (sample greedily)",
         logits.size(), kMaxSampleCandidates);
  std::vector<uint64_t> keys;
  keys.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) keys.push_back(sampling_order_key(logits[i], TokenId(i)));
  SamplingCandidates c;
  if (keys.empty()) return c;
  if (p.top_k > 0 && size_t(p.top_k) < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + p.top_k - 1, keys.end());
    keys.resize(size_t(p.top_k));
  }
  std::sort(keys.begin(), keys.end());
  const float max_logit = logit_of_key(keys.front());
  c.order.resize(keys.size());
  c.weight.resize(keys.size());
  uint64_t total = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    c.order[j] = TokenId(uint32_t(keys[j]));
    c.weight[j] = sampling_weight(logit_of_key(keys[j]), max_logit, p.temperature);
    total += c.weight[j];
  }
  c.kept = keys.size();
  if (p.top_p < 1) {
    const double scaled = std::ceil(p.top_p * double(total));
    const uint64_t want = std::min(scaled >= 1 ? uint64_t(scaled) : 1, total);
    uint64_t cumulative = 0;
    for (size_t j = 0; j < keys.size(); ++j) {
      cumulative += c.weight[j];
      if (cumulative >= want) {
        c.kept = j + 1;
        break;
      }
    }
  }
  return c;
}

size_t sampling_draw_index(const SamplingCandidates& c, double u) {
  uint64_t kept_total = 0;
  for (size_t j = 0; j < c.kept; ++j) kept_total += c.weight[j];
  if (kept_total == 0) return 0;  // cannot happen: the first candidate weighs 2^40
  const uint64_t r = std::min(uint64_t(u * double(kept_total)), kept_total - 1);
  uint64_t cumulative = 0;
  for (size_t j = 0; j < c.kept; ++j) {
    cumulative += c.weight[j];
    if (cumulative > r) return j;
  }
  return c.kept - 1;  // unreachable: the last cumulative is kept_total > r
}

TokenId sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t request,
                     uint64_t step) {
  if (p.greedy()) return greedy_token(logits);
  const SamplingCandidates c = sampling_candidates(logits, p);
  if (c.kept == 0) return 0;
  return c.order[sampling_draw_index(c, sampling_uniform(p.seed, request, step))];
}

TokenId sample_token(std::span<const double> logits, const SamplingParams& p, uint64_t request,
                     uint64_t step) {
  if (p.greedy()) return greedy_token(logits);
  const std::vector<float> rounded(logits.begin(), logits.end());
  return sample_token(std::span<const float>(rounded), p, request, step);
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  std::vector<double> dist(logits.size(), 0.0);
  if (logits.empty()) return dist;
  if (p.greedy()) {
    dist[size_t(greedy_token(logits))] = 1;
    return dist;
  }
  const SamplingCandidates c = sampling_candidates(logits, p);
  if (c.kept == 0) {
    dist[0] = 1;
    return dist;
  }
  uint64_t kept_total = 0;
  for (size_t j = 0; j < c.kept; ++j) kept_total += c.weight[j];
  for (size_t j = 0; j < c.kept; ++j)
    dist[size_t(c.order[j])] = double(c.weight[j]) / double(kept_total);
  return dist;
}

}  // namespace parity
