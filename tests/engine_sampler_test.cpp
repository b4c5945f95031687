// The sampler (engine/sampler.h): greedy, the order keys, the fixed-point weights, the top-k and
// top-p cuts on hand-made rows (ties, NaN/inf, exact boundaries, one candidate), the generator's
// keys, and the draws against sampling_distribution by a chi-square test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "engine/sampler.h"
#include "tests/test_util.h"

namespace parity {
namespace {

const std::vector<float> kLogits = {1.0f, 2.5f, -0.5f, 2.5f, 0.3f, 1.7f, -2.0f, 0.9f};
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint64_t kOne = uint64_t(1) << 40;  // the weight of the largest logit


TEST(EngineSampler, ChiSquareSurvivalMatchesKnownValues) {
  // chi2.sf(3, 2) = exp(-1.5); chi2.sf(10, 4) = 6 exp(-5).
  EXPECT_NEAR(test::upper_gamma_q(1.0, 1.5), std::exp(-1.5), 1e-12);
  EXPECT_NEAR(test::upper_gamma_q(2.0, 5.0), 0.040427681994512805, 1e-12);
  // chi2.sf(2, 7) = Q(3.5, 1) = erfc(1) + sum over a = 1/2, 3/2, 5/2 of e^-1 / Gamma(a + 1)
  EXPECT_NEAR(test::upper_gamma_q(3.5, 1.0), 0.9598403687301015, 1e-12);
}

TEST(EngineSampler, GreedyIsArgmaxLowestIndexOnTies) {
  EXPECT_EQ(greedy_token(std::span<const float>(kLogits)), 1);
  const std::vector<double> d(kLogits.begin(), kLogits.end());
  EXPECT_EQ(greedy_token(std::span<const double>(d)), 1);
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

TEST(EngineSampler, OrderKeyIsLogitDescendingThenLowerId) {
  const std::vector<float> ascending = {-3e38f, -2.5f, -1e-30f, 0.0f, 1e-30f,
                                        1.0f, 2.0f, 3e38f};
  for (size_t i = 0; i + 1 < ascending.size(); ++i)
    EXPECT_GT(sampling_descending_bits(ascending[i]), sampling_descending_bits(ascending[i + 1]))
        << ascending[i] << " vs " << ascending[i + 1];
  EXPECT_EQ(sampling_descending_bits(-0.0f), sampling_descending_bits(0.0f));
  EXPECT_LT(sampling_order_key(2.0f, 7), sampling_order_key(2.0f, 8));  // ties: lower id first
  EXPECT_LT(sampling_order_key(2.0f, 9), sampling_order_key(1.0f, 0));
  EXPECT_LT(sampling_order_key(0.0f, 3), sampling_order_key(-0.0f, 4));
}

TEST(EngineSampler, WeightsAreFixedPointExponentials) {
  EXPECT_EQ(sampling_weight(2.0f, 2.0f, 0.7), kOne);
  EXPECT_EQ(sampling_weight(1.0f, 2.0f, 1.0), uint64_t(std::nearbyint(std::exp(-1.0) * 0x1p40)));
  EXPECT_EQ(sampling_weight(2.0f - float(std::log(2.0)), 2.0f, 1.0),
            uint64_t(std::nearbyint(std::exp(double(2.0f - float(std::log(2.0))) - 2.0) * 0x1p40)));
  EXPECT_EQ(sampling_weight(-27.0f, 0.0f, 1.0), uint64_t(std::nearbyint(std::exp(-27.0) * 0x1p40)));
  EXPECT_GT(sampling_weight(-27.0f, 0.0f, 1.0), 0u);
  EXPECT_EQ(sampling_weight(-28.6f, 0.0f, 1.0), 0u);  // below the cut-off: 0 without exp
  EXPECT_EQ(sampling_weight(-3e38f, 3e38f, 1e-3), 0u);
}

SamplingParams sampled(double temperature, int top_k = 0, double top_p = 1, uint64_t seed = 9) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

std::vector<TokenId> kept_ids(const SamplingCandidates& c) {
  return std::vector<TokenId>(c.order.begin(), c.order.begin() + long(c.kept));
}

TEST(EngineSampler, OnlyFiniteLogitsAreCandidates) {
  const std::vector<float> row = {kNaN, 1.0f, kInf, -kInf, 3.0f, kNaN, 3.0f, -0.0f, 0.0f};
  const SamplingCandidates c = sampling_candidates(row, sampled(1.0));
  EXPECT_EQ(c.order, (std::vector<TokenId>{4, 6, 1, 7, 8}));
  EXPECT_EQ(c.weight[0], kOne);
  EXPECT_EQ(c.weight[1], kOne);
  EXPECT_EQ(c.weight[3], c.weight[4]);  // -0 and +0 weigh the same
  EXPECT_EQ(c.kept, 5u);
  for (uint64_t step = 0; step < 300; ++step) {
    const TokenId t = sample_token(row, sampled(1.0), 1, step);
    EXPECT_TRUE(t == 4 || t == 6 || t == 1 || t == 7 || t == 8) << t;
  }
  const std::vector<float> none = {kNaN, kInf, -kInf};
  EXPECT_EQ(sampling_candidates(none, sampled(1.0)).kept, 0u);
  EXPECT_EQ(sample_token(none, sampled(1.0), 1, 0), 0);
  EXPECT_EQ(sampling_distribution(none, sampled(1.0))[0], 1.0);
  const std::vector<float> one = {kNaN, -kInf, -5.0f, kNaN};
  for (uint64_t step = 0; step < 50; ++step)
    EXPECT_EQ(sample_token(one, sampled(0.3, 0, 0.2), 4, step), 2);
  EXPECT_EQ(sampling_distribution(one, sampled(2.0))[2], 1.0);
}

TEST(EngineSampler, TopKKeepsTheFirstKOfTheOrderTiesByLowerId) {
  const std::vector<float> row = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f, 3.0f};
  EXPECT_EQ(kept_ids(sampling_candidates(row, sampled(1.0, 3))), (std::vector<TokenId>{5, 1, 2}));
  EXPECT_EQ(kept_ids(sampling_candidates(row, sampled(1.0, 4))),
            (std::vector<TokenId>{5, 1, 2, 4}));
  EXPECT_EQ(kept_ids(sampling_candidates(row, sampled(1.0, 100))).size(), 6u);
  const std::vector<double> dist = sampling_distribution(row, sampled(1.0, 2));
  EXPECT_EQ(dist[2] + dist[4] + dist[0] + dist[3], 0.0);
  EXPECT_GT(dist[1], 0.0);
}

TEST(EngineSampler, TopPKeepsTheShortestPrefixReachingP) {
  // Four equal logits: W = 2^40 each, S = 2^42. top_p 0.5 reaches P = 2^41 exactly at the second.
  const std::vector<float> flat = {1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 0, 0.5)).kept, 2u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 0, 0.5 + 0x1p-40)).kept, 3u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 0, 0.25)).kept, 1u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 0, 1e-9)).kept, 1u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 0, 1.0)).kept, 4u);
  // top-k first, then top-p on the top-k set's total: 3 of 4, P = ceil(0.5 * 3 2^40) -> 2.
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 3, 0.5)).kept, 2u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 3, 2.0 / 3.0)).kept, 2u);
  EXPECT_EQ(sampling_candidates(flat, sampled(1.0, 3, 2.0 / 3.0 + 1e-9)).kept, 3u);
  for (uint64_t step = 0; step < 200; ++step) {
    const TokenId t = sample_token(flat, sampled(1.0, 0, 0.5), 2, step);
    EXPECT_TRUE(t == 0 || t == 1) << t;
  }
  // A dominant first logit: top_p 0.9 keeps it alone.
  const std::vector<float> peaked = {0.0f, 10.0f, 0.0f};
  EXPECT_EQ(kept_ids(sampling_candidates(peaked, sampled(1.0, 0, 0.9))), (std::vector<TokenId>{1}));
}

