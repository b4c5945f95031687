// Each reference op against small hand-computed cases, in double and in float; the fast
// projection paths (dot_block, weight_row and expert_row on every SIMD level, linear,
// expert_linear_batch) against the plain decode-then-dot definition, bit for bit, at several
// thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "model/error.h"
#include "model/numerics.h"
#include "reference/ops.h"
#include "tests/test_util.h"

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

// ---- Bit-exactness of the fast projection paths ----

// Bit pattern of a value, so that EXPECT_EQ tells -0 from +0 and prints what differs.
template <typename T>
auto bits(T v) {
  if constexpr (sizeof(T) == 8)
    return std::bit_cast<uint64_t>(v);
  else
    return std::bit_cast<uint32_t>(v);
}

// Values spread over 2^-12 .. 2^12 with both signs, so that any change of summation order
// changes the rounded result (checked below, so the tests cannot pass by luck).
template <typename T>
std::vector<T> spread_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<T> v(n);
  for (auto& x : v) x = T(std::ldexp(normal(rng), exponent(rng)));
  return v;
}

// Runs `body` at 1, 2 and 7 OpenMP threads, restoring the thread count after.
template <typename F>
void at_thread_counts(F body) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 7}) {
    omp_set_num_threads(threads);
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    body(threads);
  }
  omp_set_num_threads(saved);
}

// A tensor that owns its bytes, for building weights by hand.
struct OwnedTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  OwnedTensor(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> data)
      : bytes(std::move(data)) {
    view.name = "test";
    view.file = "test";
    view.dtype = dtype;
    view.shape = std::move(shape);
    view.data = bytes.data();
    view.nbytes = bytes.size();
  }
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
};

std::unique_ptr<OwnedTensor> f32_tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return std::make_unique<OwnedTensor>(DType::F32, std::move(shape), std::move(b));
}

std::unique_ptr<OwnedTensor> bf16_tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = float_to_bf16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return std::make_unique<OwnedTensor>(DType::BF16, std::move(shape), std::move(b));
}

// An expert projection built in memory: MXFP4 with random codes and scales near 1, or dense
// [E, in, out] F32 (which allows an `in` that is no multiple of 8, so dot's tail runs).
struct TestExperts {
  std::unique_ptr<OwnedTensor> blocks, scales, dense, bias;
  ExpertLinear w;
};

TestExperts mxfp4_experts(int experts, int out, int in, std::mt19937_64& rng) {
  TestExperts t;
  const int groups = in / kMxfp4Block;
  std::uniform_int_distribution<int> byte(0, 255), scale(118, 134);
  std::vector<uint8_t> blocks(size_t(experts) * out * groups * kMxfp4BlockBytes),
      scales(size_t(experts) * out * groups);
  for (auto& b : blocks) b = uint8_t(byte(rng));
  for (auto& s : scales) s = uint8_t(scale(rng));
  t.blocks = std::make_unique<OwnedTensor>(
      DType::U8, std::vector<int64_t>{experts, out, groups, 16}, std::move(blocks));
  t.scales = std::make_unique<OwnedTensor>(DType::U8, std::vector<int64_t>{experts, out, groups},
                                           std::move(scales));
  t.bias = f32_tensor({experts, out}, spread_values<float>(size_t(experts) * out, rng));
  t.w = ExpertLinear{.layout = ExpertLayout::Mxfp4,
                     .blocks = &t.blocks->view,
                     .scales = &t.scales->view,
                     .bias = &t.bias->view,
                     .experts = experts,
                     .out = out,
                     .in = in};
  return t;
}

TestExperts dense_experts(int experts, int out, int in, std::mt19937_64& rng) {
  TestExperts t;
  t.dense = f32_tensor({experts, in, out}, spread_values<float>(size_t(experts) * in * out, rng));
  t.bias = f32_tensor({experts, out}, spread_values<float>(size_t(experts) * out, rng));
  t.w = ExpertLinear{.layout = ExpertLayout::DenseInMajor,
                     .dense = &t.dense->view,
                     .bias = &t.bias->view,
                     .experts = experts,
                     .out = out,
                     .in = in};
  return t;
}

