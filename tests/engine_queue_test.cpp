// The engine's admission under a small KV cache, the shared work queue of several engines, and
// requests refused one by one: on the CPU backends with the tiny model (CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "device/runtime/kv_blocks.h"
#include "engine/engine.h"
#include "engine/graph_runner.h"
#include "tokenizer/tiny_tokenizer.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "tests/test_util.h"
#include "tools/common.h"

namespace parity {
namespace {
using test::tiny_model;

// Many short and a few long prompts, with assorted output lengths through max_tokens.
std::vector<EngineRequest> mixed_requests(int count) {
  std::vector<EngineRequest> r;
  for (int i = 0; i < count; ++i) {
    EngineRequest q;
    q.id = uint64_t(1000 + i);
    const int length = i % 7 == 0 ? 90 + i % 40 : 1 + (i * 5) % 12;
    for (int j = 0; j < length; ++j) q.prompt.push_back(TokenId((11 + 29 * i + 13 * j) % 1000));
    r.push_back(std::move(q));
  }
  return r;
}

EngineOptions options(int max_batch, int step_tokens) {
  EngineOptions o;
  o.max_tokens = 24;
  o.limits.max_batch = max_batch;
  o.limits.step_tokens = step_tokens;
  o.sampling.temperature = 0.8;
  o.sampling.top_k = 50;
  o.sampling.seed = 7;
  return o;
}

TEST(EngineQueue, SmallKvMemoryRunsEverythingInOrderWithoutDeadlock) {
  const auto requests = mixed_requests(40);
  auto unlimited_backend = make_backend("cpu-f32", tiny_model());
  GraphRunner unlimited(*unlimited_backend);
  Engine reference(unlimited, options(8, 64));
  const std::vector<EngineResult> expected = reference.run(requests);

  // A cache for about two of the long requests at a time: admission must wait for retirements.
  const device::KvLayout layout = device::KvLayout::of(tiny_model().config, 32);
  const int long_need = layout.blocks_per_sequence(130 + 24, 64);
  auto small_backend = make_backend("cpu-f32", tiny_model());
  GraphRunner small(*small_backend, 2 * long_need + 1, 32);
  Engine engine(small, options(8, 64));
  LocalQueue queue(requests);
  engine.run(queue);
  ASSERT_EQ(queue.completed(), requests.size());
  const std::vector<EngineResult> got = queue.take_results();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].finish, expected[i].finish) << "request " << i;
    EXPECT_EQ(got[i].generated, expected[i].generated) << "request " << i;
  }
  // The small cache held fewer sequences at a time: more steps than with room for all.
  EXPECT_GT(engine.stats().steps, reference.stats().steps);
}

TEST(EngineQueue, ARequestLargerThanTheCacheIsRefusedAndTheOthersRun) {
  auto backend = make_backend("cpu-f32", tiny_model());
  const device::KvLayout layout = device::KvLayout::of(tiny_model().config, 32);
  GraphRunner runner(*backend, layout.blocks_per_sequence(100, 16), 32);  // 90 + 8 fits
  EngineOptions o = options(4, 16);
  o.max_tokens = 8;
  Engine engine(runner, o);
  std::vector<EngineRequest> requests = mixed_requests(6);
  requests[2].prompt.assign(200, 5);  // 208 positions: more blocks than the cache has
  LocalQueue queue(requests);
  engine.run(queue);
  const auto results = queue.take_results();
  for (size_t i = 0; i < results.size(); ++i) {
    if (i == 2) {
      EXPECT_EQ(results[i].finish, FinishReason::error);
      EXPECT_NE(results[i].error.find("KV-cache blocks"), std::string::npos) << results[i].error;
      EXPECT_TRUE(results[i].generated.empty());
    } else {
      EXPECT_NE(results[i].finish, FinishReason::error) << results[i].error;
      EXPECT_FALSE(results[i].generated.empty());
    }
  }
  EXPECT_EQ(engine.stats().failed, 1u);
}

TEST(EngineQueue, SeveralEnginesOnOneQueueGiveOneEnginesResults) {
  const auto requests = mixed_requests(30);
  auto one_backend = make_backend("cpu-f32", tiny_model());
  Engine one(*one_backend, options(4, 32));
  const std::vector<EngineResult> expected = one.run(requests);

  constexpr int kEngines = 3;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int i = 0; i < kEngines; ++i) {
    backends.push_back(make_backend("cpu-f32", tiny_model()));
    engines.push_back(std::make_unique<Engine>(*backends.back(), options(4, 32)));
  }
  LocalQueue queue(requests);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int i = 0; i < kEngines; ++i)
    threads.emplace_back([&, i] { engines[size_t(i)]->run(queue, {}, start, i); });
  for (std::thread& t : threads) t.join();
  const std::vector<EngineResult> got = queue.take_results();
  size_t taken = 0;
  std::vector<int> per_worker(kEngines, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].generated, expected[i].generated) << "request " << i;
    ASSERT_GE(got[i].worker, 0);
    ASSERT_LT(got[i].worker, kEngines);
    ++per_worker[size_t(got[i].worker)];
  }
  for (const auto& e : engines) taken += e->stats().requests;
  EXPECT_EQ(taken, requests.size());  // each request ran once
}

