// Each device kernel against the float64 reference ops (reference/ops.h) on random inputs:
// builder-style cases over shapes, named for their boundaries (sizes that are not a multiple of
// the block, one expert, window edges, positions 0, W-1, W, long contexts past one key split).
// Every case poisons its outputs (NaN) and guards the memory after them (a sentinel), then
// checks elementwise |got - want| <= atol + rtol |want| (atol from a rounding bound of the
// kernel's summation), NMSE and cosine; the case's parameters are printed on failure.
// With no GPU the tests skip; a build without a device backend compiles none of this.
#include <gtest/gtest.h>

#ifdef PARITY_HAVE_DEVICE

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "device/hip_backend.h"
#include "device/kernels.h"
#include "device/runtime/device_buffer.h"
#include "device/runtime/shard_plan.h"
#include "device/runtime/step_layout.h"
#include "model/config.h"
#include "model/error.h"
#include "model/numerics.h"
#include "model/precision.h"
#include "reference/ops.h"
#include "tests/device_test_util.h"

namespace parity::device {
namespace {

constexpr double kU = 0x1p-24;  // float unit roundoff
constexpr float kSentinel = 1234.5f;
constexpr size_t kGuard = 64;  // sentinel floats after every output
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

class DeviceKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no GPU: " << device_unavailable_reason();
  }
};

// ------------------------------------------------------------------------------ helpers ---

using test::download;
using test::pack_mxfp4;
using test::PackedMxfp4;
using test::upload;

// An output of n floats, poisoned with NaN, followed by kGuard sentinels.
class Output {
 public:
  explicit Output(size_t n) : n_(n) {
    std::vector<float> init(n + kGuard, kSentinel);
    std::fill(init.begin(), init.begin() + long(n), kNaN);
    buf_ = upload(init);
  }
  float* ptr() const { return buf_.as<float>(); }
  // The n values; fails the test when the guard after them was written.
  std::vector<float> fetch() const {
    std::vector<float> all = download<float>(buf_, n_ + kGuard);
    for (size_t i = n_; i < all.size(); ++i)
      if (all[i] != kSentinel) {
        ADD_FAILURE() << "the kernel wrote past its output: element " << i << " of " << n_;
        break;
      }
    all.resize(n_);
    return all;
  }

 private:
  size_t n_;
  DeviceBuffer buf_;
};

// Elementwise criterion with a per-element absolute tolerance, plus NMSE and cosine.
struct Tol {
  std::vector<double> atol;  // per element (or one value for all)
  double rtol = 0;
  double max_nmse = 1e-10;
  double min_cosine = 1 - 1e-9;
  double at(size_t i) const { return atol.size() == 1 ? atol[0] : atol[i]; }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const Tol& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first_bad = 0, worst = 0;
  double worst_ratio = 0, err2 = 0, ref2 = 0, dot = 0, got2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = false;  // no case has NaN in the reference: a NaN is an unwritten or poisoned value
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;  // masked scores: exactly -inf on both sides
    } else {
      const double lim = tol.at(i) + tol.rtol * std::fabs(w);
      ok = std::fabs(g - w) <= lim;
      const double ratio = lim > 0 ? std::fabs(g - w) / lim : (g == w ? 0 : kInf);
      if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
      err2 += (g - w) * (g - w);
      ref2 += w * w;
      dot += g * w;
      got2 += g * g;
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : err2;
  const double cosine = ref2 > 0 && got2 > 0 ? dot / std::sqrt(ref2 * got2) : 1.0;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance; first at " << first_bad << ": got "
                     << got[first_bad] << ", want " << want[first_bad] << " (atol "
                     << tol.at(first_bad) << ", rtol " << tol.rtol << ")";
  EXPECT_LE(nmse, tol.max_nmse) << what << ": NMSE " << nmse;
  EXPECT_GE(cosine, tol.min_cosine)
      << what << ": cosine " << cosine << " (largest share of tolerance " << worst_ratio << " at "
      << worst << ")";
}

// Rounding bound of a float dot product evaluated as a chain of `chain` roundings:
// |error| <= gamma(chain) * sum |a_i b_i|, doubled for margin.
double dot_atol(int chain, double abs_sum) {
  return 2 * chain * kU / (1 - chain * kU) * abs_sum + 1e-30;
}
// Chain length of a warp-parallel dot of n terms (per-lane fmaf chain, then the butterfly).
int warp_dot_chain(int n) {
  const int w = device_warp_size();
  return (n + w - 1) / w + 8 + int(std::log2(w)) + 2;
}

// Chain length of an MMA kernel's dot of n terms: per block of 32 inputs at most six roundings
// (each split part's two MMA steps, each adding 16 exact products to its accumulator, the parts'
// two adds and the add into the sum: five), then the four quarters' partial sums.
int mma_dot_chain(int n) {
  return 6 * (n / 32) + 16 + 2;
}

// The split-input workspace of the MMA kernels for `floats` inputs.
class SplitScratch {
 public:
  explicit SplitScratch(int64_t floats)
      : words_(split_bf16x3_words(floats)), buf_(std::max<size_t>(1, words_) * sizeof(uint32_t)) {}
  std::span<uint32_t> span() const { return {buf_.as<uint32_t>(), words_}; }

 private:
  size_t words_;
  DeviceBuffer buf_;
};

// The split words a producer wrote beside its output `n` floats of `out` equal the split kernel's.
void expect_split_of(const Output& out, int64_t n, const SplitScratch& got, const char* what) {
  const SplitScratch want(n);
  launch_split_bf16x3(out.ptr(), n, want.span(), nullptr);
  const size_t words = want.span().size();
  std::vector<uint32_t> w1(words), w2(words);
  HIP_CHECK(hipMemcpy(w1.data(), want.span().data(), words * 4, hipMemcpyDeviceToHost));
  HIP_CHECK(hipMemcpy(w2.data(), got.span().data(), words * 4, hipMemcpyDeviceToHost));
  EXPECT_EQ(w1, w2) << what;
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<double> to_double(std::span<const float> v) {
  return {v.begin(), v.end()};
}

// A matrix in one of the checkpoint dtypes, host bytes plus the exact decoded values.
struct HostMatrix {
  WeightType type;
  std::vector<uint8_t> bytes;
  std::vector<double> values;
  TensorView view(std::vector<int64_t> shape) const {
    TensorView t;
    t.name = "test";
    t.file = "test";
    t.dtype = type == WeightType::bf16  ? DType::BF16
              : type == WeightType::f16 ? DType::F16
                                        : DType::F32;
    t.shape = std::move(shape);
    t.data = bytes.data();
    t.nbytes = bytes.size();
    return t;
  }
};

HostMatrix random_matrix(std::mt19937_64& rng, WeightType type, size_t n, float scale = 1.0f) {
  HostMatrix m{type, {}, {}};
  m.values.resize(n);
  m.bytes.resize(n * weight_type_size(type));
  std::uniform_real_distribution<float> d(-scale, scale);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (size_t i = 0; i < n; ++i) {
    if (type == WeightType::bf16) {
      const uint16_t b = float_to_bf16(d(rng));
      std::memcpy(&m.bytes[2 * i], &b, 2);
      m.values[i] = bf16_to_float(b);
    } else if (type == WeightType::f16) {
      // Random sign and mantissa, exponents around 1 (and some subnormals, exponent 0).
      const int r = bits(rng);
      const uint16_t exp = uint16_t(i % 97 == 0 ? 0 : 11 + (r % 5));
      const uint16_t b = uint16_t((r & 0x8000) | (exp << 10) | (bits(rng) & 0x3ff));
      std::memcpy(&m.bytes[2 * i], &b, 2);
      m.values[i] = f16_to_float(b);
    } else {
      const float f = d(rng);
      std::memcpy(&m.bytes[4 * i], &f, 4);
      m.values[i] = f;
    }
  }
  return m;
}

// A BF16 vector as the checkpoint stores biases: values and a view.
struct HostBf16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
  TensorView view(std::vector<int64_t> shape) const {
    TensorView t;
    t.name = "bias";
    t.file = "test";
    t.dtype = DType::BF16;
    t.shape = std::move(shape);
    t.data = reinterpret_cast<const uint8_t*>(bits.data());
    t.nbytes = bits.size() * 2;
    return t;
  }
};
HostBf16 random_bf16(std::mt19937_64& rng, size_t n, float scale) {
  HostBf16 v;
  std::uniform_real_distribution<float> d(-scale, scale);
  for (size_t i = 0; i < n; ++i) {
    v.bits.push_back(float_to_bf16(d(rng)));
    v.values.push_back(bf16_to_float(v.bits.back()));
  }
  return v;
}

const char* type_name(WeightType t) {
  return weight_type_name(t).data();
}

// -------------------------------------------------------------------------- warp size ---

TEST_F(DeviceKernels, CompiledWarpSizeMatchesTheDevice) {
  EXPECT_EQ(compiled_warp_size(nullptr), device_warp_size());
}

// -------------------------------------------------------------------------- embedding ---

class EmbeddingCase {
 public:
  EmbeddingCase& vocab(int v) {
    vocab_ = v;
    return *this;
  }
  EmbeddingCase& hidden(int h) {
    hidden_ = h;
    return *this;
  }
  EmbeddingCase& type(WeightType t) {
    type_ = t;
    return *this;
  }
  std::string describe() const {
    return fmt::format("embedding vocab={} hidden={} type={}", vocab_, hidden_, type_name(type_));
  }
  void run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(7);
    const HostMatrix table = random_matrix(rng, type_, size_t(vocab_) * hidden_);
    const std::vector<int32_t> tokens = {0, vocab_ - 1, vocab_ / 2, 0};
    std::vector<StepRow> rows(tokens.size());
    for (size_t r = 0; r < rows.size(); ++r) rows[r].token = tokens[r];
    DeviceBuffer dt = upload(table.bytes), dr = upload(rows);
    Output x(tokens.size() * hidden_);
    launch_f32_embedding_gather({type_, dt.as(), vocab_, hidden_}, dr.as<StepRow>(),
                                int(rows.size()), x.ptr(), nullptr);
    std::vector<double> want(tokens.size() * hidden_);
    const TensorView tv = table.view({vocab_, hidden_});
    for (size_t r = 0; r < tokens.size(); ++r)
      ref::embedding(tv, tokens[r], want.data() + r * hidden_);
    expect_close(x.fetch(), want, {{0.0}, 0.0, 0.0}, "embedding");  // decoding is exact
  }

 private:
  int vocab_ = 50, hidden_ = 64;
  WeightType type_ = WeightType::bf16;
};

TEST_F(DeviceKernels, EmbeddingBf16FirstAndLastToken) {
  EmbeddingCase().vocab(50).hidden(2880).run();
}
TEST_F(DeviceKernels, EmbeddingHiddenNotMultipleOfBlock) {
  EmbeddingCase().hidden(257).run();
}
TEST_F(DeviceKernels, EmbeddingF16AndF32Tables) {
  EmbeddingCase().type(WeightType::f16).hidden(100).run();
  EmbeddingCase().type(WeightType::f32).hidden(100).run();
}

// ---------------------------------------------------------------------------- rmsnorm ---

class RmsNormCase {
 public:
  RmsNormCase& rows(int r) {
    rows_ = r;
    return *this;
  }
  RmsNormCase& channels(int c) {
    channels_ = c;
    return *this;
  }
  RmsNormCase& type(WeightType t) {
    type_ = t;
    return *this;
  }
  std::string describe() const {
    return fmt::format("rmsnorm rows={} channels={} weight={}", rows_, channels_, type_name(type_));
  }
  void run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(11 + uint64_t(channels_));
    const std::vector<float> x = random_floats(rng, size_t(rows_) * channels_, -3, 3);
    const HostMatrix w = random_matrix(rng, type_, size_t(channels_), 2.0f);
    DeviceBuffer dx = upload(x), dw = upload(w.bytes);
    Output y(x.size());
    const double eps = 1e-5;
    launch_f32_rmsnorm(dx.as<float>(), type_, dw.as(), rows_, channels_, float(eps), y.ptr(),
                       nullptr);
    std::vector<double> want(x.size());
    const std::vector<double> xd = to_double(x);
    for (int r = 0; r < rows_; ++r)
      ref::rmsnorm(xd.data() + size_t(r) * channels_, w.values.data(), channels_,
                   double(float(eps)), want.data() + size_t(r) * channels_);
    // Sum of squares (chain over the block) then sqrt, divide and two products.
    const double rel = 2 * (double(channels_) / 256 + 16 + 8) * kU;
    expect_close(y.fetch(), want, {{1e-30}, rel, 1e-11}, "rmsnorm");
  }

 private:
  int rows_ = 1, channels_ = 64;
  WeightType type_ = WeightType::bf16;
};

// launch_f32_rmsnorm_split: the same y as launch_f32_rmsnorm, and the same split words as the
// split kernel makes of y; an MMA projection reading that split (ready) gives the same outputs as
// one that splits y itself.
TEST_F(DeviceKernels, RmsNormSplitWritesTheSplitOfItsOutput) {
  for (const WeightType type : {WeightType::bf16, WeightType::f32}) {
    for (const int rows : {1, 5}) {
      SCOPED_TRACE(fmt::format("{} rows={}", type_name(type), rows));
      const int n = 2880;
      std::mt19937_64 rng(5 + uint64_t(rows));
      const std::vector<float> x = random_floats(rng, size_t(rows) * n, -30, 30);
      const HostMatrix w = random_matrix(rng, type, size_t(n), 2.0f);
      DeviceBuffer dx = upload(x), dw = upload(w.bytes);
      Output y1(x.size()), y2(x.size());
      launch_f32_rmsnorm(dx.as<float>(), type, dw.as(), rows, n, 1e-5f, y1.ptr(), nullptr);
      const SplitScratch s1(int64_t(rows) * n), s2(int64_t(rows) * n);
      launch_f32_rmsnorm_split(dx.as<float>(), type, dw.as(), rows, n, 1e-5f, y2.ptr(), s2.span(),
                               nullptr);
      const std::vector<float> a = y1.fetch(), b = y2.fetch();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "y " << i;
      launch_split_bf16x3(y1.ptr(), int64_t(rows) * n, s1.span(), nullptr);
      const size_t words = s1.span().size();
      std::vector<uint32_t> w1(words), w2(words);
      HIP_CHECK(hipMemcpy(w1.data(), s1.span().data(), words * 4, hipMemcpyDeviceToHost));
      HIP_CHECK(hipMemcpy(w2.data(), s2.span().data(), words * 4, hipMemcpyDeviceToHost));
      ASSERT_EQ(w1, w2) << "split words";
      // A BF16 projection on the ready split == one splitting y itself.
      const HostMatrix pw = random_matrix(rng, WeightType::bf16, size_t(64) * n);
      DeviceBuffer dpw = upload(pw.bytes);
      const GemvSegment seg{{WeightType::bf16, dpw.as(), 64, n}, nullptr, 0};
      Output p1(size_t(rows) * 64), p2(size_t(rows) * 64);
      launch_f32_gemv_bias({&seg, 1}, y1.ptr(), n, rows, p1.ptr(), 64, {}, {s1.span()}, nullptr);
      launch_f32_gemv_bias({&seg, 1}, y2.ptr(), n, rows, p2.ptr(), 64, {}, {s2.span(), true},
                           nullptr);
      const std::vector<float> q1 = p1.fetch(), q2 = p2.fetch();
      for (size_t i = 0; i < q1.size(); ++i) ASSERT_EQ(q1[i], q2[i]) << "projection " << i;
    }
  }
}
TEST_F(DeviceKernels, RmsNormOneRowOneChannel) {
  RmsNormCase().rows(1).channels(1).run();
}
TEST_F(DeviceKernels, RmsNormChannelsNotMultipleOfBlock) {
  RmsNormCase().rows(3).channels(257).run();
}
TEST_F(DeviceKernels, RmsNormRealWidth) {
  RmsNormCase().rows(3).channels(2880).run();
}
TEST_F(DeviceKernels, RmsNormF16AndF32Weights) {
  RmsNormCase().rows(2).channels(2880).type(WeightType::f16).run();
  RmsNormCase().rows(2).channels(2880).type(WeightType::f32).run();
}

