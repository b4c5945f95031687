// The engine's device runner (engine/device_runner.h) on the tiny model: its greedy tokens are
// the argmax of the logits the traced `hip` backend computes for the same tokens (same kernels),
// its sampled tokens are the host sampler's on those logits, a request's tokens do not depend on
// its batch, and a small paged KV cache still runs every request. Skipped without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/graph_runner.h"
#include "model/checkpoint.h"
#include "model/forward.h"
#include "tests/test_util.h"
#include "tools/common.h"
#ifdef PARITY_HAVE_DEVICE_ENGINE
#include "device/hip_backend.h"
#include "device/runtime/communicator.h"
#include "device/runtime/device.h"
#include "device/runtime/peer_group.h"
#include "engine/device_runner.h"
#include "engine/tensor_parallel_runner.h"
#endif

namespace parity {
namespace {
using test::tiny_model;

#ifdef PARITY_HAVE_DEVICE_ENGINE

std::vector<EngineRequest> requests(int count) {
  std::vector<EngineRequest> r;
  for (int i = 0; i < count; ++i) {
    EngineRequest q;
    q.id = uint64_t(i);
    const int length = i % 5 == 0 ? 70 + i : 1 + (i * 7) % 20;
    for (int j = 0; j < length; ++j) q.prompt.push_back(TokenId((3 + 41 * i + 19 * j) % 1000));
    r.push_back(std::move(q));
  }
  return r;
}

// max_context 0: the traced backend's default (the attention kernels split keys by it).
std::unique_ptr<StepRunner> device_runner(device::Precision precision, size_t kv_bytes = 0,
                                          int max_context = 0, bool graphs = true) {
  device::DeviceOptions o;
  o.precision = precision;
  o.graphs = graphs;
  o.max_context = max_context;
  o.kv_bytes = kv_bytes;
  o.kv_sequences = kv_bytes == 0 ? 64 : 0;
  return make_device_runner(tiny_model(), o, false);
}

EngineOptions options(int max_batch, int step_tokens, double temperature) {
  EngineOptions o;
  o.max_tokens = 12;
  o.limits.max_batch = max_batch;
  o.limits.step_tokens = step_tokens;
  o.sampling.temperature = temperature;
  o.sampling.top_p = 0.9;
  o.sampling.top_k = 40;
  o.sampling.seed = 3;
  return o;
}

// Every guarantee in both precisions of the products (the runner and the traced backend of the
// same precision).
class EngineDevice : public ::testing::TestWithParam<device::Precision> {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable("hip"); !why.empty())
      GTEST_SKIP() << why;
  }
  std::unique_ptr<StepRunner> runner(size_t kv_bytes = 0, int max_context = 0,
                                     bool graphs = true) const {
    return device_runner(GetParam(), kv_bytes, max_context, graphs);
  }
  std::unique_ptr<Backend> traced_hip() const {
    device::DeviceOptions o = device::device_options_from_environment();
    o.precision = GetParam();
    return make_hip_backend(tiny_model(), o);
  }
};

// The traced hip backend's logits for `prompt` followed by `generated`, one row per generated
// token (the row that produced it).
std::vector<std::vector<float>> traced_logits(Backend& hip, const std::vector<TokenId>& prompt,
                                              const std::vector<TokenId>& generated) {
  hip.reset();
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end() - 1);
  Batch b;
  for (size_t p = 0; p < all.size(); ++p) {
    b.tokens.push_back(all[p]);
    b.positions.push_back(int32_t(p));
    b.seqs.push_back(0);
  }
  forward(hip, b);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < generated.size(); ++i) {
    const StageData d = hip.read(Stage::logits, kModelLayer, int(prompt.size() - 1 + i));
    rows.emplace_back(d.f32.begin(), d.f32.end());
  }
  return rows;
}

TEST_P(EngineDevice, GreedyTokensAreTheArgmaxOfTheTracedHipLogits) {
  auto runner = this->runner();
  Engine engine(*runner, options(4, 9, 0));
  const auto reqs = requests(10);
  const auto results = engine.run(reqs);
  auto hip = traced_hip();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(results[i].generated.empty());
    const auto rows = traced_logits(*hip, reqs[i].prompt, results[i].generated);
    for (size_t t = 0; t < rows.size(); ++t)
      ASSERT_EQ(results[i].generated[t], greedy_token(std::span<const float>(rows[t])))
          << "request " << i << " token " << t;
  }
}