// The definition the fast paths must reproduce: decode row j, dot it with x, add the bias.
template <typename T>
std::vector<T> expert_linear_by_definition(const ExpertLinear& w, int expert, const T* x) {
  std::vector<T> row(size_t(w.in)), bias(size_t(w.out)), y(size_t(w.out));
  read_row(*w.bias, expert, w.out, bias.data());
  for (int j = 0; j < w.out; ++j) {
    read_expert_row(w, expert, j, row.data());
    y[size_t(j)] = dot(row.data(), x, w.in) + bias[size_t(j)];
  }
  return y;
}

// dot as ops.h defines it, written out again so that dot itself is pinned too.
template <typename T>
T dot_by_definition(const T* a, const T* b, int n) {
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) s[i % 8] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

TEST(ReferenceOps, SpreadValuesMakeSummationOrderVisible) {
  // If no reordering changed a bit, the bitwise tests below would prove nothing.
  std::mt19937_64 rng(7);
  const auto a = spread_values<double>(2883, rng), b = spread_values<double>(2883, rng);
  double sequential = 0;
  for (size_t i = 0; i < a.size(); ++i) sequential += a[i] * b[i];
  EXPECT_NE(bits(sequential), bits(dot(a.data(), b.data(), int(a.size()))));
}

template <typename T>
void check_dot_block_on_every_simd_level() {
  std::mt19937_64 rng(11);
  const int max_rows = 9, max_count = 19;
  for (Simd simd : {Simd::Baseline, Simd::Avx2, Simd::Avx512}) {
    if (!simd_supported(simd)) {
      std::cout << "dot_block: " << simd_name(simd) << " not supported by this CPU, not checked\n";
      continue;
    }
    for (int n : {0, 1, 5, 8, 13, 64, 100, 2883}) {
      const auto w = spread_values<T>(size_t(n) * max_rows, rng);
      const auto x = spread_values<T>(size_t(n) * max_count, rng);
      std::vector<const T*> ws, xs;
      for (int j = 0; j < max_rows; ++j) ws.push_back(w.data() + size_t(j) * n);
      for (int r = 0; r < max_count; ++r) xs.push_back(x.data() + size_t(r) * n);
      for (int r = 0; r < max_count; ++r)
        ASSERT_EQ(bits(dot(ws[0], xs[size_t(r)], n)),
                  bits(dot_by_definition(ws[0], xs[size_t(r)], n)))
            << "dot itself, n " << n;
      for (int rows = 1; rows <= max_rows; ++rows)
        for (int count = 1; count <= max_count; ++count) {
          std::vector<T> got(size_t(rows) * count, T(-1));
          dot_block(simd, ws.data(), rows, xs.data(), count, n, got.data());
          for (int j = 0; j < rows; ++j)
            for (int r = 0; r < count; ++r)
              ASSERT_EQ(bits(got[size_t(j) * count + size_t(r)]),
                        bits(dot(ws[size_t(j)], xs[size_t(r)], n)))
                  << simd_name(simd) << " n " << n << " rows " << rows << " count " << count
                  << " element (" << j << ", " << r << ")";
        }
    }
  }
  // The default entry point (the widest level) at the model's width.
  const auto w = spread_values<T>(2880 * 3, rng), x = spread_values<T>(2880 * 5, rng);
  const T* ws[3] = {w.data(), w.data() + 2880, w.data() + 2 * 2880};
  const T* xs[5] = {x.data(), x.data() + 2880, x.data() + 2 * 2880, x.data() + 3 * 2880,
                    x.data() + 4 * 2880};
  T got[15];
  dot_block(ws, 3, xs, 5, 2880, got);
  for (int j = 0; j < 3; ++j)
    for (int r = 0; r < 5; ++r) EXPECT_EQ(bits(got[j * 5 + r]), bits(dot(ws[j], xs[r], 2880)));
}