// ------------------------------------------------------------------------------- gemv ---

class GemvCase {
 public:
  GemvCase& out(int v) {
    out_ = v;
    return *this;
  }
  GemvCase& in(int v) {
    in_ = v;
    return *this;
  }
  GemvCase& batch(int v) {
    batch_ = v;
    return *this;
  }
  GemvCase& type(WeightType t) {
    type_ = t;
    return *this;
  }
  GemvCase& bias(bool b) {
    bias_ = b;
    return *this;
  }
  GemvCase& segments(int s) {
    segments_ = s;
    return *this;
  }
  GemvCase& residual(bool r) {
    residual_ = r;
    return *this;
  }
  GemvCase& precision(Precision p) {
    precision_ = p;
    return *this;
  }
  std::string describe() const {
    return fmt::format("gemv out={} in={} batch={} type={} bias={} segments={} residual={} {}",
                       out_, in_, batch_, type_name(type_), bias_, segments_, residual_,
                       precision_ == Precision::bf16 ? "bf16" : "fp32");
  }
  void run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(3 + uint64_t(out_) * 31 + uint64_t(in_));
    // Segments stacked side by side like q | k | v.
    std::vector<int> seg_rows = {out_};
    if (segments_ == 3) seg_rows = {out_, out_ / 2 + 1, 7};
    int ldy = 0;
    for (int r : seg_rows) ldy += r;
    const std::vector<float> x = random_floats(rng, size_t(batch_) * in_, -1, 1);
    // The MMA path's products in bf16 take each input rounded to BF16 (nearest even); the GEMV
    // of F16/F32 weights (and of inputs not in whole blocks of 32) stays exact in either.
    const bool rounds = precision_ == Precision::bf16 && type_ == WeightType::bf16 && in_ % 32 == 0;
    std::vector<double> xd = to_double(x);
    if (rounds)
      for (double& v : xd) v = round_to_storage(v, kUnitBfloat16);
    std::vector<HostMatrix> w;
    std::vector<HostBf16> b;
    std::vector<DeviceBuffer> dw, db;
    std::vector<GemvSegment> segs;
    std::vector<double> want(size_t(batch_) * ldy), abs_sum(want.size());
    int col = 0;
    for (int rows : seg_rows) {
      w.push_back(random_matrix(rng, type_, size_t(rows) * in_));
      b.push_back(random_bf16(rng, size_t(rows), 0.5f));
      dw.push_back(upload(w.back().bytes));
      db.push_back(upload(b.back().values));
      segs.push_back(
          {{type_, dw.back().as(), rows, in_}, bias_ ? db.back().as<float>() : nullptr, col});
      const TensorView wv = w.back().view({rows, in_}), bv = b.back().view({rows});
      Linear lin;
      lin.weight = &wv;
      lin.bias = bias_ ? &bv : nullptr;
      lin.out = rows;
      lin.in = in_;
      std::vector<double> y(size_t(batch_) * rows);
      ref::linear(lin, xd.data(), batch_, y.data());
      for (int bb = 0; bb < batch_; ++bb)
        for (int j = 0; j < rows; ++j) {
          want[size_t(bb) * ldy + col + j] = y[size_t(bb) * rows + j];
          double s = bias_ ? std::fabs(b.back().values[size_t(j)]) : 0;
          for (int i = 0; i < in_; ++i)
            s += std::fabs(w.back().values[size_t(j) * in_ + i] * xd[size_t(bb) * in_ + i]);
          abs_sum[size_t(bb) * ldy + col + j] = s;
        }
      col += rows;
    }
    const std::vector<float> resid = random_floats(rng, want.size(), -4, 4);
    DeviceBuffer dx = upload(x), dres = upload(resid);
    Output y(want.size()), ro(want.size());
    GemvResidual epi;
    if (residual_) epi = {dres.as<float>(), ro.ptr(), ldy};
    const SplitScratch split(int64_t(batch_) * in_);
    launch_f32_gemv_bias(segs, dx.as<float>(), in_, batch_, y.ptr(), ldy, epi,
                         {split.span(), false, precision_}, nullptr);
    Tol tol{std::vector<double>(want.size()), 0.0, 1e-10};
    const int chain = std::max(warp_dot_chain(in_), mma_dot_chain(in_)) + 1;  // GEMV or MMA
    for (size_t i = 0; i < want.size(); ++i) tol.atol[i] = dot_atol(chain, abs_sum[i]);
    const std::vector<float> got = y.fetch();
    expect_close(got, want, tol, "y");
    if (residual_) {
      std::vector<double> want_r(want.size());
      for (size_t i = 0; i < want.size(); ++i) want_r[i] = double(resid[i]) + want[i];
      for (size_t i = 0; i < want.size(); ++i)
        tol.atol[i] += 2 * kU * (std::fabs(resid[i]) + abs_sum[i]);
      expect_close(ro.fetch(), want_r, tol, "residual + y");
      // Fused epilogue == the separate add of the same rounded values.
      const std::vector<float> fused = ro.fetch();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(fused[i], resid[i] + got[i]) << i;
    }
  }

 private:
  int out_ = 64, in_ = 64, batch_ = 1, segments_ = 1;
  WeightType type_ = WeightType::bf16;
  bool bias_ = true, residual_ = false;
  Precision precision_ = Precision::fp32;
};

TEST_F(DeviceKernels, GemvOutNotMultipleOfRowsPerBlock) {
  GemvCase().out(517).in(2880).run();
}
TEST_F(DeviceKernels, GemvOneOutputRow) {
  GemvCase().out(1).in(64).batch(3).run();
}
TEST_F(DeviceKernels, GemvBatchNinePastOneRowChunk) {
  GemvCase().out(130).in(2880).batch(9).run();
}
TEST_F(DeviceKernels, GemvBatchSizesOneToFive) {
  for (int b = 1; b <= 5; ++b) GemvCase().out(33).in(96).batch(b).run();
}
TEST_F(DeviceKernels, GemvInputNotMultipleOfEightTakesTheScalarPath) {
  GemvCase().out(40).in(13).batch(2).run();
  GemvCase().out(40).in(1).batch(1).run();
}
TEST_F(DeviceKernels, GemvF16AndF32Weights) {
  GemvCase().out(100).in(2880).batch(2).type(WeightType::f16).run();
  GemvCase().out(100).in(2880).batch(2).type(WeightType::f32).run();
}
TEST_F(DeviceKernels, GemvWithoutBias) {
  GemvCase().out(77).in(256).batch(2).bias(false).run();
}
TEST_F(DeviceKernels, GemvThreeSegmentsLikeQkv) {
  GemvCase().out(64).in(64).batch(3).segments(3).run();
}
TEST_F(DeviceKernels, GemvResidualEpilogue) {
  GemvCase().out(2880).in(512).batch(2).residual(true).run();
}

// bf16: every tiling's products take the input rounded once to BF16, summed in float32 -- the
// exact sum of the rounded inputs within float32 accumulation (far tighter than the rounding
// itself: an exact-product result fails it); F16 weights and inputs not in whole blocks of 32 take
// the GEMV, exact in both precisions.
TEST_F(DeviceKernels, GemvBf16ProductsRoundEachInputOnce) {
  for (const int batch : {1, 2, 9, 40})
    GemvCase().out(517).in(2880).batch(batch).precision(Precision::bf16).run();
  GemvCase().out(64).in(96).batch(70).segments(3).precision(Precision::bf16).run();
  GemvCase().out(2880).in(512).batch(33).residual(true).precision(Precision::bf16).run();
  GemvCase().out(517).in(512).batch(1030).precision(Precision::bf16).run();  // wide tiles
  GemvCase().out(100).in(2880).batch(2).type(WeightType::f16).precision(Precision::bf16).run();
  GemvCase().out(40).in(13).batch(2).precision(Precision::bf16).run();
}

TEST_F(DeviceKernels, GemvRowResultDoesNotDependOnTheBatch) {
  // The same row alone and as row 5 of 9, 20, 40, 100 and 1030 (the MMA kernel's 8- and 32-row
  // tiles, two of them along the grid's x, three and four along y, and 33: the wide tiles of
  // 128 rows; F16: the GEMV): bitwise equal (a fixed sequence per element, no atomics), in both
  // precisions.
  for (const auto& [type, precision] :
       {std::pair{WeightType::bf16, Precision::fp32}, std::pair{WeightType::bf16, Precision::bf16},
        std::pair{WeightType::f16, Precision::fp32}}) {
    SCOPED_TRACE(
        fmt::format("{} {}", type_name(type), precision == Precision::bf16 ? "bf16" : "fp32"));
    std::mt19937_64 rng(99);
    const int out = 300, in = 2880;
    const HostMatrix w = random_matrix(rng, type, size_t(out) * in);
    const std::vector<float> x = random_floats(rng, size_t(1030) * in, -1, 1);
    DeviceBuffer dw = upload(w.bytes), dx = upload(x);
    const GemvSegment seg{{type, dw.as(), out, in}, nullptr, 0};
    const SplitScratch split(int64_t(1030) * in);
    Output one(static_cast<size_t>(out));
    launch_f32_gemv_bias({&seg, 1}, dx.as<float>() + 5 * in, in, 1, one.ptr(), out, {},
                         {split.span(), false, precision}, nullptr);
    const std::vector<float> o = one.fetch();
    for (const int batch : {9, 20, 40, 100, 1030}) {
      Output all(size_t(batch) * out);
      launch_f32_gemv_bias({&seg, 1}, dx.as<float>(), in, batch, all.ptr(), out, {},
                           {split.span(), false, precision}, nullptr);
      const std::vector<float> a = all.fetch();
      for (int j = 0; j < out; ++j)
        ASSERT_EQ(a[size_t(5) * out + j], o[size_t(j)]) << "batch " << batch << " row " << j;
    }
  }
}
TEST_F(DeviceKernels, GemvMmaBatchPastOneTileAndThreeSegments) {
  GemvCase().out(517).in(2880).batch(40).run();   // 32-row tiles, a partial last one
  GemvCase().out(64).in(96).batch(70).segments(3).run();
  GemvCase().out(2880).in(512).batch(33).residual(true).run();
  // The wide tiles (32 batch tiles of 32 and more): rows not a multiple of 128, a partial last
  // batch tile, an odd number of blocks of 32 inputs, three segments, the residual epilogue.
  GemvCase().out(517).in(512).batch(1030).run();
  GemvCase().out(64).in(96).batch(1100).segments(3).run();
  GemvCase().out(300).in(512).batch(1025).residual(true).run();
}

