// The device sampler (launch_f32_sample, device/sample.hip) against the CPU definition
// (engine/sampler.h), token for token: batches of mixed parameters (greedy, temperature only,
// top-k on both sides of the 2048-key list, top-p, both) over random float32 rows of the gpt-oss
// vocabulary (201,088) and of small vocabularies, rows full of exact ties, NaN/inf and padded
// rows (ld > vocab); draws of one row against sampling_distribution by a chi-square test on both
// device paths (the sorted list and the histogram selection); batch invariance; the launcher's
// argument checks. The only mismatch allowed is one the CPU proves could come from exp's last
// bit (exp_may_decide below); the tests count those and print them.
// With no GPU the tests skip; a build without a device backend compiles none of this.
#include <gtest/gtest.h>

#ifdef PARITY_HAVE_DEVICE

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "device/runtime/device.h"
#include "device/runtime/device_buffer.h"
#include "tests/device_test_util.h"
#include "engine/sampler.h"
#include "tests/test_util.h"
#include "model/error.h"

namespace parity::device {
namespace {

constexpr int kGptOssVocab = 201088;
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

class DeviceSampler : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no GPU: " << device_unavailable_reason();
  }
};

using test::download;
using test::upload;

// One row of a case: its logits, the parameters, the generator's keys.
struct Row {
  std::vector<float> logits;
  SamplingParams params;
  uint64_t request = 0;
  std::string what;
};

SamplingParams params(double temperature, int top_k, double top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

SampleParams to_device(const SamplingParams& p, uint64_t request, uint64_t step) {
  SampleParams d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.seed = p.seed;
  d.request = request;
  d.step = step;
  return d;
}

// Tokens of the rows at `step` (each row's step is step + row index when per_row_step), in one
// launch with row stride ld >= the longest row; padding holds values that would win if read.
std::vector<int32_t> device_tokens(const std::vector<Row>& rows, int vocab, int ld,
                                   uint64_t step, bool per_row_step = false) {
  std::vector<float> logits(size_t(ld) * rows.size(), 3e38f);
  std::vector<SampleParams> p(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].logits.begin(), rows[r].logits.end(), logits.begin() + long(r) * ld);
    p[r] = to_device(rows[r].params, rows[r].request, per_row_step ? step + r : step);
  }
  const DeviceBuffer d_logits = upload(logits), d_params = upload(p);
  std::vector<int32_t> poison(rows.size() + 1, -7);
  const DeviceBuffer d_tokens = upload(poison);
  launch_f32_sample(d_logits.as<float>(), ld, int(rows.size()), vocab,
                    d_params.as<SampleParams>(), d_tokens.as<int32_t>(), nullptr);
  std::vector<int32_t> got = download<int32_t>(d_tokens, rows.size() + 1);
  EXPECT_EQ(got.back(), -7) << "the kernel wrote past its output";
  got.pop_back();
  return got;
}