TEST(EngineSampler, DrawWalksTheCumulativeWeights) {
  SamplingCandidates c;
  c.order = {7, 3, 5};
  c.weight = {1, 2, 3};
  c.kept = 3;
  EXPECT_EQ(sampling_draw_index(c, 0.0), 0u);                 // R = 0 < 1
  EXPECT_EQ(sampling_draw_index(c, 1.0 / 6.0), 1u);           // R = 1: first cumulative > 1 is 3
  EXPECT_EQ(sampling_draw_index(c, 0.5), 2u);                 // R = 3
  EXPECT_EQ(sampling_draw_index(c, 0.49), 1u);                // R = 2
  EXPECT_EQ(sampling_draw_index(c, 1.0 - 0x1p-53), 2u);       // R = min(5, 5)
  c.kept = 2;                                                 // the prefix only: S' = 3
  EXPECT_EQ(sampling_draw_index(c, 0.9), 1u);
  c.weight = {1, 0, 3};  // a zero weight is never drawn
  c.kept = 3;
  for (double u = 0; u < 1; u += 1.0 / 64) EXPECT_NE(sampling_draw_index(c, u), 1u) << u;
}

TEST(EngineSampler, DoubleRowsAreSampledAsFloat) {
  const std::vector<double> d = {1.0, 2.5000000001, -0.5, 2.5, 0.3};
  const std::vector<float> f(d.begin(), d.end());
  for (uint64_t step = 0; step < 100; ++step)
    EXPECT_EQ(sample_token(std::span<const double>(d), sampled(0.8, 4, 0.9), 3, step),
              sample_token(std::span<const float>(f), sampled(0.8, 4, 0.9), 3, step));
  EXPECT_EQ(sample_token(std::span<const double>(d), sampled(0.0), 3, 0), 1);  // greedy in double
}