// The projection's tilings against each other: quarter tiles (four warps on the same rows, a
// quarter of the input each), wide tiles (128 rows a block by 32 batch rows) and, in bf16 where
// they run, the warpgroup tiles (128 by 64, wgmma) give every output the same bits, and the entry
// point gives the same bits as all: rows not a multiple of 128, odd blocks of 32 inputs, three
// segments, the residual epilogue, one to three batch tiles, 66,000 rows (as lm_head: wide from
// the entry point) and 8,200 rows by 130 batch rows (warpgroup from the entry point where they
// run, a partial last row block and batch tile); the narrow tiles (the entry point's on the bf16
// path at batch 32 to 64) on every shape; the wide and narrow tiles refuse batches below 32. In
// both precisions.
TEST_F(DeviceKernels, GemvWideAndQuarterTilesAgree) {
  struct Shape {
    int out, in, batch, segments;
    bool residual;
  };
  for (const Precision precision : {Precision::fp32, Precision::bf16})
    for (const Shape sh :
         {Shape{517, 2880, 32, 1, false}, Shape{300, 96, 40, 3, false},
          Shape{517, 512, 64, 1, true}, Shape{260, 2880, 33, 1, false}, Shape{300, 96, 70, 1, true},
          Shape{66000, 64, 40, 1, false}, Shape{8200, 96, 130, 1, true}}) {
      SCOPED_TRACE(fmt::format("out={} in={} batch={} segments={} residual={} {}", sh.out, sh.in,
                               sh.batch, sh.segments, sh.residual,
                               precision == Precision::bf16 ? "bf16" : "fp32"));
      std::mt19937_64 rng(7 + uint64_t(sh.out) + uint64_t(sh.batch));
      std::vector<int> seg_rows = {sh.out};
      if (sh.segments == 3) seg_rows = {sh.out, sh.out / 2 + 1, 7};
      int ldy = 0;
      std::vector<HostMatrix> w;
      std::vector<DeviceBuffer> dw, db;
      std::vector<GemvSegment> segs;
      for (const int rows : seg_rows) {
        w.push_back(random_matrix(rng, WeightType::bf16, size_t(rows) * sh.in));
        dw.push_back(upload(w.back().bytes));
        db.push_back(upload(random_floats(rng, size_t(rows), -1, 1)));
        segs.push_back(
            {{WeightType::bf16, dw.back().as(), rows, sh.in}, db.back().as<float>(), ldy});
        ldy += rows;
      }
      const std::vector<float> x = random_floats(rng, size_t(sh.batch) * sh.in, -3, 3);
      const std::vector<float> resid = random_floats(rng, size_t(sh.batch) * ldy, -4, 4);
      DeviceBuffer dx = upload(x), dres = upload(resid);
      const SplitScratch split(int64_t(sh.batch) * sh.in);
      const auto run = [&](detail::GemvTiling tiling) {
        Output y(size_t(sh.batch) * ldy), ro(size_t(sh.batch) * ldy);
        GemvResidual epi;
        if (sh.residual) epi = {dres.as<float>(), ro.ptr(), ldy};
        detail::launch_f32_gemv_bias_tiled(segs, dx.as<float>(), sh.in, sh.batch, y.ptr(), ldy, epi,
                                           {split.span(), false, precision}, tiling, nullptr);
        std::vector<float> out = y.fetch();
        if (sh.residual) {
          const std::vector<float> r = ro.fetch();
          out.insert(out.end(), r.begin(), r.end());
        }
        return out;
      };
      const std::vector<float> quarter = run(detail::GemvTiling::quarter);
      const std::vector<float> narrow = run(detail::GemvTiling::narrow);
      const std::vector<float> wide = run(detail::GemvTiling::wide);
      const std::vector<float> entry = run(detail::GemvTiling::automatic);
      for (size_t i = 0; i < quarter.size(); ++i) ASSERT_FALSE(std::isnan(quarter[i])) << i;
      EXPECT_EQ(std::memcmp(quarter.data(), narrow.data(), quarter.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(quarter.data(), wide.data(), quarter.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(quarter.data(), entry.data(), quarter.size() * sizeof(float)), 0);
      EXPECT_EQ(detail::gemv_wide(sh.out, sh.batch), sh.out == 66000) << "the entry point's tiling";
      EXPECT_EQ(detail::gemv_narrow(sh.batch, precision),
                precision == Precision::bf16 && sh.batch <= 64)
          << "the entry point's tiling on the bf16 path at batch 32 to 64";
      EXPECT_EQ(detail::gemv_warpgroup(sh.out, sh.batch), sh.out == 8200)
          << "the entry point's tiling where the warpgroup tiles run";
      if (precision == Precision::bf16 && warpgroup_mma_available()) {
        const std::vector<float> warpgroup = run(detail::GemvTiling::warpgroup);
        EXPECT_EQ(std::memcmp(quarter.data(), warpgroup.data(), quarter.size() * sizeof(float)), 0);
      }
    }
  std::mt19937_64 rng(8);
  const HostMatrix w = random_matrix(rng, WeightType::bf16, size_t(256) * 64);
  DeviceBuffer dw = upload(w.bytes), dx = upload(random_floats(rng, size_t(31) * 64, -1, 1));
  const GemvSegment seg{{WeightType::bf16, dw.as(), 256, 64}, nullptr, 0};
  const SplitScratch split(int64_t(31) * 64);
  Output y(size_t(31) * 256);
  for (const detail::GemvTiling tiling : {detail::GemvTiling::wide, detail::GemvTiling::narrow})
    EXPECT_THROW(detail::launch_f32_gemv_bias_tiled({&seg, 1}, dx.as<float>(), 64, 31, y.ptr(), 256,
                                                    {}, {split.span()}, tiling, nullptr),
                 parity::Error);
}

// ------------------------------------------------------------------------------- rope ---

class RopeCase {
 public:
  RopeCase& heads(int h) {
    heads_ = h;
    return *this;
  }
  RopeCase& kv(int k) {
    kv_ = k;
    return *this;
  }
  RopeCase& dim(int d) {
    d_ = d;
    return *this;
  }
  RopeCase& pos(int p) {
    pos_ = p;
    return *this;
  }
  RopeCase& rows(int r) {
    rows_ = r;
    return *this;
  }
  std::string describe() const {
    return fmt::format("qkv split + yarn rope heads={} kv={} d={} pos={}..{}", heads_, kv_, d_,
                       pos_, pos_ + rows_ - 1);
  }
  void run() const {
    SCOPED_TRACE(describe());
    Config c;  // gpt-oss YaRN defaults: theta 150000, factor 32, beta 32/1, original 4096
    c.head_dim = d_;
    const Rope rope = Rope::from_config(c);
    std::vector<float> inv(rope.inv_freq.begin(), rope.inv_freq.end());
    std::mt19937_64 rng(5 + uint64_t(pos_));
    const int qkv_dim = (heads_ + 2 * kv_) * d_;
    const std::vector<float> qkv = random_floats(rng, size_t(rows_) * qkv_dim, -2, 2);
    std::vector<StepRow> rows(static_cast<size_t>(rows_));
    for (int r = 0; r < rows_; ++r) rows[size_t(r)].pos = pos_ + r;
    DeviceBuffer dqkv = upload(qkv), drows = upload(rows), dinv = upload(inv);
    Output q(size_t(rows_) * heads_ * d_), k(size_t(rows_) * kv_ * d_), v(size_t(rows_) * kv_ * d_);
    launch_f32_qkv_split_yarn_rope(dqkv.as<float>(), drows.as<StepRow>(), rows_, heads_, kv_, d_,
                                   dinv.as<float>(), float(rope.concentration), q.ptr(), k.ptr(),
                                   v.ptr(), nullptr, nullptr);
    std::vector<double> wq, wk, wv;
    Tol tq{{}, 4 * kU, 1e-9}, tk = tq;
    for (int r = 0; r < rows_; ++r) {
      const float* src = qkv.data() + size_t(r) * qkv_dim;
      std::vector<double> qh(src, src + heads_ * d_),
          kh(src + heads_ * d_, src + (heads_ + kv_) * d_);
      ref::rope(qh.data(), heads_, d_, pos_ + r, rope.inv_freq, rope.concentration);
      ref::rope(kh.data(), kv_, d_, pos_ + r, rope.inv_freq, rope.concentration);
      // The device angle is float(pos) * float(inv_freq): off by about (pos + 1) ulp-sized
      // radians from the double one, times the pair's magnitude.
      auto add_tol = [&](const float* x, int heads, Tol& t) {
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < d_; ++i) {
            const int p = i % (d_ / 2);
            const double mag = std::fabs(x[h * d_ + p]) + std::fabs(x[h * d_ + p + d_ / 2]);
            t.atol.push_back((4.0 * (pos_ + r + 1) + 8) * kU * rope.concentration * mag);
          }
      };
      add_tol(src, heads_, tq);
      add_tol(src + heads_ * d_, kv_, tk);
      wq.insert(wq.end(), qh.begin(), qh.end());
      wk.insert(wk.end(), kh.begin(), kh.end());
      wv.insert(wv.end(), src + (heads_ + kv_) * d_, src + qkv_dim);
    }
    expect_close(q.fetch(), wq, tq, "q_rope");
    expect_close(k.fetch(), wk, tk, "k_rope");
    expect_close(v.fetch(), wv, {{0.0}, 0.0, 0.0}, "v");

    // With the KV append: the same outputs, and the cache rows the append kernel writes of them
    // (a paged cache of blocks of two positions in shuffled order, NaN elsewhere, slot 1 of 2),
    // in either dtype: the BF16 cache holds the float32 cache's values rounded to nearest even.
    AttentionShape a;
    a.n_heads = heads_, a.n_kv = kv_, a.head_dim = d_, a.max_context = pos_ + rows_ + 2;
    a.kv_group = kKvSlidingGroup, a.kv_slot = 1;
    const int blocks = (pos_ + rows_ + 1) / 2;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int b = 0; b < blocks; ++b) table[size_t(b)] = (b * 7 + 3) % blocks;
    for (auto& row : rows) row.kv_table[a.kv_group] = 0;
    const size_t elements = size_t(blocks) * 2 * 2 * 2 * kv_ * d_;
    DeviceBuffer dtable = upload(table), drows2 = upload(rows);
    std::vector<float> f32_cache;
    for (const KvDtype dtype : {KvDtype::f32, KvDtype::bf16}) {
      SCOPED_TRACE(dtype == KvDtype::bf16 ? "bf16 cache" : "f32 cache");
      const size_t bytes = elements * size_t(kv_dtype_bytes(dtype));
      std::vector<unsigned char> nan_pool(bytes);
      for (size_t i = 0; i < elements; ++i) {
        if (dtype == KvDtype::bf16) {
          const uint16_t b = float_to_bf16(kNaN);
          std::memcpy(nan_pool.data() + 2 * i, &b, 2);
        } else {
          std::memcpy(nan_pool.data() + 4 * i, &kNaN, 4);
        }
      }
      DeviceBuffer pool_a = upload(nan_pool), pool_b = upload(nan_pool);
      const KvCacheView kv_a{pool_a.as(), dtable.as<int32_t>(), 1, 2, dtype};
      const KvCacheView kv_b{pool_b.as(), dtable.as<int32_t>(), 1, 2, dtype};
      Output q2(size_t(rows_) * heads_ * d_), k2(size_t(rows_) * kv_ * d_),
          v2(size_t(rows_) * kv_ * d_);
      const KvAppend append{a, kv_a};
      launch_f32_qkv_split_yarn_rope(dqkv.as<float>(), drows2.as<StepRow>(), rows_, heads_, kv_, d_,
                                     dinv.as<float>(), float(rope.concentration), q2.ptr(),
                                     k2.ptr(), v2.ptr(), &append, nullptr);
      launch_f32_kv_cache_append(a, kv_b, drows2.as<StepRow>(), rows_, k2.ptr(), v2.ptr(), nullptr);
      for (const auto& [one, two, what] :
           {std::tuple{&q, &q2, "q"}, {&k, &k2, "k"}, {&v, &v2, "v"}}) {
        const std::vector<float> x = one->fetch(), y = two->fetch();
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << what << " with the append";
      }
      std::vector<unsigned char> got(bytes), want(bytes);
      HIP_CHECK(hipMemcpy(got.data(), pool_a.as(), bytes, hipMemcpyDeviceToHost));
      HIP_CHECK(hipMemcpy(want.data(), pool_b.as(), bytes, hipMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << "the KV cache rows";
      if (dtype == KvDtype::f32) {
        f32_cache.resize(elements);
        std::memcpy(f32_cache.data(), got.data(), bytes);
        continue;
      }
      int written = 0;
      for (size_t i = 0; i < elements; ++i) {
        uint16_t b;
        std::memcpy(&b, got.data() + 2 * i, 2);
        if (std::isnan(f32_cache[i])) {
          EXPECT_TRUE(std::isnan(bf16_to_float(b))) << "element " << i;
          continue;
        }
        ++written;
        EXPECT_EQ(b, float_to_bf16(f32_cache[i])) << "element " << i;
      }
      EXPECT_EQ(written, 2 * rows_ * kv_ * d_);  // every K and V element of the step's rows
    }
  }

 private:
  int heads_ = 4, kv_ = 2, d_ = 16, pos_ = 0, rows_ = 1;
};

TEST_F(DeviceKernels, RopeAtPositionZeroOnlyScales) {
  RopeCase().pos(0).run();
}
TEST_F(DeviceKernels, RopeAroundTheWindow) {
  for (int pos : {7, 8, 127, 128}) RopeCase().heads(8).kv(2).dim(64).pos(pos).rows(2).run();
}
TEST_F(DeviceKernels, RopeRealShapeLongPosition) {
  RopeCase().heads(64).kv(8).dim(64).pos(4094).rows(2).run();
}

// -------------------------------------------------------------------------- attention ---

// Rows at positions pos .. pos + rows - 1 of `seqs` sequences, each with its own blocks of a
// paged cache (block size `block`, two layer slots, the case's layer in slot 1), the blocks of
// all sequences shuffled through the pool. Earlier positions are uploaded as a previous step
// would have left them; this step's k/v go through the append kernel. Keys outside the window
// and positions not yet written are NaN in the pool, blocks that slid out of the window have no
// block (-1) in the table, and the other layer group's table points at a block of NaN: reading
// any of them would show.
class AttentionCase {
 public:
  AttentionCase& heads(int h) {
    heads_ = h;
    return *this;
  }
  AttentionCase& kv(int k) {
    kv_ = k;
    return *this;
  }
  AttentionCase& dim(int d) {
    d_ = d;
    return *this;
  }
  AttentionCase& window(int w) {
    window_ = w;
    return *this;
  }
  AttentionCase& pos(int p) {
    pos_ = p;
    return *this;
  }
  AttentionCase& rows(int r) {
    rows_ = r;
    return *this;
  }
  AttentionCase& seqs(int s) {
    seqs_ = s;
    return *this;
  }
  AttentionCase& block(int b) {
    block_ = b;
    return *this;
  }
  // Whether the output kernel also writes o_proj's split of its output (when nH d allows).
  AttentionCase& split(bool on) {
    split_ = on;
    return *this;
  }
  // Whether the scores and output kernels take the rows in query tiles (as build_step makes
  // them: consecutive rows of one sequence, at most kQueryTileRows).
  AttentionCase& tiled(bool on) {
    tiled_ = on;
    return *this;
  }
  // Whether the decode kernel computes all three stages (launch_f32_attention_decode).
  AttentionCase& fused(bool on) {
    fused_ = on;
    return *this;
  }
  // Whether the bf16 precision's kernel computes them (launch_bf16_attention_mma): BF16 operands
  // for both products, so the reference's tolerances grow by their rounding. `traced`: it writes
  // the scores too and the softmax kernel computes att from them; otherwise only the output is
  // written (and compared).
  AttentionCase& mma(bool on, bool traced = true) {
    mma_ = on;
    traced_ = traced;
    return *this;
  }
  // Whether the bf16 kernel is given the workspace for its decode rows' key-tile partials
  // (attention_mma_splits); without it every row folds its key tiles in one kernel.
  AttentionCase& by_keys(bool on) {
    by_keys_ = on;
    return *this;
  }
  // The first n sequences decode: only their last row (position pos + rows - 1) is in the step,
  // ahead of the other sequences' rows, as the engine's mixed steps order them.
  AttentionCase& lead(int n) {
    lead_ = n;
    return *this;
  }
  AttentionCase& bf16_cache(bool on = true) {  // the float32 kernels over a BF16 cache
    bf16_cache_ = on;
    return *this;
  }
  std::string describe() const {
    return fmt::format(
        "attention heads={} kv={} d={} window={} positions {}..{} sequences={} block={} tiled={} "
        "fused={} mma={} traced={} by_keys={} lead={} bf16_cache={}",
        heads_, kv_, d_, window_, pos_, pos_ + rows_ - 1, seqs_, block_, tiled_, fused_, mma_,
        traced_, by_keys_, lead_, mma_ || bf16_cache_);
  }
  struct Result {
    std::vector<float> scores, probs, out;
  };
  Result run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(17 + uint64_t(pos_) * 3 + uint64_t(window_));
    const int P = pos_ + rows_, kvd = kv_ * d_, slots = 2, slot = 1;
    const int max_ctx = P + 3;
    int shift = 0;
    while ((1 << shift) < block_) ++shift;
    AttentionShape a;
    a.n_heads = heads_;
    a.n_kv = kv_;
    a.head_dim = d_;
    a.window = window_;
    a.max_context = max_ctx;
    a.kv_group = window_ > 0 ? kKvSlidingGroup : kKvFullGroup;
    a.kv_slot = slot;
    a.scale = float(1.0 / std::sqrt(double(d_)));
    // Each sequence's rows in the step: the first lead_ (decoding) only their last.
    const auto first_row = [&](int s) { return s < lead_ ? rows_ - 1 : 0; };
    std::vector<int32_t> positions, row_seq;
    for (int s = 0; s < seqs_; ++s)
      for (int r = first_row(s); r < rows_; ++r) {
        positions.push_back(pos_ + r);
        row_seq.push_back(s);
      }
    const int B = int(positions.size());
    std::vector<StepRow> rows(static_cast<size_t>(B));
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int r = 0; r < B; ++r) {
      offsets.push_back(total);
      total += int64_t(heads_) * (positions[size_t(r)] + 2);
    }
    const std::vector<float> sinks = random_floats(rng, size_t(heads_), -2, 2);
    const std::vector<float> q = random_floats(rng, size_t(B) * heads_ * d_, -1, 1);
    std::vector<std::vector<float>> k_all, v_all;  // per sequence [P][kvd]
    // Block tables: each sequence's, then one for the other group, all of one NaN block.
    const int per_seq = (P + block_ - 1) / block_;
    const int first_needed = window_ > 0 ? std::max(0, pos_ - window_ + 1) : 0;
    const int lo = first_needed / block_;  // blocks below slid out of the window
    const int n_blocks = seqs_ * per_seq + 1, nan_block = n_blocks - 1;
    std::vector<int32_t> physical(size_t(seqs_) * per_seq);
    for (size_t i = 0; i < physical.size(); ++i) physical[i] = int32_t(i);
    std::mt19937_64 placement(5 + uint64_t(block_));  // apart: the values must not depend on it
    std::shuffle(physical.begin(), physical.end(), placement);
    std::vector<int32_t> tables;
    for (int s = 0; s < seqs_; ++s)
      for (int b = 0; b < per_seq; ++b)
        tables.push_back(b < lo ? -1 : physical[size_t(s * per_seq + b)]);
    const int32_t nan_table = int32_t(tables.size());
    tables.insert(tables.end(), size_t(per_seq), nan_block);
    KvCacheView host_kv{nullptr, tables.data(), shift, slots};
    // The MMA kernel reads a BF16 cache (kv_cache_dtype); the float32 kernels either. The
    // expected values are computed from the keys and values the cache holds.
    const KvDtype dtype = mma_ || bf16_cache_ ? KvDtype::bf16 : KvDtype::f32;
    const auto cached = [&](float x) {
      return dtype == KvDtype::bf16 ? bf16_to_float(float_to_bf16(x)) : x;
    };
    std::vector<float> pool(size_t(n_blocks) * slots * 2 * block_ * kvd, kNaN);
    std::vector<float> k_new, v_new;
    for (int s = 0; s < seqs_; ++s) {
      k_all.push_back(random_floats(rng, size_t(P) * kvd, -1, 1));
      v_all.push_back(random_floats(rng, size_t(P) * kvd, -2, 2));
      // The positions before the step's rows that they can see; the step's come from the append
      // kernel.
      const int32_t* table = tables.data() + s * per_seq;
      for (int j = first_needed; j < pos_ + first_row(s); ++j)
        for (int i = 0; i < kvd; ++i) {
          pool[size_t(kv_row_offset(host_kv, table, slot, 0, j, kvd) + i)] =
              k_all.back()[size_t(j) * kvd + i];
          pool[size_t(kv_row_offset(host_kv, table, slot, 1, j, kvd) + i)] =
              v_all.back()[size_t(j) * kvd + i];
        }
      for (int r = first_row(s); r < rows_; ++r) {
        const size_t j = size_t(pos_ + r);
        k_new.insert(k_new.end(), k_all.back().begin() + long(j * kvd),
                     k_all.back().begin() + long((j + 1) * kvd));
        v_new.insert(v_new.end(), v_all.back().begin() + long(j * kvd),
                     v_all.back().begin() + long((j + 1) * kvd));
        const size_t b = k_new.size() / size_t(kvd) - 1;  // the row's index in the step
        StepRow& row = rows[b];
        row.pos = pos_ + r;
        row.seq = s;
        row.scores_offset = offsets[b];
        row.kv_table[a.kv_group] = s * per_seq;
        row.kv_table[1 - a.kv_group] = nan_table;
      }
    }
    std::vector<uint16_t> pool_bf16;
    if (dtype == KvDtype::bf16)
      for (const float x : pool) pool_bf16.push_back(float_to_bf16(x));
    DeviceBuffer drows = upload(rows), dq = upload(q), dsinks = upload(sinks), dk = upload(k_new),
                 dv = upload(v_new),
                 dpool = dtype == KvDtype::bf16 ? upload(pool_bf16) : upload(pool),
                 dtables = upload(tables);
    const KvCacheView kv{dpool.as(), dtables.as<int32_t>(), shift, slots, dtype};
    const size_t ws_floats = attention_workspace_floats(a, B);
    DeviceBuffer ws(std::max<size_t>(1, ws_floats) * sizeof(float));
    Output scores(static_cast<size_t>(total)), probs(static_cast<size_t>(total)),
        out(size_t(B) * heads_ * d_);
    const int max_pos = P - 1;
    const StepRow* dr = drows.as<StepRow>();
    const std::vector<int32_t> tile_first = query_tiles(rows);
    DeviceBuffer dtiles = upload(tile_first);
    const QueryTiles tiles =
        tiled_ ? QueryTiles{dtiles.as<int32_t>(), int(tile_first.size()) - 1,
                            leading_single_tiles(tile_first.data(), int(tile_first.size()) - 1)}
               : QueryTiles{};
    launch_f32_kv_cache_append(a, kv, dr, B, dk.as<float>(), dv.as<float>(), nullptr);
    const bool split = split_ && attention_out_writes_split(a);
    const SplitScratch out_split(split ? int64_t(B) * heads_ * d_ : 0);
    if (mma_) {
      const std::span<float> partials =
          by_keys_ ? std::span<float>(ws.as<float>(), ws_floats) : std::span<float>{};
      // The decode rows' key tiles go over blocks whenever the workspace is given and a row has
      // more than one (the workspace is sized for every key tile of the context).
      const int alone = tiled_ ? tiles.singles : B;
      EXPECT_EQ(attention_mma_splits(a, B, max_pos, partials.size(), tiles),
                by_keys_ && alone > 0 && attention_key_tiles(max_pos, window_) > 1);
      launch_bf16_attention_mma(a, kv, dr, B, max_pos, dq.as<float>(), dsinks.as<float>(),
                                traced_ ? scores.ptr() : nullptr, out.ptr(), out_split.span(),
                                partials, nullptr, tiles);
      if (traced_) launch_f32_softmax_with_sink(heads_, dr, B, scores.ptr(), probs.ptr(), nullptr);
    } else if (fused_) {
      launch_f32_attention_decode(a, kv, dr, B, max_pos, dq.as<float>(), dsinks.as<float>(),
                                  scores.ptr(), probs.ptr(), out.ptr(), out_split.span(), nullptr);
    } else {
      launch_f32_attention_scores(a, kv, dr, B, max_pos, dq.as<float>(), dsinks.as<float>(),
                                  scores.ptr(), nullptr, tiles);
      launch_f32_softmax_with_sink(heads_, dr, B, scores.ptr(), probs.ptr(), nullptr);
      launch_f32_attention_pv(a, kv, dr, B, max_pos, probs.ptr(), ws.as<float>(), out.ptr(),
                              out_split.span(), nullptr, tiles);
    }
    if (split)
      expect_split_of(out, int64_t(B) * heads_ * d_, out_split, "the attention output's split");

    std::vector<double> want_s, want_p, want_o, s_atol, p_atol, o_atol;
    const std::vector<double> sinks_d = to_double(sinks);
    const int g = heads_ / kv_;
    for (int b = 0; b < B; ++b) {
      const int s = row_seq[size_t(b)], p = positions[size_t(b)], cols = p + 2;
      const int first = window_ > 0 ? std::max(0, p - window_ + 1) : 0;
      std::vector<double> kd(size_t(p + 1) * kvd, std::nan("")), vd = kd;  // masked keys NaN
      for (int j = first; j <= p; ++j)
        for (int i = 0; i < kvd; ++i) {
          kd[size_t(j) * kvd + i] = cached(k_all[size_t(s)][size_t(j) * kvd + i]);
          vd[size_t(j) * kvd + i] = cached(v_all[size_t(s)][size_t(j) * kvd + i]);
        }
      const std::vector<double> qd(q.begin() + long(size_t(b) * heads_ * d_),
                                   q.begin() + long(size_t(b + 1) * heads_ * d_));
      std::vector<double> sc(size_t(heads_) * cols), pr(sc.size()), o(size_t(heads_) * d_);
      ref::attention_scores(qd.data(), kd.data(), sinks_d.data(), heads_, kv_, d_, p, window_,
                            sc.data());
      ref::softmax_with_sink(sc.data(), heads_, cols, pr.data());
      ref::attention_output(pr.data(), vd.data(), heads_, kv_, d_, p, o.data());
      want_s.insert(want_s.end(), sc.begin(), sc.end());
      want_p.insert(want_p.end(), pr.begin(), pr.end());
      want_o.insert(want_o.end(), o.begin(), o.end());
      for (int h = 0; h < heads_; ++h) {
        // Scores: a chain of d fmaf and the scale. Probabilities: their own score's error and the
        // row's largest (through the max and the sum), plus exp and the sums' rounding. Output:
        // its own summation and the probabilities' relative error.
        double row_max = 0;
        for (int j = 0; j < cols; ++j) {
          double abs_dot = 0;
          if (j >= first && j <= p)
            for (int i = 0; i < d_; ++i)
              abs_dot += std::fabs(qd[size_t(h) * d_ + i] * kd[(size_t(j) * kv_ + h / g) * d_ + i]);
          // The MMA kernel's q and k are rounded once to BF16: 2^-8 each, relative.
          s_atol.push_back(dot_atol(d_ + 1, abs_dot * a.scale) +
                           (mma_ ? 0x1p-7 * abs_dot * a.scale : 0.0));
          row_max = std::max(row_max, s_atol.back());
        }
        for (int j = 0; j < cols; ++j) {
          const double own = s_atol[s_atol.size() - size_t(cols) + size_t(j)];
          p_atol.push_back(2 * (own + row_max + 64 * kU) * std::fabs(pr[size_t(h) * cols + j]) +
                           1e-30);
        }
        for (int i = 0; i < d_; ++i) {
          double abs_sum = 0;
          for (int j = first; j <= p; ++j)
            abs_sum += std::fabs(pr[size_t(h) * cols + j] * vd[(size_t(j) * kv_ + h / g) * d_ + i]);
          // The MMA kernel's probabilities and v are rounded once to BF16, and its online
          // softmax rescales each key tile's partial sums (one rounding a tile).
          o_atol.push_back(
              dot_atol(std::min(p + 1, 256) + 64 + (mma_ ? (p + 1) / 32 + 4 : 0), abs_sum) +
              (4 * row_max + 128 * kU + (mma_ ? 0x1p-7 : 0.0)) * abs_sum);
        }
      }
    }
    Result got{scores.fetch(), probs.fetch(), out.fetch()};
    // The MMA kernel's BF16 operands: NMSE of order (2^-8)^2, cosine 1 - NMSE / 2.
    const double nmse = mma_ ? 1e-4 : 1e-10, cosine = mma_ ? 1 - 1e-4 : 1 - 1e-9;
    if (!mma_ || traced_) {
      expect_close(got.scores, want_s, {s_atol, 2 * kU, nmse, cosine}, "scores");
      expect_close(got.probs, want_p, {p_atol, 64 * kU, nmse, cosine}, "att");
    }
    expect_close(got.out, want_o, {o_atol, 64 * kU, nmse, cosine}, "attn_out");
    return got;
  }

 private:
  int heads_ = 4, kv_ = 2, d_ = 16, window_ = 0, pos_ = 0, rows_ = 1, seqs_ = 1, block_ = 4;
  bool split_ = true, tiled_ = false, fused_ = false, mma_ = false, traced_ = false,
       by_keys_ = true, bf16_cache_ = false;
  int lead_ = 0;
};