// Whether a one-ulp difference in exp (the one operation host and device may round apart) could
// change the token drawn with uniform u: the weights W_j = rint(exp(x_j) 2^40) that lie within
// three ulps of exp of a half-integer may each move by one; the token stands only if no such
// move can carry a cumulative sum across P (step 5) or R (step 6).
bool exp_may_decide(const std::vector<float>& logits, const SamplingParams& p,
                    const SamplingCandidates& c, double u) {
  if (p.greedy() || c.kept == 0) return false;
  const float max_logit = logits[size_t(c.order[0])];
  std::vector<uint64_t> cum(c.order.size()), fragile(c.order.size());
  uint64_t sum = 0, count = 0;
  for (size_t j = 0; j < c.order.size(); ++j) {
    const double x = (double(logits[size_t(c.order[j])]) - double(max_logit)) / p.temperature;
    if (x >= -28.5) {
      const double e = std::exp(x);
      const double y = e * 0x1p40;
      const double ulp = (std::nextafter(e, 2.0) - e) * 0x1p40;
      if (std::fabs(y - std::floor(y) - 0.5) <= 3 * ulp) ++count;
    }
    sum += c.weight[j];
    cum[j] = sum;
    fragile[j] = count;
  }
  if (count == 0) return false;
  const auto lo = [&](size_t j) { return cum[j] - fragile[j]; };
  const auto hi = [&](size_t j) { return cum[j] + fragile[j]; };
  const size_t last = c.kept - 1;
  if (p.top_p < 1) {
    const auto target = [&](uint64_t s) {
      return std::clamp<uint64_t>(uint64_t(std::ceil(p.top_p * double(s))), 1, s);
    };
    const uint64_t total = cum.back(), spread = fragile.back();
    const uint64_t p_min = target(total - spread), p_max = target(total + spread);
    if (last > 0 && hi(last - 1) >= p_min) return true;
    if (lo(last) < p_max) return true;
  }
  const auto draw = [&](uint64_t s) { return std::min(uint64_t(u * double(s)), s - 1); };
  const uint64_t r_min = draw(lo(last)), r_max = draw(hi(last));
  const size_t t = sampling_draw_index(c, u);
  if (t > 0 && hi(t - 1) > r_min) return true;
  return lo(t) <= r_max;
}