TEST(EngineQueue, EachRequestGeneratesUpToItsOwnMaxTokens) {
  std::vector<EngineRequest> requests = mixed_requests(8);
  const std::vector<int> limits = {1, 5, 0, 30, 2, 0, 17, 3};  // 0: the options' 24
  for (size_t i = 0; i < requests.size(); ++i) requests[i].max_tokens = limits[i];
  auto backend = make_backend("cpu-f32", tiny_model());
  Engine engine(*backend, options(3, 32));
  const std::vector<EngineResult> got = engine.run(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].finish, FinishReason::length) << "request " << i;
    EXPECT_EQ(got[i].generated.size(), size_t(limits[i] > 0 ? limits[i] : 24)) << "request " << i;
  }
  // A request's own max_tokens may exceed -n, not the context.
  EngineRequest too_long = requests[0];
  too_long.max_tokens = engine.context() + 1;
  EXPECT_EQ(engine.check_request(too_long),
            fmt::format("max_tokens {} is more than the context of {} positions",
                        engine.context() + 1, engine.context()));
  too_long.max_tokens = engine.context();
  EXPECT_EQ(engine.check_request(too_long), "");
}

TEST(EngineQueue, TheCacheIsReservedForEachRequestsOwnMaxTokens) {
  // A cache that holds a 90-token prompt with 8 tokens to generate, not with the options' 200:
  // the request saying 8 runs; the same prompt with the default is refused with its sizes.
  auto backend = make_backend("cpu-f32", tiny_model());
  const device::KvLayout layout = device::KvLayout::of(tiny_model().config, 32);
  GraphRunner runner(*backend, layout.blocks_per_sequence(100, 16), 32);
  EngineOptions o = options(4, 16);
  o.max_tokens = 200;
  Engine engine(runner, o);
  std::vector<EngineRequest> requests(2);
  for (auto& r : requests) r.prompt.assign(90, 7);
  requests[0].max_tokens = 8;
  requests[1].id = 1;
  LocalQueue queue(requests);
  engine.run(queue);
  const auto results = queue.take_results();
  EXPECT_EQ(results[0].finish, FinishReason::length) << results[0].error;
  EXPECT_EQ(results[0].generated.size(), 8u);
  EXPECT_EQ(results[1].finish, FinishReason::error);
  EXPECT_NE(results[1].error.find("(90 prompt tokens + 200 to generate)"), std::string::npos)
      << results[1].error;
}

TEST(EngineQueue, IgnoreEosGeneratesPastTheStopTokens) {
  // The first token the model picks for this prompt (greedy) made a stop token.
  EngineRequest request = mixed_requests(1).front();
  EngineOptions o = options(2, 32);
  o.sampling.temperature = 0;
  auto backend = make_backend("cpu-f32", tiny_model());
  const TokenId first = Engine(*backend, o).run({request}).front().generated.front();
  o.stop_tokens = {first};
  Engine engine(*backend, o);
  EngineRequest ignoring = request;
  ignoring.id = request.id + 1;  // greedy: the id changes nothing
  ignoring.ignore_eos = true;
  ignoring.max_tokens = 6;
  const std::vector<EngineResult> got = engine.run({request, ignoring});
  EXPECT_EQ(got[0].finish, FinishReason::stop);
  EXPECT_EQ(got[0].generated, std::vector<TokenId>{first});
  EXPECT_EQ(got[1].finish, FinishReason::length);
  ASSERT_EQ(got[1].generated.size(), 6u);
  EXPECT_EQ(got[1].generated.front(), first);
}

TEST(EngineQueue, TimePerOutputTokenCountsRequestsOfTwoTokensOrMore) {
  std::vector<EngineRequest> requests = mixed_requests(6);
  const std::vector<int> limits = {1, 4, 1, 9, 2, 1};
  for (size_t i = 0; i < requests.size(); ++i) requests[i].max_tokens = limits[i];
  auto backend = make_backend("cpu-f32", tiny_model());
  Engine engine(*backend, options(2, 16));
  engine.run(requests);
  const EngineStats& s = engine.stats();
  EXPECT_EQ(s.ttft_seconds.size(), 6u);
  ASSERT_EQ(s.tpot_seconds.size(), 3u);  // the requests of 4, 9 and 2 tokens
  for (const double t : s.tpot_seconds) EXPECT_GT(t, 0);
  // No request's tokens after the first took longer than the whole run.
  for (const double t : s.tpot_seconds) EXPECT_LT(t, s.wall_seconds);
  EXPECT_EQ(s.tpot_percentile(1.0),
            *std::max_element(s.tpot_seconds.begin(), s.tpot_seconds.end()));
  EXPECT_EQ(s.tpot_percentile(0.01),
            *std::min_element(s.tpot_seconds.begin(), s.tpot_seconds.end()));
  EngineStats merged = s;
  merged.merge(s);
  EXPECT_EQ(merged.tpot_seconds.size(), 6u);
}

TEST(EngineQueue, PercentilesAreByNearestRank) {
  EXPECT_EQ(nearest_rank_percentile({}, 0.5), 0);
  EXPECT_EQ(nearest_rank_percentile({3}, 0.99), 3);
  const std::vector<double> v = {5, 1, 4, 2, 3, 10, 9, 8, 7, 6};
  EXPECT_EQ(nearest_rank_percentile(v, 0.5), 5);
  EXPECT_EQ(nearest_rank_percentile(v, 0.99), 10);
  EXPECT_EQ(nearest_rank_percentile(v, 0.1), 1);
  EXPECT_EQ(nearest_rank_percentile(v, 0.11), 2);
}

TEST(EngineQueue, LocalQueueRefusesADoubleCompletion) {
  LocalQueue q({EngineRequest{1, {3}}});
  auto item = q.next();
  ASSERT_TRUE(item.has_value());
  EXPECT_FALSE(q.next().has_value());
  q.done(item->index, EngineResult{});
  EXPECT_THROW(q.done(item->index, EngineResult{}), Error);
  EXPECT_EQ(q.take_results().size(), 1u);
}

}  // namespace
}  // namespace parity