// A case's shape as the tests list them, and its AttentionCase.
struct AttentionCaseShape {
  int heads, kv, d, window, pos, rows, seqs;
};
AttentionCase attention_case(const AttentionCaseShape& s) {
  return AttentionCase()
      .heads(s.heads)
      .kv(s.kv)
      .dim(s.d)
      .window(s.window)
      .pos(s.pos)
      .rows(s.rows)
      .seqs(s.seqs);
}
// Every score, probability and output bit of `got` as `want`'s.
void expect_same_bits(const AttentionCase::Result& got, const AttentionCase::Result& want) {
  EXPECT_EQ(std::memcmp(got.scores.data(), want.scores.data(), want.scores.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got.probs.data(), want.probs.data(), want.probs.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got.out.data(), want.out.data(), want.out.size() * 4), 0);
}

TEST_F(DeviceKernels, AttentionPositionZero) {
  AttentionCase().pos(0).run();
  AttentionCase().pos(0).window(8).run();
}
TEST_F(DeviceKernels, AttentionSlidingWindowEdges) {
  // W - 2, W - 1 (the last position where every key is visible), W, W + 1.
  for (int pos : {6, 7, 8, 9}) AttentionCase().window(8).pos(pos).run();
}
TEST_F(DeviceKernels, AttentionPrefillCrossesTheWindow) {
  AttentionCase().window(8).pos(0).rows(20).run();
}
TEST_F(DeviceKernels, AttentionOneHeadPerKvHead) {
  AttentionCase().heads(4).kv(4).pos(12).rows(3).run();
}
TEST_F(DeviceKernels, AttentionRealShapeGroupOfEight) {
  AttentionCase().heads(64).kv(8).dim(64).window(128).pos(130).rows(2).run();
  AttentionCase().heads(64).kv(8).dim(64).window(0).pos(130).rows(2).run();
}
TEST_F(DeviceKernels, AttentionLongContextManyTilesAndKeySplits) {
  // 700 keys: 11 score tiles of 64 and three output splits of 256 keys combined in order.
  AttentionCase().heads(8).kv(1).dim(64).window(0).pos(700).rows(2).run();
  AttentionCase().heads(8).kv(1).dim(64).window(128).pos(700).rows(2).run();
  AttentionCase().heads(8).kv(2).dim(32).window(0).pos(255).rows(3).run();  // 256..258 keys
  // 4,201 keys: 66 score tiles, 17 output splits, a softmax of 16 or 17 columns per thread.
  AttentionCase().heads(4).kv(2).dim(16).window(0).pos(4200).rows(2).run();
}
TEST_F(DeviceKernels, AttentionTwoSequencesInOneBatch) {
  AttentionCase().window(8).pos(10).rows(3).seqs(2).run();
}
TEST_F(DeviceKernels, AttentionPagedBlockSizesGiveTheSameBits) {
  // Only addresses go through the block table: one block per position, small blocks, the
  // runtime's 32 and one block for the whole context give bitwise the same scores, att, output.
  for (int window : {0, 8}) {
    const auto one = AttentionCase().heads(8).kv(2).dim(32).window(window).pos(300).rows(3).seqs(2);
    auto base = one;
    const auto want = base.block(512).run();
    for (int b : {1, 4, 32}) {
      auto c = one;
      const auto got = c.block(b).split(b != 4).run();  // with and without the output's split
      SCOPED_TRACE(c.describe());
      expect_same_bits(got, want);
    }
  }
}