// Runs the rows for `steps` steps and compares every token with the CPU's.
void expect_same_tokens(const std::vector<Row>& rows, int vocab, int ld, int steps) {
  std::vector<SamplingCandidates> cands(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    if (!rows[r].params.greedy()) cands[r] = sampling_candidates(rows[r].logits, rows[r].params);
  int mismatches = 0, excused = 0;
  for (int step = 0; step < steps; ++step) {
    const std::vector<int32_t> got = device_tokens(rows, vocab, ld, uint64_t(step));
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& row = rows[r];
      const TokenId want = sample_token(row.logits, row.params, row.request, uint64_t(step));
      if (got[r] == want) continue;
      const double u = sampling_uniform(row.params.seed, row.request, uint64_t(step));
      if (exp_may_decide(row.logits, row.params, cands[r], u)) {
        ++excused;
        std::printf("exp's last bit decides row %zu (%s) step %d: device %d, host %d\n", r,
                    row.what.c_str(), step, got[r], want);
        continue;
      }
      if (mismatches++ < 10)
        ADD_FAILURE() << "row " << r << " (" << row.what << ", vocab " << vocab << ", ld " << ld
                      << ", temperature " << row.params.temperature << ", top_k "
                      << row.params.top_k << ", top_p " << row.params.top_p << ", seed "
                      << row.params.seed << ", request " << row.request << ") step " << step
                      << ": device " << got[r] << ", host " << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::printf("%zu rows x %d steps, vocab %d: %d tokens excused by exp's last bit\n", rows.size(),
              steps, vocab, excused);
}

enum class Shape { normal, wide, ties, specials, all_nonfinite, one_finite };

std::vector<float> make_logits(int vocab, Shape shape, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = normal(rng);
  switch (shape) {
    case Shape::normal:  // O(1) spread: every candidate carries weight
      for (float& x : v) x *= 2.0f;
      break;
    case Shape::wide:  // a model's spread: most of the vocabulary far below the top
      for (float& x : v) x = x * 6.0f - 4.0f;
      break;
    case Shape::ties:  // few distinct values: cuts and draws inside runs of equal logits
      for (float& x : v) x = std::round(x * 2.0f) * 0.5f;
      break;
    case Shape::specials: {
      std::uniform_int_distribution<int> pick(0, vocab - 1);
      for (int i = 0; i < std::max(1, vocab / 50); ++i) v[size_t(pick(rng))] = kNaN;
      for (int i = 0; i < std::max(1, vocab / 100); ++i) v[size_t(pick(rng))] = -kInf;
      v[size_t(pick(rng))] = kInf;  // +inf: never drawn (greedy takes it)
      v[size_t(pick(rng))] = -0.0f;
      v[size_t(pick(rng))] = 0.0f;
      break;
    }
    case Shape::all_nonfinite:
      for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? kNaN : i % 3 == 1 ? -kInf : kInf;
      break;
    case Shape::one_finite:
      std::fill(v.begin(), v.end(), -kInf);
      v[v.size() / 2] = -3.0f;
      break;
  }
  return v;
}

// The mixed batch: every parameter kind against every row shape.
std::vector<Row> mixed_rows(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  struct Kind {
    double t;
    int k;
    double p;
    const char* name;
  };
  const Kind kinds[] = {{0.0, 0, 1.0, "greedy"},          {0.8, 1, 0.9, "top_k 1"},
                        {1.0, 0, 1.0, "temperature 1"},   {0.6, 0, 1.0, "temperature 0.6"},
                        {1.0, 50, 1.0, "top_k 50"},       {1.2, 2048, 1.0, "top_k 2048"},
                        {1.0, 2049, 1.0, "top_k 2049"},   {0.9, 0, 0.9, "top_p 0.9"},
                        {1.0, 0, 0.5, "top_p 0.5"},       {1.0, 40, 0.95, "top_k 40 top_p 0.95"},
                        {2.0, 5000, 0.7, "top_k 5000 top_p 0.7"}};
  const std::pair<Shape, const char*> shapes[] = {{Shape::normal, "normal"},
                                                  {Shape::wide, "wide"},
                                                  {Shape::ties, "ties"},
                                                  {Shape::specials, "NaN/inf"}};
  std::vector<Row> rows;
  uint64_t request = 100;
  for (const auto& [shape, shape_name] : shapes)
    for (const Kind& k : kinds)
      rows.push_back({make_logits(vocab, shape, rng), params(k.t, k.k, k.p, seed + request),
                      request++, std::string(shape_name) + ", " + k.name});
  rows.push_back({make_logits(vocab, Shape::all_nonfinite, rng), params(1.0, 0, 0.9, 5), request++,
                  "no finite logit"});
  rows.push_back({make_logits(vocab, Shape::one_finite, rng), params(1.0, 10, 0.5, 6), request++,
                  "one finite logit"});
  return rows;
}

TEST_F(DeviceSampler, MatchesTheCpuOnTheGptOssVocabulary) {
  const std::vector<Row> rows = mixed_rows(kGptOssVocab, 20261123);
  expect_same_tokens(rows, kGptOssVocab, kGptOssVocab, 4);
}

TEST_F(DeviceSampler, MatchesTheCpuOnPaddedRows) {
  const int vocab = 50021;  // odd, with ld > vocab: the padding (3e38) must never be read
  expect_same_tokens(mixed_rows(vocab, 7), vocab, vocab + 37, 3);
}

TEST_F(DeviceSampler, MatchesTheCpuOnSmallVocabularies) {
  for (const int vocab : {1, 2, 7, 100, 2047, 2048, 2049, 3000, 8191}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    expect_same_tokens(mixed_rows(vocab, uint64_t(vocab)), vocab, vocab, 6);
  }
}


// 20,000 draws of one row (20,000 copies of it in one launch, draw index = row index) against
// sampling_distribution: a chi-square test over the tokens with an expected count of at least 5
// (the others pooled), failing at p-value 1e-6 (a correct sampler fails with probability 1e-6;
// the seeds are fixed, so the result is deterministic). Every draw also equals the CPU's.
void expect_draws_follow_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  const int draws = 20000, vocab = int(logits.size());
  std::vector<Row> rows(size_t(draws), Row{logits, p, 77, "copy"});
  const std::vector<int32_t> got = device_tokens(rows, vocab, vocab, 0, /*per_row_step=*/true);
  const std::vector<double> dist = sampling_distribution(logits, p);
  const SamplingCandidates c = sampling_candidates(logits, p);
  std::vector<int> counts(size_t(vocab), 0);
  int mismatches = 0;
  for (int s = 0; s < draws; ++s) {
    ASSERT_GE(got[size_t(s)], 0);
    ASSERT_LT(got[size_t(s)], vocab);
    ++counts[size_t(got[size_t(s)])];
    const double u = sampling_uniform(p.seed, 77, uint64_t(s));
    const TokenId want = c.order[sampling_draw_index(c, u)];
    if (got[size_t(s)] != want && !exp_may_decide(logits, p, c, u) && mismatches++ < 5)
      ADD_FAILURE() << "draw " << s << ": device " << got[size_t(s)] << ", host " << want;
  }
  EXPECT_EQ(mismatches, 0);
  double chi2 = 0, pooled_e = 0, pooled_n = 0;
  int categories = 0;
  for (int i = 0; i < vocab; ++i) {
    const double e = dist[size_t(i)] * draws;
    if (dist[size_t(i)] == 0) {
      EXPECT_EQ(counts[size_t(i)], 0) << "token " << i << " was cut away but drawn";
    } else if (e < 5) {
      pooled_e += e, pooled_n += counts[size_t(i)];
    } else {
      chi2 += (counts[size_t(i)] - e) * (counts[size_t(i)] - e) / e;
      ++categories;
    }
  }
  if (pooled_e > 0) chi2 += (pooled_n - pooled_e) * (pooled_n - pooled_e) / pooled_e, ++categories;
  ASSERT_GE(categories, 2);
  const double p_value = test::upper_gamma_q((categories - 1) / 2.0, chi2 / 2);
  EXPECT_GT(p_value, 1e-6) << "chi-square " << chi2 << " over " << categories << " categories";
}

TEST_F(DeviceSampler, DrawsFollowTheDistributionSortedListPath) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(24);
  for (float& x : logits) x = normal(rng);
  logits[3] = logits[17];  // a tie
  expect_draws_follow_distribution(logits, params(1.0, 0, 1.0, 31));
  expect_draws_follow_distribution(logits, params(0.8, 12, 0.9, 32));
}