TEST(ReferenceOps, DotBlockEqualsDotBitwiseOnEverySimdLevelDouble) {
  check_dot_block_on_every_simd_level<double>();
}
TEST(ReferenceOps, DotBlockEqualsDotBitwiseOnEverySimdLevelFloat) {
  check_dot_block_on_every_simd_level<float>();
}

// Every code in every position and every scale byte the loader accepts (0..254: float results
// run from subnormal to infinite), on every SIMD level, against the checkpoint reader's decoder.
template <typename T>
void check_expert_row_on_every_simd_level() {
  std::mt19937_64 rng(23);
  const int experts = 3, out = 255, in = 64;
  TestExperts t = mxfp4_experts(experts, out, in, rng);
  std::vector<uint8_t>& scales = t.scales->bytes;
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t((i * 37) % 255);
  std::vector<T> want(static_cast<size_t>(in)), got(static_cast<size_t>(in));
  for (Simd simd : {Simd::Baseline, Simd::Avx2, Simd::Avx512}) {
    if (!simd_supported(simd)) continue;
    for (int e = 0; e < experts; ++e)
      for (int j = 0; j < out; ++j) {
        read_expert_row(t.w, e, j, want.data());
        expert_row(simd, t.w, e, j, got.data());
        for (int k = 0; k < in; ++k)
          ASSERT_EQ(bits(got[size_t(k)]), bits(want[size_t(k)]))
              << simd_name(simd) << " expert " << e << " row " << j << " element " << k;
      }
  }
}

TEST(ReferenceOps, ExpertRowEqualsCheckpointDecoderOnEverySimdLevel) {
  check_expert_row_on_every_simd_level<double>();
  check_expert_row_on_every_simd_level<float>();
}

// Every BF16 bit pattern (subnormals, infinities and NaNs included), in a row long enough for
// the vector loops and with a tail, on every SIMD level, against the checkpoint reader.
template <typename T>
void check_weight_row_on_every_simd_level() {
  const int64_t n = 65536 + 5;
  std::vector<uint8_t> bytes(size_t(n) * 2 * 2);
  for (int64_t i = 0; i < 2 * n; ++i) {
    const uint16_t b = uint16_t(i * 40503);  // odd multiplier: a permutation of the patterns
    std::memcpy(bytes.data() + 2 * i, &b, 2);
  }
  OwnedTensor t(DType::BF16, {2, n}, std::move(bytes));
  std::vector<T> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  for (Simd simd : {Simd::Baseline, Simd::Avx2, Simd::Avx512}) {
    if (!simd_supported(simd)) continue;
    for (int64_t row : {0, 1}) {
      read_row(t.view, row, n, want.data());
      weight_row(simd, t.view, row, n, got.data());
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(bits(got[size_t(k)]), bits(want[size_t(k)]))
            << simd_name(simd) << " row " << row << " element " << k;
    }
  }
}

TEST(ReferenceOps, WeightRowEqualsCheckpointReaderOnEverySimdLevel) {
  check_weight_row_on_every_simd_level<double>();
  check_weight_row_on_every_simd_level<float>();
}

template <typename T>
void check_linear_against_definition(DType weight_dtype, bool with_bias) {
  std::mt19937_64 rng(13);
  const int out = 37, in = 45;
  const auto wv = spread_values<float>(size_t(out) * in, rng),
             bv = spread_values<float>(size_t(out), rng);
  auto weight =
      weight_dtype == DType::BF16 ? bf16_tensor({out, in}, wv) : f32_tensor({out, in}, wv);
  auto bias = f32_tensor({out}, bv);
  const Linear lin{&weight->view, with_bias ? &bias->view : nullptr, out, in};
  for (int batch : {1, 3, 17}) {
    const auto x = spread_values<T>(size_t(batch) * in, rng);
    std::vector<T> want(size_t(batch) * out), row(static_cast<size_t>(in));
    for (int j = 0; j < out; ++j) {
      read_row(weight->view, j, in, row.data());
      for (int b = 0; b < batch; ++b)
        want[size_t(b) * out + j] =
            dot(row.data(), x.data() + size_t(b) * in, in) + (with_bias ? T(bv[size_t(j)]) : T(0));
    }
    at_thread_counts([&](int) {
      std::vector<T> got(want.size(), T(-1));
      linear(lin, x.data(), batch, got.data());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(bits(got[i]), bits(want[i])) << "batch " << batch << " element " << i;
    });
  }
}