TEST_F(DeviceKernels, AttentionDecodeKernelGivesTheStageKernelsBits) {
  // The decode kernel (scores, softmax and output in one) against the three stage kernels, bit
  // for bit, and both against the reference: position 0, the window's edges, 256..258 keys (one
  // and two output splits), 700 keys with the window (splits wholly before it add their zeros
  // first) and without, 1,001 and 1,024 keys (four splits, four or five columns per softmax
  // thread), group sizes 1, 2 and 8 with 1 to 8 heads a block (one row: 1, 64 blocks; 20 rows:
  // 4; 32 rows: all 8), several sequences.
  for (const AttentionCaseShape& s :
       std::initializer_list<AttentionCaseShape>{{4, 2, 16, 0, 0, 1, 1},
                                                 {4, 2, 16, 8, 0, 1, 1},
                                                 {4, 2, 16, 8, 7, 1, 3},
                                                 {4, 2, 16, 8, 9, 1, 2},
                                                 {4, 4, 16, 0, 12, 1, 1},
                                                 {8, 2, 32, 0, 255, 3, 1},
                                                 {8, 1, 64, 128, 700, 2, 1},
                                                 {8, 1, 64, 0, 700, 1, 2},
                                                 {4, 2, 16, 0, 1000, 1, 1},
                                                 {64, 8, 64, 0, 1023, 1, 1},
                                                 {64, 8, 64, 128, 130, 1, 1},
                                                 {64, 8, 64, 0, 300, 1, 1},
                                                 {64, 8, 64, 128, 300, 1, 20},
                                                 {64, 8, 64, 0, 40, 1, 3},
                                                 {64, 8, 64, 0, 40, 1, 32}}) {
    const auto one = attention_case(s);
    auto stages = one, fused = one;
    const auto want = stages.run();
    const auto got = fused.fused(true).run();
    SCOPED_TRACE(fused.describe());
    ASSERT_EQ(got.scores.size(), want.scores.size());
    expect_same_bits(got, want);
  }
  // Where it does not apply: rows sharing a query tile, contexts past 1,024 keys, head sizes it
  // is not built for.
  AttentionShape a;
  a.n_heads = 64;
  a.n_kv = 8;
  a.head_dim = 64;
  a.max_context = 4096;
  EXPECT_TRUE(attention_decode_fuses(a, 1, 1023, {}));
  EXPECT_FALSE(attention_decode_fuses(a, 1, 1024, {}));
  int32_t fake = 0;
  EXPECT_FALSE(attention_decode_fuses(a, 4, 10, QueryTiles{&fake, 2}));
  a.head_dim = 48;
  EXPECT_FALSE(attention_decode_fuses(a, 1, 10, {}));
}

TEST_F(DeviceKernels, AttentionQueryTilesGiveTheOneRowBits) {
  // Prefill chunks: rows of one sequence in tiles of up to kQueryTileRows, read from one load of
  // each key and value. Every score, probability and output bit as the one-row kernels give,
  // and both against the reference: tiles of fewer rows than the tile holds (20 = 8 + 8 + 4),
  // rows on both sides of an output split (keys 251..261 around 256), across the sliding window
  // and past it, two sequences, group sizes 1, 2 and 8, the real shape at a long position, and
  // decode steps of many sequences (one row each: the tiled scores, the one-row output).
  for (const AttentionCaseShape& s :
       std::initializer_list<AttentionCaseShape>{{4, 2, 16, 8, 0, 20, 1},
                                                 {4, 4, 16, 0, 12, 3, 1},
                                                 {8, 2, 32, 0, 250, 11, 1},
                                                 {8, 1, 64, 128, 690, 13, 1},
                                                 {4, 2, 16, 8, 10, 9, 2},
                                                 {64, 8, 64, 128, 300, 17, 1},
                                                 {64, 8, 64, 0, 300, 17, 1},
                                                 // decode: 20 rows of a tile each
                                                 {64, 8, 64, 128, 300, 1, 20},
                                                 {4, 2, 16, 8, 10, 1, 17}}) {
    const auto one = attention_case(s);
    auto rows = one;
    const auto want = rows.run();
    auto tiled = one;
    tiled.tiled(true);
    const auto got = tiled.run();
    SCOPED_TRACE(tiled.describe());
    expect_same_bits(got, want);
  }
}

TEST_F(DeviceKernels, AttentionFloatKernelsOverABf16Cache) {
  // The bf16 precision's cache (BF16 keys and values) under the float32 kernels that recompute a
  // traced stage: against the reference of the keys and values it holds, within the float32
  // tolerances, and the stage kernels, the decode kernel and the query tiles with the same bits
  // from it -- the window, several sequences, a prefill chunk's tiles, the real shape.
  for (const AttentionCaseShape& s :
       std::initializer_list<AttentionCaseShape>{{4, 2, 16, 8, 9, 1, 2},
                                                 {8, 2, 32, 0, 255, 3, 1},
                                                 {64, 8, 64, 128, 300, 1, 20},
                                                 {64, 8, 64, 0, 1023, 1, 1},
                                                 {64, 8, 64, 128, 300, 17, 1}}) {
    auto stages = attention_case(s);
    stages.bf16_cache();
    const auto want = stages.run();
    auto tiled = stages;
    tiled.tiled(true);
    SCOPED_TRACE(tiled.describe());
    expect_same_bits(tiled.run(), want);
    if (s.rows == 1) {
      auto fused = stages;
      fused.fused(true);
      expect_same_bits(fused.run(), want);
    }
  }
}

TEST_F(DeviceKernels, AttentionMmaAgainstTheReference) {
  // The bf16 precision's kernel against the float64 reference within its BF16 operands'
  // tolerances, traced (scores written, att from them) and not: position 0, the window's edges,
  // a prefill chunk across the window, group sizes 1, 2 and 8, head sizes 16, 32 and 64, several
  // sequences, long contexts (66 key tiles), keys of blocks that slid out of the window or were
  // never written (NaN in the pool: reading one would show).
  for (const AttentionCaseShape& s :
       std::initializer_list<AttentionCaseShape>{{4, 2, 16, 0, 0, 1, 1},
                                                 {4, 2, 16, 8, 0, 1, 1},
                                                 {4, 2, 16, 8, 7, 1, 3},
                                                 {4, 2, 16, 8, 9, 1, 2},
                                                 {4, 2, 16, 8, 0, 20, 1},
                                                 {4, 4, 16, 0, 12, 3, 1},
                                                 {8, 2, 32, 0, 250, 11, 1},
                                                 {8, 1, 64, 128, 690, 13, 1},
                                                 {64, 8, 64, 128, 300, 17, 1},
                                                 {64, 8, 64, 0, 300, 17, 1},
                                                 {64, 8, 64, 128, 300, 1, 20},
                                                 {4, 2, 16, 0, 4200, 2, 1}}) {
    for (const bool tiled : {false, true}) {
      auto c = attention_case(s);
      c.mma(true).tiled(tiled).run();
    }
  }
  AttentionShape a;
  a.n_heads = 64;
  a.n_kv = 8;
  a.head_dim = 64;
  EXPECT_TRUE(attention_mma_fuses(a, Precision::bf16));
  EXPECT_FALSE(attention_mma_fuses(a, Precision::fp32));
  a.head_dim = 48;
  EXPECT_FALSE(attention_mma_fuses(a, Precision::bf16));
  a.head_dim = 64;
  a.n_kv = 4;  // 16 heads per KV head: a tile's pairs exceed the block's MMA rows
  EXPECT_FALSE(attention_mma_fuses(a, Precision::bf16));
}

TEST_F(DeviceKernels, AttentionMmaRowBitsDoNotDependOnTheTiles) {
  // The batch invariance of the bf16 precision's attention: a row's output (and, traced, its
  // scores) has the same bits alone -- its key tiles over blocks and merged, or folded in one
  // block -- as in a prefill chunk's query tiles, traced or not, with the rows of a tile on both
  // sides of a key tile's edge, across the window, at long positions (66 key tiles).
  for (const AttentionCaseShape& s :
       std::initializer_list<AttentionCaseShape>{{4, 2, 16, 8, 0, 20, 1},
                                                 {8, 2, 32, 0, 250, 11, 1},
                                                 {8, 1, 64, 128, 690, 13, 1},
                                                 {64, 8, 64, 128, 300, 17, 1},
                                                 {64, 8, 64, 0, 1020, 9, 2},
                                                 {4, 2, 16, 8, 10, 9, 2},
                                                 {16, 2, 32, 0, 4200, 3, 2}}) {
    const auto one = attention_case(s);
    auto alone = one;
    const auto want = alone.mma(true).run();
    auto folded = one;
    const auto one_kernel = folded.mma(true).by_keys(false).run();
    SCOPED_TRACE(folded.describe());
    expect_same_bits(one_kernel, want);
    auto tiled = one;
    const auto got = tiled.mma(true).tiled(true).run();
    SCOPED_TRACE(tiled.describe());
    expect_same_bits(got, want);
    for (const bool by_keys : {true, false}) {
      auto untraced = one;
      const auto bare = untraced.mma(true, false).by_keys(by_keys).run();
      EXPECT_EQ(std::memcmp(bare.out.data(), want.out.data(), want.out.size() * 4), 0)
          << "the untraced kernel's output differs from the traced one's, by_keys " << by_keys;
    }
    auto untraced = one;
    const auto bare = untraced.mma(true, false).tiled(true).run();
    EXPECT_EQ(std::memcmp(bare.out.data(), want.out.data(), want.out.size() * 4), 0)
        << "the untraced tiled kernel's output differs from the traced one's";
  }
}

TEST_F(DeviceKernels, AttentionMmaMixedStepRowBits) {
  // A mixed step -- decoding rows ahead (each its own query tile, their key tiles over blocks)
  // and prefill chunks after them (folded in one kernel) -- has every row's bits as when each row
  // is alone, and as when every tile folds in one kernel: on both sides of the window, at long
  // positions, traced and not, against the reference as well (run()).
  struct Mixed {
    AttentionCaseShape shape;
    int lead;
  };
  for (const Mixed& m :
       {Mixed{{8, 2, 32, 0, 250, 11, 2}, 1}, Mixed{{64, 8, 64, 128, 300, 17, 3}, 2},
        Mixed{{4, 2, 16, 8, 10, 9, 3}, 2}, Mixed{{16, 2, 32, 0, 4200, 3, 3}, 2}}) {
    for (const bool traced : {true, false}) {
      auto one = attention_case(m.shape);
      one.lead(m.lead).mma(true, traced);
      auto alone = one;
      const auto want = alone.run();
      auto mixed = one;
      const auto got = mixed.tiled(true).run();
      SCOPED_TRACE(mixed.describe());
      EXPECT_EQ(std::memcmp(got.out.data(), want.out.data(), want.out.size() * 4), 0)
          << "a mixed step's outputs differ from its rows' alone";
      auto folded = one;
      const auto one_kernel = folded.tiled(true).by_keys(false).run();
      EXPECT_EQ(std::memcmp(one_kernel.out.data(), want.out.data(), want.out.size() * 4), 0)
          << "a mixed step folded in one kernel differs from its rows' alone";
      if (traced) {
        expect_same_bits(got, want);
        expect_same_bits(one_kernel, want);
      }
    }
  }
}

// ----------------------------------------------------------------------------- router ---

class RouterCase {
 public:
  RouterCase& experts(int e) {
    experts_ = e;
    return *this;
  }
  RouterCase& k(int k) {
    k_ = k;
    return *this;
  }
  RouterCase& rows(int r) {
    rows_ = r;
    return *this;
  }
  RouterCase& ties(bool t) {
    ties_ = t;
    return *this;
  }
  std::string describe() const {
    return fmt::format("router top-k experts={} k={} rows={} ties={}", experts_, k_, rows_, ties_);
  }
  void run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(23 + uint64_t(experts_));
    std::vector<float> g = random_floats(rng, size_t(rows_) * experts_, -4, 4);
    if (ties_)  // a few distinct values only: ties everywhere, lowest index first
      for (auto& x : g) x = std::round(x);
    DeviceBuffer dg = upload(g);
    DeviceBuffer didx(size_t(rows_) * k_ * sizeof(int32_t));
    Output w(size_t(rows_) * k_);
    launch_f32_router_topk_softmax(dg.as<float>(), rows_, experts_, k_, true, didx.as<int32_t>(),
                                   w.ptr(), nullptr);
    const std::vector<int32_t> idx = download<int32_t>(didx, size_t(rows_) * k_);
    std::vector<double> want_w;
    for (int r = 0; r < rows_; ++r) {
      const std::vector<double> gd(g.begin() + long(size_t(r) * experts_),
                                   g.begin() + long(size_t(r + 1) * experts_));
      std::vector<int32_t> want(static_cast<size_t>(k_));
      ref::router_topk(gd.data(), experts_, k_, want.data());
      for (int s = 0; s < k_; ++s)
        ASSERT_EQ(idx[size_t(r) * k_ + s], want[size_t(s)]) << "row " << r << " slot " << s;
      std::vector<double> ww(static_cast<size_t>(k_));
      ref::topk_softmax(gd.data(), want.data(), k_, ww.data());
      want_w.insert(want_w.end(), ww.begin(), ww.end());
    }
    expect_close(w.fetch(), want_w, {{1e-30}, 32 * kU, 1e-12}, "topk_w");

    // Overwritten indices (fault injection): only w is recomputed, from those indices.
    std::vector<int32_t> forced(idx.size());
    for (size_t i = 0; i < forced.size(); ++i) forced[i] = int32_t((i * 7 + 3) % size_t(experts_));
    DeviceBuffer dforced = upload(forced);
    Output w2(size_t(rows_) * k_);
    launch_f32_router_topk_softmax(dg.as<float>(), rows_, experts_, k_, false,
                                   dforced.as<int32_t>(), w2.ptr(), nullptr);
    EXPECT_EQ(download<int32_t>(dforced, forced.size()), forced);
    std::vector<double> want2;
    for (int r = 0; r < rows_; ++r) {
      const std::vector<double> gd(g.begin() + long(size_t(r) * experts_),
                                   g.begin() + long(size_t(r + 1) * experts_));
      std::vector<double> ww(static_cast<size_t>(k_));
      ref::topk_softmax(gd.data(), forced.data() + size_t(r) * k_, k_, ww.data());
      want2.insert(want2.end(), ww.begin(), ww.end());
    }
    expect_close(w2.fetch(), want2, {{1e-30}, 32 * kU, 1e-12}, "topk_w from overwritten topk_idx");
  }

 private:
  int experts_ = 32, k_ = 4, rows_ = 3;
  bool ties_ = false;
};

TEST_F(DeviceKernels, RouterOneExpert) {
  RouterCase().experts(1).k(1).run();
}
TEST_F(DeviceKernels, RouterTopFourOf32And128) {
  RouterCase().experts(32).k(4).rows(5).run();
  RouterCase().experts(128).k(4).rows(5).run();
}
TEST_F(DeviceKernels, RouterExpertsNotMultipleOfWarp) {
  RouterCase().experts(37).k(4).run();
}
TEST_F(DeviceKernels, RouterTiesTakeTheLowestIndex) {
  RouterCase().experts(32).k(4).rows(8).ties(true).run();
  RouterCase().experts(8).k(8).rows(2).ties(true).run();  // k = E: every expert, in order
}