TEST_F(DeviceSampler, DrawsFollowTheDistributionSelectionPath) {
  // 3000 candidates (> the 2048-key list): 12 strong logits and a tail of equal weak ones.
  std::vector<float> logits(3000, -7.0f);
  for (int i = 0; i < 12; ++i) logits[size_t(i * 250)] = 0.25f * float(i % 5);
  expect_draws_follow_distribution(logits, params(1.0, 0, 1.0, 41));
  expect_draws_follow_distribution(logits, params(1.0, 0, 0.97, 42));
}

TEST_F(DeviceSampler, ARowsTokenDoesNotDependOnTheOtherRows) {
  std::vector<Row> rows = mixed_rows(4099, 99);
  const std::vector<int32_t> together = device_tokens(rows, 4099, 4099, 3);
  for (size_t r = 0; r < rows.size(); ++r) {
    // Alone, and between two other rows in the reverse order.
    EXPECT_EQ(device_tokens({rows[r]}, 4099, 4099, 3)[0], together[r]) << rows[r].what;
    const std::vector<Row> sandwich = {rows[rows.size() - 1 - r], rows[r],
                                       rows[(r + 5) % rows.size()]};
    EXPECT_EQ(device_tokens(sandwich, 4099, 4099, 3)[1], together[r]) << rows[r].what;
  }
}