TEST(EngineSampler, RowsLongerThanExactSumsAreRefused) {
  const std::vector<float> row(kMaxSampleCandidates + 1, 0.0f);
  EXPECT_THROW(sample_token(row, sampled(1.0), 0, 0), std::exception);
  EXPECT_EQ(sample_token(row, sampled(0.0), 0, 0), 0);  // greedy has no such limit
}

TEST(EngineSampler, SameKeysGiveTheSameToken) {
  const SamplingParams p = sampled(1.0, 0, 1.0, 42);
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

// The restricted distribution written out independently of the sampler, in float64 without
// fixed point: softmax(logits / T) over the top-k ids (ties by lower id), then the shortest
// prefix reaching top_p, renormalised.
std::vector<double> expected_distribution(const std::vector<float>& logits, double t, int k,
                                          double top_p) {
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  if (k > 0) order.resize(std::min(order.size(), size_t(k)));
  std::vector<double> w;
  double total = 0;
  for (size_t i : order)
    total += w.emplace_back(std::exp((double(logits[i]) - double(logits[order[0]])) / t));
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

// 20,000 draws (steps 0..19,999 of one request) per case against sampling_distribution. The
// threshold: p-value > 1e-6, i.e. a correct sampler fails a case with probability 1e-6 (5e-6 for
// the five cases); the seeds are fixed, so the outcome is deterministic as well.
TEST(EngineSampler, DrawsFollowTheRestrictedSoftmax) {
  const int draws = 20000;
  for (const Case c : {Case{1.0, 0, 1.0}, Case{0.7, 5, 1.0}, Case{1.3, 0, 0.8}, Case{1.0, 6, 0.9},
                       Case{2.0, 3, 0.95}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << c.temperature << " top_k " << c.top_k
                                      << " top_p " << c.top_p);
    const SamplingParams p = sampled(c.temperature, c.top_k, c.top_p, 20261123);
    const std::vector<double> expected =
        expected_distribution(kLogits, c.temperature, c.top_k, c.top_p);
    const std::vector<double> defined = sampling_distribution(kLogits, p);
    // Fixed point moves a weight by at most 2^-41 of the largest.
    for (size_t i = 0; i < kLogits.size(); ++i) EXPECT_NEAR(defined[i], expected[i], 1e-11) << i;
    std::vector<int> counts(kLogits.size(), 0);
    for (int s = 0; s < draws; ++s) ++counts[size_t(sample_token(kLogits, p, 11, uint64_t(s)))];
    double chi2 = 0;
    int categories = 0;
    for (size_t i = 0; i < kLogits.size(); ++i) {
      if (defined[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " was cut away but drawn";
        continue;
      }
      const double e = defined[i] * draws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++categories;
    }
    ASSERT_GE(categories, 2);
    const double p_value = test::upper_gamma_q((categories - 1) / 2.0, chi2 / 2);
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
