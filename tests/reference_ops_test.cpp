// Each reference op against small hand-computed cases, in double and in float.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "reference/ops.h"

namespace parity::ref {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

TEST(ReferenceOps, DotUsesAllElementsIncludingTail) {
  std::vector<double> a(11), b(11);
  double want = 0;
  for (int i = 0; i < 11; ++i) {
    a[size_t(i)] = i + 1;
    b[size_t(i)] = 0.5 * (i % 3);
    want += a[size_t(i)] * b[size_t(i)];
  }
  EXPECT_EQ(dot(a.data(), b.data(), 11), want);  // small integers: exact in any order
}

TEST(ReferenceOps, RmsNormMatchesHandComputation) {
  const double x[2] = {3, 4}, scale[2] = {1, 2};
  double y[2];
  rmsnorm(x, scale, 2, 1e-5, y);
  const double inv = 1 / std::sqrt(12.5 + 1e-5);  // mean(9, 16) = 12.5
  EXPECT_DOUBLE_EQ(y[0], 3 * inv);
  EXPECT_DOUBLE_EQ(y[1], 8 * inv);
}

TEST(ReferenceOps, RopeRotatesHalfSplitPairsWithConcentration) {
  // d = 4: pairs (0, 2) and (1, 3); pos 1; inv_freq {1, 0.5}; concentration 2.
  double x[4] = {1, 2, 3, 4};
  rope(x, 1, 4, 1, std::vector<double>{1.0, 0.5}, 2.0);
  const double c0 = std::cos(1.0) * 2, s0 = std::sin(1.0) * 2, c1 = std::cos(0.5) * 2, s1 = std::sin(0.5) * 2;
  EXPECT_DOUBLE_EQ(x[0], 1 * c0 - 3 * s0);
  EXPECT_DOUBLE_EQ(x[2], 3 * c0 + 1 * s0);
  EXPECT_DOUBLE_EQ(x[1], 2 * c1 - 4 * s1);
  EXPECT_DOUBLE_EQ(x[3], 4 * c1 + 2 * s1);
}

TEST(ReferenceOps, RopeAtPositionZeroOnlyScales) {
  double x[4] = {1, -2, 3, 0.5};
  rope(x, 1, 4, 0, std::vector<double>{1.0, 0.5}, 1.5);
  EXPECT_DOUBLE_EQ(x[0], 1.5);
  EXPECT_DOUBLE_EQ(x[1], -3.0);
  EXPECT_DOUBLE_EQ(x[2], 4.5);
  EXPECT_DOUBLE_EQ(x[3], 0.75);
}

TEST(ReferenceOps, ScoresMaskTheSlidingWindowAndPutTheSinkLast) {
  // 2 query heads share 1 KV head (d = 1); pos 5, window 3: keys 3, 4, 5 visible.
  const int pos = 5, cols = pos + 2;
  std::vector<double> k(6);
  for (int j = 0; j < 6; ++j) k[size_t(j)] = j + 1;
  const double q[2] = {1, -1}, sinks[2] = {0.25, -0.75};
  std::vector<double> s(size_t(2 * cols));
  attention_scores(q, k.data(), sinks, 2, 1, 1, pos, 3, s.data());
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(s[size_t(h * cols + j)], -kInf) << "h " << h << " j " << j;
    for (int j = 3; j <= 5; ++j) EXPECT_DOUBLE_EQ(s[size_t(h * cols + j)], q[h] * (j + 1));  // 1/sqrt(1)
    EXPECT_EQ(s[size_t(h * cols + 6)], sinks[h]);  // raw, not scaled
  }
}

TEST(ReferenceOps, ScoresWindowOfWKeysIncludesSelf) {
  // window 2 at pos 2: keys 1 and 2 only (pos - j < window).
  std::vector<double> k = {1, 1, 1};
  const double q[1] = {1}, sink[1] = {0};
  std::vector<double> s(4);
  attention_scores(q, k.data(), sink, 1, 1, 1, 2, 2, s.data());
  EXPECT_EQ(s[0], -kInf);
  EXPECT_EQ(s[1], 1.0);
  EXPECT_EQ(s[2], 1.0);
}