TEST_F(DeviceSampler, ReportsTheTimePerRow) {
  std::mt19937_64 rng(3);
  const int batch = 132, vocab = kGptOssVocab;
  std::vector<float> logits;
  for (int r = 0; r < batch; ++r) {
    const std::vector<float> row = make_logits(vocab, Shape::wide, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const DeviceBuffer d_logits = upload(logits);
  DeviceBuffer d_tokens(size_t(batch) * sizeof(int32_t));
  hipEvent_t start, stop;
  HIP_CHECK(hipEventCreate(&start));
  HIP_CHECK(hipEventCreate(&stop));
  for (const SamplingParams& p :
       {params(0.0, 0, 1.0, 1), params(1.0, 50, 0.9, 1), params(1.0, 0, 0.9, 1),
        params(1.0, 0, 1.0, 1)}) {
    const std::vector<SampleParams> host(size_t(batch), to_device(p, 1, 0));
    const DeviceBuffer d_params = upload(host);
    for (const int rows : {1, batch}) {
      std::vector<float> ms;
      for (int rep = 0; rep < 12; ++rep) {
        HIP_CHECK(hipEventRecord(start, nullptr));
        launch_f32_sample(d_logits.as<float>(), vocab, rows, vocab, d_params.as<SampleParams>(),
                          d_tokens.as<int32_t>(), nullptr);
        HIP_CHECK(hipEventRecord(stop, nullptr));
        HIP_CHECK(hipEventSynchronize(stop));
        float t = 0;
        HIP_CHECK(hipEventElapsedTime(&t, start, stop));
        if (rep >= 2) ms.push_back(t);  // two warm-up launches
      }
      std::sort(ms.begin(), ms.end());
      std::printf("f32_sample vocab %d, %d rows, temperature %g top_k %d top_p %g: median %.1f us\n",
                  vocab, rows, p.temperature, p.top_k, p.top_p, 1e3 * ms[ms.size() / 2]);
    }
  }
  HIP_CHECK(hipEventDestroy(start));
  HIP_CHECK(hipEventDestroy(stop));
}

// The greedy kernel (launch_f32_argmax) against greedy_token on the same rows: every shape of
// mixed_rows (ties, NaN and infinities, a single finite logit, none), 16-byte loads (vocabularies
// of multiples of four, aligned rows) and single ones (other vocabularies, or rows one float off
// alignment).
TEST_F(DeviceSampler, ArgmaxIsTheCpusGreedyToken) {
  for (const int vocab : {kGptOssVocab, 1, 3, 4, 100, 2049, 8191, 8192}) {
    for (const int offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", offset " << offset);
      const std::vector<Row> rows = mixed_rows(vocab, uint64_t(vocab) * 3 + uint64_t(offset));
      std::vector<float> packed(static_cast<size_t>(offset), 0.0f);
      for (const Row& r : rows) packed.insert(packed.end(), r.logits.begin(), r.logits.end());
      const DeviceBuffer logits = upload(packed);
      DeviceBuffer tokens(rows.size() * sizeof(int32_t));
      launch_f32_argmax(logits.as<float>() + offset, int(rows.size()), vocab,
                        tokens.as<int32_t>(), nullptr);
      const std::vector<int32_t> got = download<int32_t>(tokens, rows.size());
      for (size_t i = 0; i < rows.size(); ++i)
        EXPECT_EQ(got[i], greedy_token(std::span<const float>(rows[i].logits))) << rows[i].what;
    }
  }
}

TEST_F(DeviceSampler, LauncherRejectsBadArguments) {
  DeviceBuffer buf(4096);
  const float* logits = buf.as<float>();
  const SampleParams* p = buf.as<SampleParams>();
  int32_t* tokens = buf.as<int32_t>();
  EXPECT_THROW(launch_f32_sample(nullptr, 8, 1, 8, p, tokens, nullptr), parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 8, 1, 8, nullptr, tokens, nullptr), parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 8, 1, 8, p, nullptr, nullptr), parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 8, 0, 8, p, tokens, nullptr), parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 8, kMaxSampleBatch + 1, 8, p, tokens, nullptr),
               parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 8, 1, 0, p, tokens, nullptr), parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, kMaxSampleVocab + 1, 1, kMaxSampleVocab + 1, p, tokens,
                                 nullptr),
               parity::Error);
  EXPECT_THROW(launch_f32_sample(logits, 7, 1, 8, p, tokens, nullptr), parity::Error);
}

}  // namespace
}  // namespace parity::device

#else  // !PARITY_HAVE_DEVICE

TEST(DeviceSampler, NotBuilt) {
  GTEST_SKIP() << "this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)";
}

#endif