TEST(ReferenceOps, LinearEqualsRowDotPlusBiasBitwise) {
  check_linear_against_definition<double>(DType::BF16, true);
  check_linear_against_definition<double>(DType::F32, false);
  check_linear_against_definition<float>(DType::BF16, true);
  check_linear_against_definition<float>(DType::F32, false);
}

// Jobs over several experts in scrambled order, most experts repeated; the batch must equal one
// expert_linear per job and the definition, at every thread count.
template <typename T>
void check_expert_linear_batch(const ExpertLinear& w, std::mt19937_64& rng) {
  std::vector<int> experts;
  for (int e : {3, 0, 3, 1, 3, 0, 2, 3, 1, 0, 3})
    if (e < w.experts) experts.push_back(e == 2 ? w.experts - 1 : e);
  std::uniform_int_distribution<int> any_expert(0, w.experts - 1);
  for (int i = 0; i < 12; ++i) experts.push_back(any_expert(rng));
  std::shuffle(experts.begin(), experts.end(), rng);
  const size_t jobs_count = experts.size();
  const auto x = spread_values<T>(jobs_count * size_t(w.in), rng);

  std::vector<std::vector<T>> want(jobs_count);
  for (size_t i = 0; i < jobs_count; ++i) {
    want[i] = expert_linear_by_definition(w, experts[i], x.data() + i * size_t(w.in));
    std::vector<T> single(size_t(w.out), T(-1));
    expert_linear(w, experts[i], x.data() + i * size_t(w.in), single.data());
    for (int j = 0; j < w.out; ++j)
      ASSERT_EQ(bits(single[size_t(j)]), bits(want[i][size_t(j)]))
          << "expert_linear, expert " << experts[i] << " row " << j;
  }
  at_thread_counts([&](int) {
    std::vector<T> y(jobs_count * size_t(w.out), T(-1));
    std::vector<ExpertJob<T>> jobs;
    for (size_t i = 0; i < jobs_count; ++i)
      jobs.push_back({experts[i], x.data() + i * size_t(w.in), y.data() + i * size_t(w.out)});
    expert_linear_batch(w, std::span<const ExpertJob<T>>(jobs));
    for (size_t i = 0; i < jobs_count; ++i)
      for (int j = 0; j < w.out; ++j)
        ASSERT_EQ(bits(y[i * size_t(w.out) + size_t(j)]), bits(want[i][size_t(j)]))
            << "job " << i << " expert " << experts[i] << " row " << j;
  });
}

template <typename T>
void check_expert_linear_batch_on_every_layout() {
  std::mt19937_64 rng(17);
  {
    SCOPED_TRACE("MXFP4 4 experts, out 37, in 96");
    const TestExperts t = mxfp4_experts(4, 37, 96, rng);
    check_expert_linear_batch<T>(t.w, rng);
  }
  {
    SCOPED_TRACE("dense F32 5 experts, out 11, in 13");
    const TestExperts t = dense_experts(5, 11, 13, rng);
    check_expert_linear_batch<T>(t.w, rng);
  }
  const auto model = Model::load(test::tiny_model_dir());
  for (const LayerWeights& layer : model->layers) {
    SCOPED_TRACE("tiny model mlp1 / mlp2");
    check_expert_linear_batch<T>(layer.mlp1, rng);
    check_expert_linear_batch<T>(layer.mlp2, rng);
  }
}