// The fused router (logits and decision in one kernel): logits within the GEMV's bound of the
// float64 reference; idx and w exactly what launch_f32_router_topk_softmax makes of those logits;
// a row's results bitwise the same alone and in a batch (experts spread over blocks up to 16 rows,
// one row per block, two per block) and the tickets left zero. `ties`: the inputs of some rows are
// zero, so their logits are the bias, rounded to three values (ties everywhere), and one expert's
// bias is NaN (it ranks last).
void router_fused_case(WeightType type, int experts, int in, int batch, bool bias,
                       bool ties = false) {
  SCOPED_TRACE(fmt::format("fused router {} experts={} in={} batch={} bias={} ties={}",
                           type_name(type), experts, in, batch, bias, ties));
  const int k = 4;
  std::mt19937_64 rng(71 + uint64_t(experts) + uint64_t(in));
  const HostMatrix w = random_matrix(rng, type, size_t(experts) * in);
  HostBf16 b = random_bf16(rng, size_t(experts), 0.5f);
  std::vector<float> x = random_floats(rng, size_t(batch) * in, -1, 1);
  if (ties) {
    for (size_t e = 0; e < b.values.size(); ++e) b.values[e] = float(int(e * 7 % 3)) * 0.25f;
    b.values[1] = kNaN;
    for (int r = 0; r < batch; r += 2) std::fill_n(x.begin() + long(size_t(r) * in), in, 0.0f);
  }
  DeviceBuffer dw = upload(w.bytes), db = upload(b.values), dx = upload(x);
  const Matrix m{type, dw.as(), experts, in};
  const float* bias_ptr = bias ? db.as<float>() : nullptr;
  Output logits(size_t(batch) * experts), tw(size_t(batch) * k);
  DeviceBuffer didx(size_t(batch) * k * sizeof(int32_t));
  const std::vector<int32_t> zeros(size_t(batch), 0);
  DeviceBuffer tickets = upload(zeros);
  const std::span<int32_t> tk(tickets.as<int32_t>(), zeros.size());
  launch_f32_router(m, bias_ptr, dx.as<float>(), batch, k, logits.ptr(), didx.as<int32_t>(),
                    tw.ptr(), tk, nullptr);
  EXPECT_EQ(download<int32_t>(tickets, zeros.size()), zeros) << "tickets left zero";
  const std::vector<float> g = logits.fetch();
  const std::vector<double> xd = to_double(x);
  std::vector<double> want(g.size());
  Tol tol{std::vector<double>(g.size()), 0.0, 1e-10};
  for (int r = 0; r < batch; ++r)
    for (int e = 0; e < experts; ++e) {
      double sum = bias ? double(b.values[size_t(e)]) : 0.0, abs_sum = std::fabs(sum);
      for (int i = 0; i < in; ++i) {
        const double p = w.values[size_t(e) * in + i] * xd[size_t(r) * in + i];
        sum += p, abs_sum += std::fabs(p);
      }
      want[size_t(r) * experts + e] = sum;
      tol.atol[size_t(r) * experts + e] = dot_atol(warp_dot_chain(in) + 1, abs_sum);
    }
  if (!ties) expect_close(g, want, tol, "router logits");
  // The decision: the separate top-k kernel on the fused kernel's own logits, bit for bit.
  DeviceBuffer dg = upload(g), didx2(size_t(batch) * k * sizeof(int32_t));
  Output tw2(size_t(batch) * k);
  launch_f32_router_topk_softmax(dg.as<float>(), batch, experts, k, true, didx2.as<int32_t>(),
                                 tw2.ptr(), nullptr);
  EXPECT_EQ(download<int32_t>(didx, size_t(batch) * k), download<int32_t>(didx2, size_t(batch) * k));
  const std::vector<float> w1 = tw.fetch(), w2 = tw2.fetch();
  for (size_t i = 0; i < w1.size(); ++i) ASSERT_EQ(w1[i], w2[i]) << "topk_w " << i;
  // Row batch - 1 alone.
  Output one(static_cast<size_t>(experts)), one_w(static_cast<size_t>(k));
  DeviceBuffer one_idx(size_t(k) * sizeof(int32_t));
  launch_f32_router(m, bias_ptr, dx.as<float>() + int64_t(batch - 1) * in, 1, k, one.ptr(),
                    one_idx.as<int32_t>(), one_w.ptr(), tk, nullptr);
  const std::vector<float> o = one.fetch(), ow = one_w.fetch();
  EXPECT_EQ(std::memcmp(o.data(), g.data() + size_t(batch - 1) * experts, o.size() * 4), 0)
      << "the last row's logits alone";
  for (int s = 0; s < k; ++s) ASSERT_EQ(ow[size_t(s)], w1[size_t(batch - 1) * k + s]) << s;
}

TEST_F(DeviceKernels, RouterFusedLikeTheGemvAndTheTopK) {
  router_fused_case(WeightType::bf16, 32, 2880, 3, true);    // the 20b's router, a block per row
  router_fused_case(WeightType::bf16, 128, 2880, 70, true);  // the 120b's, two rows per block
  router_fused_case(WeightType::f32, 37, 96, 65, false);
  router_fused_case(WeightType::f16, 8, 13, 2, true);        // in % 8 != 0: the scalar path
  router_fused_case(WeightType::bf16, 128, 2880, 16, true);  // spread: 32 blocks per row
  router_fused_case(WeightType::bf16, 128, 2880, 17, true);  // one block per row
  router_fused_case(WeightType::bf16, 32, 2880, 5, true, true);   // ties and NaN, spread
  router_fused_case(WeightType::bf16, 32, 2880, 70, true, true);  // ties and NaN, two rows a block
}

// ---------------------------------------------------------------------------- experts ---

// The workspace of launch_f32_moe_linear for a step of `pairs` pairs reading x_floats inputs.
class MoeScratch {
 public:
  MoeScratch(int64_t pairs, int experts, int64_t x_floats, Precision precision = Precision::fp32)
      : routing_ints_(moe_routing_ints(pairs, experts)),
        routing_(routing_ints_ * sizeof(int32_t)),
        split_(x_floats),
        precision_(precision) {}
  MoeWorkspace ws() const {
    MoeWorkspace ws{{routing_.as<int32_t>(), routing_ints_}, split_.span(), false, {}};
    ws.precision = precision_;
    return ws;
  }
  std::vector<int32_t> routing() const { return download<int32_t>(routing_, routing_ints_); }

 private:
  size_t routing_ints_;
  DeviceBuffer routing_;
  SplitScratch split_;
  Precision precision_;
};

class MoeCase {
 public:
  MoeCase& experts(int e) {
    experts_ = e;
    return *this;
  }
  MoeCase& out(int o) {
    out_ = o;
    return *this;
  }
  MoeCase& in(int i) {
    in_ = i;
    return *this;
  }
  MoeCase& k(int k) {
    k_ = k;
    return *this;
  }
  MoeCase& rows(int r) {
    rows_ = r;
    return *this;
  }
  MoeCase& swiglu(bool s) {
    swiglu_ = s;
    return *this;
  }  // mlp1 (+ SwiGLU) or mlp2 inputs
  MoeCase& scales(int lo, int hi) {
    scale_lo_ = lo, scale_hi_ = hi;
    return *this;
  }
  MoeCase& dense(WeightType t) {
    dense_ = true, dense_type_ = t;
    return *this;
  }
  MoeCase& precision(Precision p) {
    precision_ = p;
    return *this;
  }
  std::string describe() const {
    return fmt::format("moe gemv {} experts={} out={} in={} k={} rows={} {} {}",
                       swiglu_ ? "mlp1+swiglu" : "mlp2", experts_, out_, in_, k_, rows_,
                       dense_ ? std::string("dense ") + type_name(dense_type_) : "mxfp4",
                       precision_ == Precision::bf16 ? "bf16" : "fp32");
  }
  void run() const {
    SCOPED_TRACE(describe());
    std::mt19937_64 rng(29 + uint64_t(out_) + uint64_t(in_));
    const int E = experts_, G = in_ / 32;
    // Weights: MXFP4 blocks with scales 2^(lo - 127) .. 2^(hi - 127), or a dense [E, in, out] tensor.
    std::vector<uint8_t> blocks, scales;
    HostMatrix dense{dense_type_, {}, {}};
    TensorView tb, ts, td;
    ExpertLinear w;
    w.experts = E;
    w.out = out_;
    w.in = in_;
    if (!dense_) {
      std::uniform_int_distribution<int> byte(0, 255), sc(scale_lo_, scale_hi_);
      blocks.resize(size_t(E) * out_ * G * 16);
      scales.resize(size_t(E) * out_ * G);
      for (auto& b : blocks) b = uint8_t(byte(rng));
      for (auto& s : scales) s = uint8_t(sc(rng));
      tb.name = "blocks", tb.dtype = DType::U8, tb.shape = {E, out_, G, 16},
      tb.data = blocks.data(), tb.nbytes = blocks.size();
      ts.name = "scales", ts.dtype = DType::U8, ts.shape = {E, out_, G}, ts.data = scales.data(),
      ts.nbytes = scales.size();
      w.layout = ExpertLayout::Mxfp4;
      w.blocks = &tb;
      w.scales = &ts;
    } else {
      dense = random_matrix(rng, dense_type_, size_t(E) * in_ * out_);
      td = dense.view({E, in_, out_});
      w.layout = ExpertLayout::DenseInMajor;
      w.dense = &td;
    }
    const HostBf16 bias = random_bf16(rng, size_t(E) * out_, 1.0f);
    const TensorView tbias = bias.view({E, out_});
    w.bias = &tbias;
    // Routing: distinct experts per row, reused across rows.
    std::vector<int32_t> idx;
    for (int r = 0; r < rows_; ++r)
      for (int s = 0; s < k_; ++s) idx.push_back(int32_t((r + 2 * s) % E));
    const int x_row = swiglu_ ? in_ : k_ * in_, x_slot = swiglu_ ? 0 : in_;
    const std::vector<float> x = random_floats(rng, size_t(rows_) * x_row, -1, 1);

    ExpertWeights dw;
    DeviceBuffer ddense = upload(dense.bytes), dbias = upload(bias.values), didx = upload(idx),
                 dx = upload(x);
    const PackedMxfp4 packed = dense_ ? PackedMxfp4{} : pack_mxfp4(blocks, scales, E, out_, in_);
    dw.mxfp4 = !dense_;
    dw.packed_blocks = packed.blocks.as<uint8_t>();
    dw.packed_scales = packed.scales.as<uint8_t>();
    dw.dense_type = dense_type_;
    dw.dense = ddense.as();
    dw.bias = dbias.as<float>();
    dw.experts = E;
    dw.out = out_;
    dw.in = in_;
    Output y(size_t(rows_) * k_ * out_), act(size_t(rows_) * k_ * out_ / 2);
    const MoeScratch scratch(int64_t(rows_) * k_, E, int64_t(rows_) * x_row, precision_);
    // With SwiGLU, mlp2's split of the activation too (when out / 2 is whole blocks of 32).
    const bool act_split = swiglu_ && moe_writes_act_split(out_);
    const int64_t n_act = int64_t(rows_) * k_ * (out_ / 2);
    const SplitScratch act_words(act_split ? n_act : 0);
    MoeWorkspace ws = scratch.ws();
    ws.act_split = act_words.span();
    launch_f32_moe_linear(dw, didx.as<int32_t>(), rows_, k_, dx.as<float>(), x_row, x_slot, y.ptr(),
                          swiglu_ ? act.ptr() : nullptr, 1.702f, 7.0f, ws, nullptr);
    if (act_split) expect_split_of(act, n_act, act_words, "mlp2's split of the activation");

    std::vector<double> want, want_act, atol, act_atol;
    std::vector<double> row(static_cast<size_t>(in_));
    for (int r = 0; r < rows_; ++r)
      for (int s = 0; s < k_; ++s) {
        const int e = idx[size_t(r) * k_ + s];
        std::vector<double> xd(x.begin() + long(size_t(r) * x_row + size_t(s) * x_slot),
                               x.begin() + long(size_t(r) * x_row + size_t(s) * x_slot + in_));
        if (precision_ == Precision::bf16 && !dense_)  // the MMA products' BF16 inputs
          for (double& v : xd) v = round_to_storage(v, kUnitBfloat16);
        std::vector<double> h(static_cast<size_t>(out_));
        ref::expert_linear(w, e, xd.data(), h.data());
        want.insert(want.end(), h.begin(), h.end());
        for (int j = 0; j < out_; ++j) {
          read_expert_row(w, e, j, row.data());
          double abs_sum = std::fabs(bias.values[size_t(e) * out_ + j]);
          for (int i = 0; i < in_; ++i) abs_sum += std::fabs(row[size_t(i)] * xd[size_t(i)]);
          atol.push_back(dot_atol(dense_ ? in_ + 1 : mma_dot_chain(in_) + 1, abs_sum));
        }
        if (swiglu_) {
          std::vector<double> a(size_t(out_ / 2));
          ref::swiglu(h.data(), out_ / 2, 1.702, 7.0, a.data());
          want_act.insert(want_act.end(), a.begin(), a.end());
          for (int i = 0; i < out_ / 2;
               ++i) {  // |d swiglu| <= ~1.1 (|lin| + 1) + 8 |gate| ... bounded by 20 (|lin| + 1)
            const double lin = std::min(7.0, std::fabs(h[size_t(2 * i + 1)]));
            const size_t at = atol.size() - size_t(out_) + size_t(2 * i);
            act_atol.push_back(20 * (lin + 1) * (atol[at] + atol[at + 1]) + 1e-30);
          }
        }
      }
    expect_close(y.fetch(), want, {atol, 4 * kU, 1e-10}, swiglu_ ? "mlp1" : "mlp2");
    if (swiglu_) expect_close(act.fetch(), want_act, {act_atol, 16 * kU, 1e-10}, "swiglu");
  }

 private:
  int experts_ = 3, out_ = 128, in_ = 64, k_ = 2, rows_ = 3;
  int scale_lo_ = 120, scale_hi_ = 127;  // E8M0: 2^-7 .. 2^0
  bool swiglu_ = true, dense_ = false;
  WeightType dense_type_ = WeightType::bf16;
  Precision precision_ = Precision::fp32;
};

TEST_F(DeviceKernels, MoeMxfp4Mlp1WithSwiglu) {
  MoeCase().experts(3).out(128).in(64).k(2).rows(3).run();
}
TEST_F(DeviceKernels, MoeMxfp4Mlp2) {
  MoeCase().experts(3).out(96).in(128).k(2).rows(3).swiglu(false).run();
}
TEST_F(DeviceKernels, MoeOneExpertOneSlot) {
  MoeCase().experts(1).out(64).in(32).k(1).rows(1).run();
  MoeCase().experts(1).out(33).in(32).k(1).rows(2).swiglu(false).run();  // out not a warp multiple
}
TEST_F(DeviceKernels, MoeMxfp4RealShape) {
  MoeCase().experts(2).out(5760).in(2880).k(2).rows(1).run();
  MoeCase().experts(2).out(2880).in(2880).k(2).rows(1).swiglu(false).run();
}
TEST_F(DeviceKernels, MoeDenseInMajorExperts) {
  MoeCase().experts(3).out(128).in(64).k(2).rows(2).dense(WeightType::bf16).run();
  MoeCase().experts(3).out(64).in(128).k(2).rows(2).swiglu(false).dense(WeightType::f32).run();
}