TEST_P(EngineDevice, SampledTokensAreTheHostSamplersOnTheTracedHipLogits) {
  auto runner = this->runner();
  const EngineOptions o = options(4, 9, 0.9);
  Engine engine(*runner, o);
  const auto reqs = requests(10);
  const auto results = engine.run(reqs);
  auto hip = traced_hip();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto rows = traced_logits(*hip, reqs[i].prompt, results[i].generated);
    for (size_t t = 0; t < rows.size(); ++t)
      ASSERT_EQ(results[i].generated[t],
                sample_token(std::span<const float>(rows[t]), o.sampling, reqs[i].id, t))
          << "request " << i << " token " << t;
  }
}

TEST_P(EngineDevice, ARequestsTokensDoNotDependOnItsBatch) {
  const auto reqs = requests(12);
  for (const double temperature : {0.0, 0.9}) {
    auto runner = this->runner();
    std::vector<std::vector<TokenId>> alone;
    {
      Engine one(*runner, options(1, 64, temperature));
      for (const auto& r : reqs) alone.push_back(one.run({r}).at(0).generated);
    }
    Engine many(*runner, options(12, 32, temperature));
    const auto results = many.run(reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(results[i].generated, alone[i]) << "request " << i << " temperature "
                                                << temperature;
  }
}

TEST_P(EngineDevice, GraphLaunchedStepsGiveTheTokensOfKernelsLaunchedOneByOne) {
  const auto reqs = requests(12);
  for (const double temperature : {0.0, 0.9}) {
    auto one_by_one = runner(0, 0, false);
    const auto want = Engine(*one_by_one, options(6, 16, temperature)).run(reqs);
    auto graphs = runner(0, 0, true);
    const auto got = Engine(*graphs, options(6, 16, temperature)).run(reqs);
    EXPECT_THAT(graphs->launches(), ::testing::ContainsRegex("[1-9][0-9]* replayed"));
    EXPECT_THAT(one_by_one->launches(),
                ::testing::HasSubstr(" 0 replayed from a captured graph, 0 captured,"));
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].generated, want[i].generated)
          << "request " << i << " temperature " << temperature;
  }
}

TEST_P(EngineDevice, ASmallPagedCacheRunsEveryRequest) {
  const auto reqs = requests(30);
  auto roomy = runner(0, 256);
  const auto expected = Engine(*roomy, options(16, 64, 0.9)).run(reqs);
  // Room for a few sequences only: admission waits for retirements, blocks are reused.
  const size_t block_bytes = size_t(roomy->config().kv_dim()) * 2 * 32 * sizeof(float) *
                             size_t(roomy->config().num_hidden_layers);
  auto small = runner(block_bytes * 24, 256);
  ASSERT_LT(small->kv_blocks(), roomy->kv_blocks());
  Engine engine(*small, options(16, 64, 0.9));
  const auto results = engine.run(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(results[i].generated, expected[i].generated) << "request " << i;
}

INSTANTIATE_TEST_SUITE_P(Precisions, EngineDevice,
                         ::testing::Values(device::Precision::fp32, device::Precision::bf16),
                         [](const ::testing::TestParamInfo<device::Precision>& i) {
                           return std::string(device::precision_name(i.param));
                         });

// The tiny model split over two GPUs (its four heads, two KV heads, and each expert's two blocks
// of the intermediate dimension, one a rank): in fp32 the group samples the tokens one GPU
// samples; in both precisions a request's tokens do not depend on its batch, and the ranks sample
// the same tokens (the runner checks every step). bf16 is not compared with one GPU: the split
// sums round differently in float32's last place, which now and then moves a product input's
// BF16 rounding, and the tiny model's near-tied logits then pick another token (measured: 4 of
// 32 runs, 16 requests greedy and sampled, part after 3 to 10 of 12 tokens); that the group
// stays within the bf16 policy's bounds is the traced group's test (tests/trace_group_test.cpp).
// Skipped below two GPUs or without NCCL.
class EngineTensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable("hip"); !why.empty())
      GTEST_SKIP() << why;
    if (!device::collectives_built()) GTEST_SKIP() << "this build has no NCCL (RCCL on AMD)";
    if (device_count() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << device_count();
  }
  static std::unique_ptr<StepRunner> group(device::Precision precision,
                                           device::AllReduce all_reduce = device::AllReduce::peer) {
    device::DeviceOptions o;
    o.precision = precision;
    o.kv_sequences = 64;
    o.tensor_parallel.all_reduce = all_reduce;
    const std::vector<int> devices = {0, 1};
    return make_tensor_parallel_runner(tiny_model(), o, devices, false);
  }
};