TEST(ReferenceOps, ExpertLinearBatchEqualsPerJobBitwiseDouble) {
  check_expert_linear_batch_on_every_layout<double>();
}
TEST(ReferenceOps, ExpertLinearBatchEqualsPerJobBitwiseFloat) {
  check_expert_linear_batch_on_every_layout<float>();
}

TEST(ReferenceOps, ExpertLinearBatchOfNoJobsDoesNothingAndRefusesABadExpert) {
  std::mt19937_64 rng(19);
  const TestExperts t = mxfp4_experts(2, 3, 32, rng);
  expert_linear_batch(t.w, std::span<const ExpertJob<double>>());
  const std::vector<double> x(32, 1.0);
  std::vector<double> y(3);
  const ExpertJob<double> bad{2, x.data(), y.data()};
  EXPECT_THROW(expert_linear_batch(t.w, std::span<const ExpertJob<double>>(&bad, 1)), Error);
}

TEST(ReferenceOps, LinearMagnitudeSumsAbsoluteProductsAndBias) {
  const auto weight = f32_tensor({2, 3}, {1, -2, 0.5f, 3, 4, -1});
  const auto bias = f32_tensor({2}, {0.5f, -1});
  const double x[3] = {2, -1, 4};
  double m[2];
  linear_magnitude(Linear{&weight->view, &bias->view, 2, 3}, x, m);
  EXPECT_EQ(m[0], 2 + 2 + 2 + 0.5);  // |1*2| + |-2*-1| + |0.5*4| + |0.5|
  EXPECT_EQ(m[1], 6 + 4 + 4 + 1.0);  // |3*2| + |4*-1| + |-1*4| + |-1|
  linear_magnitude(Linear{&weight->view, nullptr, 2, 3}, x, m);
  EXPECT_EQ(m[0], 6.0);
  EXPECT_EQ(m[1], 14.0);
}

TEST(ReferenceOps, ExpertLinearMagnitudeSumsAbsoluteProductsAndBias) {
  // Expert 1 of 2, in = 32 (one MXFP4 block per row):
  //   row 0: every byte 0x21 (low nibble 0.5, high nibble 1.0), scale byte 128 (x2): 1, 2, 1, 2...
  //   row 1: every byte 0x9a (low -1.0, high -0.5), scale byte 127 (x1): -1, -0.5, -1, -0.5...
  // x = -1 at even k, 2 at odd k; bias -0.25 and 3.
  std::vector<uint8_t> blocks(2 * 2 * 16, 0), scales(2 * 2, 127);
  std::fill(blocks.begin() + 32, blocks.begin() + 48, uint8_t(0x21));
  std::fill(blocks.begin() + 48, blocks.end(), uint8_t(0x9a));
  scales[2] = 128;
  OwnedTensor b(DType::U8, {2, 2, 1, 16}, blocks), s(DType::U8, {2, 2, 1}, scales);
  const auto bias = f32_tensor({2, 2}, {0, 0, -0.25f, 3});
  const ExpertLinear w{ExpertLayout::Mxfp4, &b.view, &s.view, nullptr, &bias->view, 2, 2, 32};
  double x[32];
  for (int k = 0; k < 32; ++k) x[k] = k % 2 == 0 ? -1 : 2;
  double m[2], y[2];
  expert_linear_magnitude(w, 1, x, m);
  EXPECT_EQ(m[0], 16 * 1 + 16 * 4 + 0.25);  // |1*-1| and |2*2| per pair
  EXPECT_EQ(m[1], 16 * 1 + 16 * 1 + 3.0);   // |-1*-1| and |-0.5*2| per pair
  expert_linear(w, 1, x, y);                // the signed sums, which fix the nibble order
  EXPECT_EQ(y[0], 16 * -1 + 16 * 4 - 0.25);
  EXPECT_EQ(y[1], 16 * 1 + 16 * -1 + 3.0);
}

}  // namespace
}  // namespace parity::ref