TEST_F(DeviceKernels, MoeInvalidExpertIndexWritesNaNNotGarbage) {
  const int E = 2, out = 64, in = 32;
  std::vector<uint8_t> blocks(size_t(E) * out * 16, 0x11), scales(size_t(E) * out, 127);
  std::vector<float> bias(size_t(E) * out, 0.5f), x(in, 1.0f);
  std::vector<int32_t> idx = {E};  // out of range
  const PackedMxfp4 packed = pack_mxfp4(blocks, scales, E, out, in);
  DeviceBuffer dbias = upload(bias), dx = upload(x), di = upload(idx);
  ExpertWeights w;
  w.packed_blocks = packed.blocks.as<uint8_t>();
  w.packed_scales = packed.scales.as<uint8_t>();
  w.bias = dbias.as<float>();
  w.experts = E, w.out = out, w.in = in;
  Output y(static_cast<size_t>(out)), act(size_t(out / 2));
  const MoeScratch scratch(1, E, in);
  launch_f32_moe_linear(w, di.as<int32_t>(), 1, 1, dx.as<float>(), in, 0, y.ptr(), act.ptr(),
                        1.702f, 7.0f, scratch.ws(), nullptr);
  for (float v : y.fetch()) EXPECT_TRUE(std::isnan(v));
  for (float v : act.fetch()) EXPECT_TRUE(std::isnan(v));
}

// The packing the kernel reads (Mxfp4Packing): every packed byte is the checkpoint byte the
// layout names, padding rows and blocks are zero, and the pack of a few experts at a time (as
// the upload stages them) writes the same bytes as the pack of all at once.
TEST_F(DeviceKernels, Mxfp4PackingPlacesEveryByteWhereTheKernelReadsIt) {
  struct Shape {
    int experts, out, in;
  };
  for (const Shape sh :
       {Shape{3, 48, 128}, Shape{2, 33, 96}, Shape{1, 5, 32}, Shape{2, 70, 3616}}) {
    SCOPED_TRACE(fmt::format("experts={} out={} in={}", sh.experts, sh.out, sh.in));
    std::mt19937_64 rng(61 + uint64_t(sh.out));
    const int G = sh.in / 32;
    std::vector<uint8_t> blocks(size_t(sh.experts) * sh.out * G * 16),
        scales(size_t(sh.experts) * sh.out * G);
    for (auto& b : blocks) b = uint8_t(rng() % 255 + 1);  // never zero: padding is told apart
    for (auto& b : scales) b = uint8_t(rng() % 255 + 1);
    const PackedMxfp4 p = pack_mxfp4(blocks, scales, sh.experts, sh.out, sh.in);
    const Mxfp4Packing pk(sh.out, sh.in);
    const std::vector<uint8_t> got_blocks =
        download<uint8_t>(p.blocks, size_t(pk.block_bytes(sh.experts)));
    const std::vector<uint8_t> got_scales =
        download<uint8_t>(p.scales, size_t(pk.scale_bytes(sh.experts)));
    int64_t wrong = 0;
    for (int e = 0; e < sh.experts; ++e)
      for (int64_t rt = 0; rt < pk.row_tiles; ++rt)
        for (int64_t c = 0; c < pk.chunks; ++c)
          for (int lane = 0; lane < 32; ++lane)
            for (int h = 0; h < 2; ++h)
              for (int b = 0; b < 2; ++b) {
                const int64_t tc = (e * pk.row_tiles + rt) * pk.chunks + c;
                const int64_t row = 16 * rt + 8 * h + lane / 4, block = 2 * c + b;
                const bool real = row < sh.out && block < G;
                for (int byte = 0; byte < 4; ++byte) {
                  const size_t at = size_t(((tc * 32 + lane) * 4 + 2 * h + b) * 4 + byte);
                  const uint8_t want = real ? blocks[size_t(((e * sh.out + row) * G + block) * 16 +
                                                            4 * (lane % 4) + byte)]
                                            : 0;
                  wrong += got_blocks[at] != want;
                }
                if (lane % 4 == 0) {
                  const size_t at = size_t((tc * 8 + lane / 4) * 4 + 2 * h + b);
                  wrong +=
                      got_scales[at] != (real ? scales[size_t((e * sh.out + row) * G + block)] : 0);
                }
              }
    EXPECT_EQ(wrong, 0);
    if (sh.experts > 1) {  // expert 1 alone, packed from its own bytes, lands at its offset
      const size_t raw_b = blocks.size() / size_t(sh.experts),
                   raw_s = scales.size() / size_t(sh.experts);
      const PackedMxfp4 one = pack_mxfp4(
          std::vector<uint8_t>(blocks.begin() + long(raw_b), blocks.begin() + long(2 * raw_b)),
          std::vector<uint8_t>(scales.begin() + long(raw_s), scales.begin() + long(2 * raw_s)), 1,
          sh.out, sh.in);
      const std::vector<uint8_t> one_b = download<uint8_t>(one.blocks, size_t(pk.block_bytes(1)));
      const std::vector<uint8_t> one_s = download<uint8_t>(one.scales, size_t(pk.scale_bytes(1)));
      EXPECT_TRUE(std::equal(one_b.begin(), one_b.end(), got_blocks.begin() + pk.block_bytes(1)));
      EXPECT_TRUE(std::equal(one_s.begin(), one_s.end(), got_scales.begin() + pk.scale_bytes(1)));
    }
  }
  // Bad arguments are refused with the launcher's name.
  DeviceBuffer d(64);
  EXPECT_THROW(launch_u8_mxfp4_pack_blocks(nullptr, 1, 16, 32, d.as<uint8_t>(), nullptr),
               parity::Error);
  EXPECT_THROW(launch_u8_mxfp4_pack_scales(d.as<uint8_t>(), 1, 16, 48, d.as<uint8_t>(), nullptr),
               parity::Error);
  EXPECT_THROW(launch_u8_mxfp4_pack_blocks(d.as<uint8_t>(), 0, 16, 32, d.as<uint8_t>(), nullptr),
               parity::Error);
}

// The MXFP4 expert linear's tilings against each other: pair mode (one pair per tile, pair
// order), grouped by expert in blocks of 32 rows by 8 pairs, 128 by 8, 16 and 32, and the
// entry point give the same bits for every output, including NaN for invalid expert indices (a
// row's result does not depend on the step's other rows); the routing workspace equals a host
// stable counting sort.
enum class Routing { random, one_expert, with_invalid };

class MoeTilingCase {
 public:
  MoeTilingCase& experts(int e) {
    experts_ = e;
    return *this;
  }
  MoeTilingCase& out(int o) {
    out_ = o;
    return *this;
  }
  MoeTilingCase& in(int i) {
    in_ = i;
    return *this;
  }
  MoeTilingCase& k(int k) {
    k_ = k;
    return *this;
  }
  MoeTilingCase& swiglu(bool s) {
    swiglu_ = s;
    return *this;
  }
  MoeTilingCase& routing(Routing r) {
    routing_ = r;
    return *this;
  }
  MoeTilingCase& scales(int lo, int hi) {
    scale_lo_ = lo, scale_hi_ = hi;
    return *this;
  }
  MoeTilingCase& precision(Precision p) {
    precision_ = p;
    return *this;
  }
  void run(std::initializer_list<int> batches) const {
    std::mt19937_64 rng(43 + uint64_t(out_) * 7 + uint64_t(in_) + uint64_t(routing_));
    const int E = experts_, G = in_ / 32;
    std::vector<uint8_t> blocks(size_t(E) * out_ * G * 16), scales(size_t(E) * out_ * G);
    for (size_t i = 0; i < blocks.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(&blocks[i], &r, 8);  // 16-byte blocks: whole words
    }
    std::uniform_int_distribution<int> sc(scale_lo_, scale_hi_);
    for (auto& s : scales) s = uint8_t(sc(rng));
    const std::vector<float> bias = random_floats(rng, size_t(E) * out_, -1, 1);
    const PackedMxfp4 packed = pack_mxfp4(blocks, scales, E, out_, in_);
    DeviceBuffer dbias = upload(bias);
    ExpertWeights w;
    w.packed_blocks = packed.blocks.as<uint8_t>();
    w.packed_scales = packed.scales.as<uint8_t>();
    w.bias = dbias.as<float>();
    w.experts = E, w.out = out_, w.in = in_;
    for (const int rows : batches) {
      SCOPED_TRACE(fmt::format("moe tilings {} {} experts={} out={} in={} k={} rows={} routing={}",
                               precision_ == Precision::bf16 ? "bf16" : "fp32",
                               swiglu_ ? "mlp1+swiglu" : "mlp2", E, out_, in_, k_, rows,
                               routing_ == Routing::random       ? "random"
                               : routing_ == Routing::one_expert ? "one expert"
                                                                 : "with invalid"));
      const int pairs = rows * k_;
      std::vector<int32_t> idx(static_cast<size_t>(pairs));
      std::vector<int> perm(static_cast<size_t>(E));
      for (int r = 0; r < rows; ++r) {
        for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int s = 0; s < k_; ++s) {
          int32_t e = perm[size_t(s % E)];
          if (routing_ == Routing::one_expert) e = E / 2;
          if (routing_ == Routing::with_invalid && (r * k_ + s) % 5 == 2)
            e = (r * k_ + s) % 2 ? E : -1;
          idx[size_t(r) * k_ + s] = e;
        }
      }
      const int x_row = swiglu_ ? in_ : k_ * in_, x_slot = swiglu_ ? 0 : in_;
      const std::vector<float> x = random_floats(rng, size_t(rows) * x_row, -2, 2);
      DeviceBuffer didx = upload(idx), dx = upload(x);
      const MoeScratch scratch(pairs, E, int64_t(rows) * x_row, precision_);
      const size_t ny = size_t(pairs) * out_, na = swiglu_ ? ny / 2 : 1;
      const auto act = [&](const Output& a) { return swiglu_ ? a.ptr() : nullptr; };

      // The routing workspace: a stable counting sort by expert, invalid indices last.
      const auto want_routing = [&](int tile_pairs) {
        std::vector<int32_t> want(moe_routing_ints(pairs, E));
        std::vector<std::vector<int32_t>> bucket(size_t(E) + 1);
        for (int i = 0; i < pairs; ++i) {
          const int e = idx[size_t(i)];
          bucket[e < 0 || e >= E ? size_t(E) : size_t(e)].push_back(i);
        }
        int start = 0, tiles = 0;
        for (int b = 0; b <= E; ++b) {
          want[size_t(b)] = start;
          want[size_t(E + 2 + b)] = tiles;
          for (const int32_t i : bucket[size_t(b)]) want[size_t(2 * (E + 2) + start++)] = i;
          tiles += (int(bucket[size_t(b)].size()) + tile_pairs - 1) / tile_pairs;
        }
        want[size_t(E + 1)] = start;
        want[size_t(2 * E + 3)] = tiles;
        return want;
      };

      Output y_ref(ny), a_ref(na);
      detail::launch_f32_mxfp4w_moe_mma(w, didx.as<int32_t>(), rows, k_, dx.as<float>(), x_row,
                                        x_slot, y_ref.ptr(), act(a_ref), 1.702f, 7.0f,
                                        scratch.ws(), {false, 2, 1}, nullptr);
      const std::vector<float> yr = y_ref.fetch(), ar = a_ref.fetch();
      const auto same = [&](const Output& y, const Output& a, const char* what) {
        const std::vector<float> yg = y.fetch();
        EXPECT_EQ(std::memcmp(yr.data(), yg.data(), ny * sizeof(float)), 0) << what << ": mlp bits";
        if (swiglu_) {
          const std::vector<float> ag = a.fetch();
          EXPECT_EQ(std::memcmp(ar.data(), ag.data(), na * sizeof(float)), 0)
              << what << ": swiglu bits";
        }
      };
      std::vector<detail::MoeTiling> tilings = {detail::MoeTiling{true, 2, 1, false},
                                                detail::MoeTiling{true, 2, 1, true},
                                                detail::MoeTiling{true, 2, 2, true}};
      // The warpgroup tiles (bf16 on a GPU with warpgroup MMA; WarpgroupTilesOnHopperBuilds
      // says where they must be available).
      if (precision_ == Precision::bf16 && warpgroup_mma_available())
        tilings.push_back(detail::MoeTiling{true, 2, 8, true, true});
      for (const detail::MoeTiling tiling : tilings) {
        Output y(ny), a(na);
        detail::launch_f32_mxfp4w_moe_mma(w, didx.as<int32_t>(), rows, k_, dx.as<float>(), x_row,
                                          x_slot, y.ptr(), act(a), 1.702f, 7.0f, scratch.ws(),
                                          tiling, nullptr);
        EXPECT_EQ(scratch.routing(), want_routing(8 * tiling.n_tiles))
            << "routing workspace, tiles of " << 8 * tiling.n_tiles;
        same(y, a,
             tiling.warpgroup      ? "warpgroup 128 x 64"
             : tiling.n_tiles == 2 ? "grouped 128 x 16"
             : tiling.wide         ? "grouped 128 x 8"
                                   : "grouped 32 x 8");
      }
      Output y_entry(ny), a_entry(na);
      launch_f32_moe_linear(w, didx.as<int32_t>(), rows, k_, dx.as<float>(), x_row, x_slot,
                            y_entry.ptr(), act(a_entry), 1.702f, 7.0f, scratch.ws(), nullptr);
      same(y_entry, a_entry, "entry point");
      if (swiglu_ && moe_writes_act_split(out_)) {  // mlp1 writing mlp2's split changes no bit
        const SplitScratch act_words(static_cast<int64_t>(na));
        MoeWorkspace ws = scratch.ws();
        ws.act_split = act_words.span();
        Output y_split(ny), a_split(na);
        launch_f32_moe_linear(w, didx.as<int32_t>(), rows, k_, dx.as<float>(), x_row, x_slot,
                              y_split.ptr(), act(a_split), 1.702f, 7.0f, ws, nullptr);
        same(y_split, a_split, "entry point writing the activation's split");
        expect_split_of(a_split, int64_t(na), act_words, "mlp2's split of the activation");
      }

      // Every output written (the poison is NaN, which memcmp alone would not tell apart).
      for (int i = 0; i < pairs; ++i) {
        const bool invalid = idx[size_t(i)] < 0 || idx[size_t(i)] >= E;
        for (int j = 0; j < out_; ++j)
          ASSERT_EQ(std::isnan(yr[size_t(i) * out_ + j]), invalid) << "pair " << i << " out " << j;
        if (swiglu_) {
          for (int j = 0; j < out_ / 2; ++j)
            ASSERT_EQ(std::isnan(ar[size_t(i) * (out_ / 2) + j]), invalid) << "pair " << i;
        }
      }
    }
  }

 private:
  int experts_ = 32, out_ = 5760, in_ = 2880, k_ = 4;
  int scale_lo_ = 118, scale_hi_ = 129;
  bool swiglu_ = true;
  Routing routing_ = Routing::random;
  Precision precision_ = Precision::fp32;
};