// The peer-store all-reduce and NCCL's all-gather add the same parts in the same order: the same
// tokens in both precisions, greedy and sampled (bf16 too, where a last-place difference in a
// sum would show within a few tokens, as it does against one GPU).
TEST_F(EngineTensorParallel, ThePeerAndNcclAllReducesSampleTheSameTokens) {
  const std::vector<int> devices = {0, 1};
  if (!device::PeerGroup::open(devices))
    GTEST_SKIP() << "these GPUs do not reach each other's memory";
  const auto reqs = requests(16);
  for (const auto precision : {device::Precision::fp32, device::Precision::bf16}) {
    auto peer = group(precision, device::AllReduce::peer);
    auto nccl = group(precision, device::AllReduce::nccl);
    EXPECT_THAT(peer->name(), ::testing::HasSubstr("(peer-store all-reduce)"));
    EXPECT_THAT(nccl->name(), ::testing::HasSubstr("(NCCL all-reduce)"));
    for (const double temperature : {0.0, 0.9}) {
      const auto want = Engine(*nccl, options(8, 32, temperature)).run(reqs);
      const auto got = Engine(*peer, options(8, 32, temperature)).run(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        ASSERT_FALSE(got[i].generated.empty());
        EXPECT_EQ(got[i].generated, want[i].generated)
            << "request " << i << " temperature " << temperature << " "
            << device::precision_name(precision);
      }
    }
  }
}

TEST_F(EngineTensorParallel, TwoRanksSampleTheTokensOfOneGpuInFp32) {
  const auto reqs = requests(16);
  auto split = group(device::Precision::fp32);
  EXPECT_THAT(split->name(), ::testing::HasSubstr("tensor parallel over 2 GPUs"));
  auto one = device_runner(device::Precision::fp32);
  for (const double temperature : {0.0, 0.9}) {
    const auto want = Engine(*one, options(8, 32, temperature)).run(reqs);
    const auto got = Engine(*split, options(8, 32, temperature)).run(reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_FALSE(got[i].generated.empty());
      EXPECT_EQ(got[i].generated, want[i].generated)
          << "request " << i << " temperature " << temperature;
    }
  }
  EXPECT_THAT(split->launches(), ::testing::ContainsRegex("[1-9][0-9]* replayed"));
}

TEST_F(EngineTensorParallel, ARequestsTokensDoNotDependOnItsBatch) {
  const auto reqs = requests(12);
  for (const auto precision : {device::Precision::fp32, device::Precision::bf16})
    for (const double temperature : {0.0, 0.9}) {
      auto split = group(precision);
      std::vector<std::vector<TokenId>> alone;
      {
        Engine one(*split, options(1, 64, temperature));
        for (const auto& r : reqs) alone.push_back(one.run({r}).at(0).generated);
      }
      const auto results = Engine(*split, options(12, 32, temperature)).run(reqs);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(results[i].generated, alone[i])
            << "request " << i << " temperature " << temperature << " "
            << device::precision_name(precision);
      EXPECT_THAT(split->launches(), ::testing::ContainsRegex("[1-9][0-9]* replayed"));
    }
}

#else

TEST(EngineDevice, NeedsTheDeviceEngine) {
  GTEST_SKIP() << "this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)";
}

#endif

}  // namespace
}  // namespace parity
