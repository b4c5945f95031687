// The sampler (engine/sampler.h): greedy, the draw's distribution, the generator's keys.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "engine/sampler.h"

namespace parity {
namespace {

const std::vector<double> kLogits = {1.0, 2.5, -0.5, 2.5, 0.3, 1.7, -2.0, 0.9};

// The regularized upper incomplete gamma function Q(a, x) (Numerical Recipes gammq): the
// chi-square survival function is Q(df / 2, x / 2).
double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {  // series for P, then Q = 1 - P
    double sum = 1 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return 1 - sum * std::exp(log_prefix);
  }
  // Continued fraction for Q (modified Lentz).
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

TEST(EngineSampler, ChiSquareSurvivalMatchesKnownValues) {
  // chi2.sf(3, 2) = exp(-1.5); chi2.sf(10, 4) = 6 exp(-5).
  EXPECT_NEAR(upper_gamma_q(1.0, 1.5), std::exp(-1.5), 1e-12);
  EXPECT_NEAR(upper_gamma_q(2.0, 5.0), 0.040427681994512805, 1e-12);
  // chi2.sf(2, 7) = Q(3.5, 1) = erfc(1) + sum over a = 1/2, 3/2, 5/2 of e^-1 / Gamma(a + 1)
  EXPECT_NEAR(upper_gamma_q(3.5, 1.0), 0.9598403687301015, 1e-12);
}

TEST(EngineSampler, GreedyIsArgmaxLowestIndexOnTies) {
  EXPECT_EQ(greedy_token(std::span<const double>(kLogits)), 1);
  const std::vector<float> f(kLogits.begin(), kLogits.end());
  EXPECT_EQ(greedy_token(std::span<const float>(f)), 1);
  const std::vector<double> nan_first = {std::nan(""), -1.0, 3.0, 3.0};
  EXPECT_EQ(greedy_token(std::span<const double>(nan_first)), 2);
  SamplingParams greedy;  // temperature 0
  for (uint64_t step = 0; step < 50; ++step) EXPECT_EQ(sample_token(kLogits, greedy, 7, step), 1);
}

TEST(EngineSampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5;
  p.top_k = 1;
  for (uint64_t step = 0; step < 200; ++step) EXPECT_EQ(sample_token(kLogits, p, 3, step), 1);
}

TEST(EngineSampler, SameKeysGiveTheSameToken) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 42;
  for (uint64_t step = 0; step < 100; ++step)
    EXPECT_EQ(sample_token(kLogits, p, 5, step), sample_token(kLogits, p, 5, step));
  // The generator's keys all matter.
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(2, 2, 3));
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(1, 3, 3));
  EXPECT_NE(sampling_uniform(1, 2, 3), sampling_uniform(1, 2, 4));
  // Pinned so a device twin can check its generator against these numbers.
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafULL);
  const double u = sampling_uniform(0, 0, 0);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

// The restricted distribution written out independently of the sampler: softmax(logits / T)
// over the top-k ids (ties by lower id), then the shortest prefix reaching top_p, renormalised.
std::vector<double> expected_distribution(const std::vector<double>& logits, double t, int k,
                                          double top_p) {
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  if (k > 0) order.resize(std::min(order.size(), size_t(k)));
  std::vector<double> w;
  double total = 0;
  for (size_t i : order) total += w.emplace_back(std::exp((logits[i] - logits[order[0]]) / t));
  size_t keep = order.size();
  double cumulative = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    cumulative += w[j] / total;
    if (cumulative >= top_p) {
      keep = j + 1;
      break;
    }
  }
  double kept_total = 0;
  for (size_t j = 0; j < keep; ++j) kept_total += w[j];
  std::vector<double> dist(logits.size(), 0);
  for (size_t j = 0; j < keep; ++j) dist[order[j]] = w[j] / kept_total;
  return dist;
}

struct Case {
  double temperature;
  int top_k;
  double top_p;
};

TEST(EngineSampler, DrawsFollowTheRestrictedSoftmax) {
  const int draws = 20000;
  for (const Case c : {Case{1.0, 0, 1.0}, Case{0.7, 5, 1.0}, Case{1.3, 0, 0.8}, Case{1.0, 6, 0.9},
                       Case{2.0, 3, 0.95}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << c.temperature << " top_k " << c.top_k
                                      << " top_p " << c.top_p);
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = 20261123;
    const std::vector<double> expected =
        expected_distribution(kLogits, c.temperature, c.top_k, c.top_p);
    const std::vector<double> defined = sampling_distribution(kLogits, p);
    for (size_t i = 0; i < kLogits.size(); ++i) EXPECT_NEAR(defined[i], expected[i], 1e-12) << i;
    std::vector<int> counts(kLogits.size(), 0);
    for (int s = 0; s < draws; ++s) ++counts[size_t(sample_token(kLogits, p, 11, uint64_t(s)))];
    double chi2 = 0;
    int categories = 0;
    for (size_t i = 0; i < kLogits.size(); ++i) {
      if (expected[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " was cut away but drawn";
        continue;
      }
      const double e = expected[i] * draws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++categories;
    }
    ASSERT_GE(categories, 2);
    const double p_value = upper_gamma_q((categories - 1) / 2.0, chi2 / 2);
    EXPECT_GT(p_value, 1e-6) << "chi-square " << chi2 << " over " << categories << " tokens";
  }
}

TEST(EngineSampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(p.validate(), std::exception);
  p.top_p = 1;
  p.top_k = -1;
  EXPECT_THROW(p.validate(), std::exception);
  p.top_k = 0;
  p.temperature = std::nan("");
  EXPECT_THROW(p.validate(), std::exception);
}

}  // namespace
}  // namespace parity