TEST(ReferenceOps, ScoresGqaMapsHeadsByDivision) {
  // 4 query heads, 2 KV heads: heads 0, 1 -> kv 0; heads 2, 3 -> kv 1 (h / 2, not h % 2).
  const double k[2] = {10, 20};  // pos 0: kv0 = 10, kv1 = 20 (d = 1)
  const double q[4] = {1, 1, 1, 1}, sinks[4] = {0, 0, 0, 0};
  std::vector<double> s(8);
  attention_scores(q, k, sinks, 4, 2, 1, 0, 0, s.data());
  EXPECT_EQ(s[0], 10);
  EXPECT_EQ(s[2], 10);
  EXPECT_EQ(s[4], 20);
  EXPECT_EQ(s[6], 20);
}

TEST(ReferenceOps, SoftmaxSinkTakesMassButMaskedKeysTakeNone) {
  const double s[4] = {-kInf, 0, 0, 0};  // one masked key, two keys, sink 0
  double p[4];
  softmax_with_sink(s, 1, 4, p);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_DOUBLE_EQ(p[1], 1.0 / 3);
  EXPECT_DOUBLE_EQ(p[2], 1.0 / 3);
  EXPECT_DOUBLE_EQ(p[3], 1.0 / 3);  // the sink's share: the keys sum to 2/3
}

TEST(ReferenceOps, AttentionOutputIgnoresTheSinkColumn) {
  const double p[3] = {0.25, 0.5, 0.25};  // keys 0, 1 then sink
  const double v[2] = {4, 8};             // d = 1
  double o[1];
  attention_output(p, v, 1, 1, 1, 1, o);
  EXPECT_DOUBLE_EQ(o[0], 0.25 * 4 + 0.5 * 8);
}

TEST(ReferenceOps, SwigluClampsGateAboveOnlyAndLinearBothSides) {
  const double alpha = 1.702, limit = 7;
  const double h[6] = {10, -10, -3, 2, 1, 100};  // (gate, linear) pairs
  double a[3];
  swiglu(h, 3, alpha, limit, a);
  auto f = [&](double g, double l) { return g / (1 + std::exp(-alpha * g)) * (l + 1); };
  EXPECT_DOUBLE_EQ(a[0], f(7, -7));  // gate clamped to 7, linear to -7
  EXPECT_DOUBLE_EQ(a[1], f(-3, 2));  // negative gate is not clamped from below
  EXPECT_DOUBLE_EQ(a[2], f(1, 7));
}

TEST(ReferenceOps, RouterTopkDescendingWithLowestIndexOnTies) {
  const double g[6] = {0.5, 2, -1, 2, 3, 0.5};
  int32_t idx[4];
  router_topk(g, 6, 4, idx);
  EXPECT_EQ(idx[0], 4);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(idx[2], 3);
  EXPECT_EQ(idx[3], 0);
}

TEST(ReferenceOps, TopkSoftmaxIsOverSelectedLogitsOnly) {
  const double g[4] = {std::log(1.0), std::log(3.0), 100, std::log(4.0)};
  const int32_t idx[3] = {3, 1, 0};
  double w[3];
  topk_softmax(g, idx, 3, w);
  EXPECT_DOUBLE_EQ(w[0], 0.5);
  EXPECT_DOUBLE_EQ(w[1], 0.375);
  EXPECT_DOUBLE_EQ(w[2], 0.125);
}

TEST(ReferenceOps, MoeSumWeightsEachExpertOutput) {
  const double w[2] = {0.75, 0.25}, e[4] = {1, 2, 10, 20};
  double y[2];
  moe_sum(w, e, 2, 2, y);
  EXPECT_DOUBLE_EQ(y[0], 0.75 + 2.5);
  EXPECT_DOUBLE_EQ(y[1], 1.5 + 5);
}

TEST(ReferenceOps, FloatPathAgreesWithDoubleOnSwiglu) {
  const float hf[2] = {0.3f, -0.2f};
  const double hd[2] = {0.3f, -0.2f};
  float af[1];
  double ad[1];
  swiglu(hf, 1, 1.702f, 7.0f, af);
  swiglu(hd, 1, 1.702, 7.0, ad);
  EXPECT_NEAR(af[0], ad[0], 1e-6);
}

}  // namespace
}  // namespace parity::ref