TEST_F(DeviceKernels, MoeTilingsAgreeMlp1RealShape) {
  MoeTilingCase().run({1, 3, 64, 300});
}
TEST_F(DeviceKernels, MoeTilingsAgreeMlp2RealShape) {
  MoeTilingCase().out(2880).swiglu(false).run({1, 3, 64, 300});
}
TEST_F(DeviceKernels, MoeTilingsAgreeAllPairsOnOneExpert) {
  MoeTilingCase().routing(Routing::one_expert).run({1, 3, 64, 300});
  MoeTilingCase().out(2880).swiglu(false).routing(Routing::one_expert).run({64});
}
TEST_F(DeviceKernels, MoeTilingsAgreeWithInvalidExpertIndices) {
  MoeTilingCase().routing(Routing::with_invalid).run({1, 3, 64, 300});
  MoeTilingCase().out(2880).swiglu(false).routing(Routing::with_invalid).run({3, 64});
}
TEST_F(DeviceKernels, MoeTilingsAgreeOddShapes) {
  // out not a multiple of a group's 16 rows (70, 33, 38, 36), one block per row (in 32: an odd
  // count of blocks), more blocks than one pass of loads in flight (in 3616).
  for (const Routing r : {Routing::random, Routing::with_invalid}) {
    MoeTilingCase().experts(5).out(70).in(96).k(3).routing(r).run({1, 3, 64, 300});
    MoeTilingCase().experts(5).out(33).in(32).k(3).swiglu(false).routing(r).run({1, 3, 64, 300});
    MoeTilingCase().experts(7).out(38).in(3616).k(2).routing(r).run({1, 3, 64, 300});
    MoeTilingCase().experts(1).out(36).in(3616).k(1).swiglu(false).routing(r).run({1, 300});
  }
}
TEST_F(DeviceKernels, MoeTilingsAgreeOverEveryScale) {
  // E8M0 scales 0 .. 240: subnormal weights (s < 2), the two-multiply path (s > 128); larger
  // scales overflow float32 sums of these sizes.
  MoeTilingCase().experts(3).out(64).in(256).k(2).scales(0, 240).run({1, 40});
}
TEST_F(DeviceKernels, MoeMmaPathsAgainstTheReference) {
  MoeCase().experts(5).out(128).in(96).k(4).rows(16).run();  // 64 pairs: 32 x 8 tiles
  MoeCase().experts(5).out(96).in(128).k(4).rows(16).swiglu(false).run();
  MoeCase().experts(5).out(160).in(160).k(4).rows(64).run();  // 256 pairs: 32 x 32 tiles
  MoeCase().experts(5).out(80).in(224).k(4).rows(64).swiglu(false).run();
}
// bf16: pair mode (parts as columns), the 32 x 8, 128 x 8 and 128 x 16 tiles and, on Hopper, the
// warpgroup tiles all give the same bits, and the products take each input rounded once to BF16
// (the reference's sum of the rounded inputs within float32 accumulation; an exact-product result
// fails it). 300 rows put 37 pairs on an expert (the warpgroup tiles' partial tiles), all on one
// expert 19 tiles of it; in 3616 an odd count of blocks.
TEST_F(DeviceKernels, MoeTilingsAgreeInBf16) {
  MoeTilingCase().precision(Precision::bf16).run({1, 3, 64, 300});
  MoeTilingCase().out(2880).swiglu(false).precision(Precision::bf16).run({1, 3, 64, 300});
  MoeTilingCase().routing(Routing::with_invalid).precision(Precision::bf16).run({3, 64, 300});
  MoeTilingCase().routing(Routing::one_expert).precision(Precision::bf16).run({300});
  MoeTilingCase().experts(7).out(38).in(3616).k(2).precision(Precision::bf16).run({1, 300});
  MoeTilingCase().experts(5).out(70).in(96).k(3).precision(Precision::bf16).run({300});
}
// Small shapes of the same comparison, sized for the sanitizers (racecheck, synccheck): about 130
// and 100 pairs per expert, so that the warpgroup tiles run on Hopper.
TEST_F(DeviceKernels, MoeTilingsAgreeInBf16SmallShapes) {
  MoeTilingCase().experts(3).out(128).in(128).k(2).precision(Precision::bf16).run({200});
  MoeTilingCase().experts(3).out(70).in(96).k(3).swiglu(false).precision(Precision::bf16).run({100});
}
// The warpgroup tiles run exactly where they are built for: a CUDA build naming 90a, on a GPU of
// compute capability 9.0 (so that MoeTilingsAgreeInBf16 compares them there).
TEST_F(DeviceKernels, WarpgroupTilesOnHopperBuilds) {
  int device = 0;
  ASSERT_EQ(hipGetDevice(&device), hipSuccess);
  std::string name, arch;
  ASSERT_EQ(device_name_and_arch(device, name, arch), hipSuccess);
#if defined(PARITY_WGMMA_BUILT)
  EXPECT_EQ(warpgroup_mma_available(), arch == "sm_90") << name << " " << arch;
#else
  EXPECT_FALSE(warpgroup_mma_available()) << name << " " << arch;
#endif
}
TEST_F(DeviceKernels, MoeBf16ProductsRoundEachInputOnce) {
  MoeCase().experts(2).out(5760).in(2880).k(2).rows(1).precision(Precision::bf16).run();
  MoeCase().experts(5).out(128).in(96).k(4).rows(16).precision(Precision::bf16).run();
  MoeCase().experts(5).out(96).in(128).k(4).rows(16).swiglu(false).precision(Precision::bf16).run();
  MoeCase().experts(5).out(160).in(160).k(4).rows(64).precision(Precision::bf16).run();
  MoeCase()
      .experts(3)
      .out(64)
      .in(64)
      .k(2)
      .rows(3)
      .dense(WeightType::bf16)
      .precision(Precision::bf16)
      .run();
}

TEST_F(DeviceKernels, MoeMxfp4EveryCodeAndScaleAgainstTheReference) {
  // Every FP4 code under scales from 2^-127 (subnormal weights) to 2^113 (the two-multiply path
  // above 2^1), 512 blocks of random codes.
  MoeCase().experts(1).out(256).in(64).k(1).rows(2).swiglu(false).scales(0, 240).run();
}

// ------------------------------------------------------------------ swiglu, sums, add ---

TEST_F(DeviceKernels, SwigluClampsGateAboveOnlyAndLinearBothSides) {
  std::mt19937_64 rng(31);
  const int n = 5, inter = 300;  // values in [-12, 12]: every clamp side engages
  std::vector<float> h = random_floats(rng, size_t(n) * 2 * inter, -12, 12);
  h[0] = 7.0f, h[1] = -7.0f, h[2] = 7.5f, h[3] = 100.0f, h[4] = -100.0f, h[5] = -7.5f;
  DeviceBuffer dh = upload(h);
  Output a(size_t(n) * inter);
  launch_f32_swiglu(dh.as<float>(), n, inter, 1.702f, 7.0f, a.ptr(), nullptr);
  std::vector<double> want(size_t(n) * inter);
  const std::vector<double> hd = to_double(h);
  ref::swiglu(hd.data(), n * inter, 1.702, 7.0, want.data());
  // float alpha (1.702f) against the double 1.702: relative 3e-8 of alpha * gate inside exp.
  std::vector<double> atol(want.size());
  for (size_t i = 0; i < want.size(); ++i) atol[i] = 64 * kU * (std::fabs(want[i]) + 8 * 7);
  expect_close(a.fetch(), want, {atol, 16 * kU, 1e-10}, "swiglu");
}

TEST_F(DeviceKernels, MoeWeightedSumAndResidual) {
  for (int k : {1, 4}) {
    SCOPED_TRACE(fmt::format("moe sum k={} n=2880 rows=3", k));
    std::mt19937_64 rng(37 + uint64_t(k));
    const int rows = 3, n = 2880;
    const std::vector<float> w = random_floats(rng, size_t(rows) * k, 0, 1);
    const std::vector<float> e = random_floats(rng, size_t(rows) * k * n, -5, 5);
    const std::vector<float> res = random_floats(rng, size_t(rows) * n, -5, 5);
    DeviceBuffer dw = upload(w), de = upload(e), dres = upload(res);
    Output moe(size_t(rows) * n), resid(size_t(rows) * n);
    launch_f32_moe_weighted_sum_residual(dw.as<float>(), de.as<float>(), rows, k, n,
                                         dres.as<float>(), moe.ptr(), resid.ptr(), nullptr);
    std::vector<double> want(size_t(rows) * n), want_r(want.size()), atol(want.size());
    const std::vector<double> wd = to_double(w), ed = to_double(e);
    for (int r = 0; r < rows; ++r) {
      ref::moe_sum(wd.data() + size_t(r) * k, ed.data() + size_t(r) * k * n, k, n,
                   want.data() + size_t(r) * n);
      for (int i = 0; i < n; ++i) {
        double s = 0;
        for (int j = 0; j < k; ++j)
          s += std::fabs(wd[size_t(r) * k + j] * ed[(size_t(r) * k + j) * n + i]);
        atol[size_t(r) * n + i] = dot_atol(2 * k, s) + 4 * kU * std::fabs(res[size_t(r) * n + i]);
        want_r[size_t(r) * n + i] = res[size_t(r) * n + i] + want[size_t(r) * n + i];
      }
    }
    expect_close(moe.fetch(), want, {atol, 0.0, 1e-10}, "moe_out");
    expect_close(resid.fetch(), want_r, {atol, 2 * kU, 1e-10}, "resid_ffn");
  }
}

TEST_F(DeviceKernels, AddIsExactElementwise) {
  std::mt19937_64 rng(41);
  const std::vector<float> a = random_floats(rng, 1000, -9, 9), b = random_floats(rng, 1000, -9, 9);
  DeviceBuffer da = upload(a), db = upload(b);
  Output y(1000);
  launch_f32_add(da.as<float>(), db.as<float>(), 1000, y.ptr(), nullptr);
  const std::vector<float> got = y.fetch();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], a[i] + b[i]) << i;
}

// A tensor-parallel group's joins: the parts added in rank order (three ranks: an order the
// test can tell from another), the residual added after; lm_head's vocabulary shards (unequal:
// 1000 rows over three ranks) into full rows.
TEST_F(DeviceKernels, RankSumAndVocabJoin) {
  std::mt19937_64 rng(43);
  const int ranks = 3, n = 777;
  const std::vector<float> parts = random_floats(rng, size_t(ranks) * n, -1e4f, 1e4f);
  const std::vector<float> residual = random_floats(rng, size_t(n), -9, 9);
  DeviceBuffer dp = upload(parts), dr = upload(residual);
  Output sum(n), resid(n);
  launch_f32_rank_sum_residual(dp.as<float>(), ranks, n, dr.as<float>(), sum.ptr(), resid.ptr(),
                               nullptr);
  const std::vector<float> s = sum.fetch(), r = resid.fetch();
  for (int i = 0; i < n; ++i) {
    const float want = (parts[size_t(i)] + parts[size_t(n + i)]) + parts[size_t(2 * n + i)];
    ASSERT_EQ(s[size_t(i)], want) << i;
    ASSERT_EQ(r[size_t(i)], residual[size_t(i)] + want) << i;
  }

  const int vocab = 1000, rows = 5;
  const int64_t part = int64_t(rows) * ((vocab + ranks - 1) / ranks);
  std::vector<float> shards(size_t(part) * ranks, std::nanf(""));
  std::vector<float> want(size_t(rows) * vocab);
  for (int k = 0; k < ranks; ++k) {
    const parity::device::ShardRange v = parity::device::split_range(vocab, ranks, k);
    for (int b = 0; b < rows; ++b)
      for (int j = v.begin; j < v.end; ++j) {
        const float x = float(b * vocab + j);
        shards[size_t(k * part + int64_t(b) * v.size() + (j - v.begin))] = x;
        want[size_t(b * vocab + j)] = x;
      }
  }
  DeviceBuffer ds = upload(shards);
  Output logits(size_t(rows) * vocab);
  launch_f32_vocab_join(ds.as<float>(), ranks, rows, vocab, part, logits.ptr(), nullptr);
  EXPECT_EQ(logits.fetch(), want);
  EXPECT_THROW(
      launch_f32_vocab_join(ds.as<float>(), ranks, rows, vocab, part - 1, logits.ptr(), nullptr),
      parity::Error);
}

TEST_F(DeviceKernels, LaunchersRejectBadArguments) {
  DeviceBuffer x(64 * sizeof(float)), w(64 * 2);
  EXPECT_THROW(launch_f32_rmsnorm(x.as<float>(), WeightType::bf16, w.as(), 0, 64, 1e-5f,
                                  x.as<float>(), nullptr),
               parity::Error);
  EXPECT_THROW(launch_f32_swiglu(nullptr, 1, 1, 1.702f, 7.0f, x.as<float>(), nullptr),
               parity::Error);
  const GemvSegment seg{{WeightType::bf16, w.as(), 1, 64}, nullptr, 0};
  EXPECT_THROW(
      launch_f32_gemv_bias({&seg, 1}, x.as<float>(), 32, 1, x.as<float>(), 1, {}, {}, nullptr),
      parity::Error);
  // BF16 weights in blocks of 32 take the MMA kernel, whose split workspace is missing here.
  const GemvSegment seg64{{WeightType::bf16, w.as(), 1, 32}, nullptr, 0};
  EXPECT_THROW(
      launch_f32_gemv_bias({&seg64, 1}, x.as<float>(), 32, 1, x.as<float>(), 1, {}, {}, nullptr),
      parity::Error);
  ExpertWeights ew;
  ew.packed_blocks = w.as<uint8_t>(), ew.packed_scales = w.as<uint8_t>(), ew.bias = x.as<float>();
  ew.experts = 1, ew.out = 2, ew.in = 48;  // not a multiple of 32
  const MoeScratch big(64, 1, 64 * 32);
  EXPECT_THROW(launch_f32_moe_linear(ew, reinterpret_cast<const int32_t*>(x.as()), 1, 1,
                                     x.as<float>(), 48, 0, x.as<float>(), nullptr, 1.702f, 7.0f,
                                     big.ws(), nullptr),
               parity::Error);
  // A step of 16 pairs takes the grouped path, whose routing workspace is too small here.
  ew.in = 32;
  const MoeScratch small_routing(1, 1, 16 * 32);
  EXPECT_THROW(launch_f32_moe_linear(ew, reinterpret_cast<const int32_t*>(x.as()), 16, 1,
                                     x.as<float>(), 0, 0, x.as<float>(), nullptr, 1.702f, 7.0f,
                                     small_routing.ws(), nullptr),
               parity::Error);
  // The split inputs of 2 rows do not fit a workspace for one.
  const MoeScratch small_split(64, 1, 32);
  EXPECT_THROW(launch_f32_moe_linear(ew, reinterpret_cast<const int32_t*>(x.as()), 2, 1,
                                     x.as<float>(), 32, 0, x.as<float>(), nullptr, 1.702f, 7.0f,
                                     small_split.ws(), nullptr),
               parity::Error);
  // Tilings that are not built.
  EXPECT_THROW(detail::launch_f32_mxfp4w_moe_mma(ew, reinterpret_cast<const int32_t*>(x.as()), 1,
                                                 1, x.as<float>(), 32, 0, x.as<float>(), nullptr,
                                                 1.702f, 7.0f, big.ws(), {true, 2, 2}, nullptr),
               parity::Error);
}

}  // namespace
}  // namespace parity::device

#else  // !PARITY_HAVE_DEVICE

TEST(DeviceKernels, NotBuilt) {
  GTEST_SKIP() << "this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)";
}

#endif
