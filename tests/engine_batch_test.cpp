// The engine (engine/engine.h) on the CPU backends with the tiny model: greedy output equals the
// reference's own greedy decode, and a request's tokens do not depend on its batch.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "tokenizer/tiny_tokenizer.h"
#include "model/checkpoint.h"
#include "model/forward.h"
#include "tests/test_util.h"
#include "tools/common.h"

namespace parity {
namespace {
using test::tiny_model;

std::unique_ptr<Backend> backend(const std::string& name) {
  return make_backend(name, tiny_model());
}

// Prompts of assorted lengths (1 to 40 tokens) in the tiny vocabulary.
std::vector<EngineRequest> prompts(int count) {
  std::vector<EngineRequest> r;
  for (int i = 0; i < count; ++i) {
    EngineRequest q;
    q.id = uint64_t(i);
    const int length = 1 + (i * 13) % 40;
    for (int j = 0; j < length; ++j) q.prompt.push_back(TokenId((7 + 31 * i + 17 * j) % 1000));
    r.push_back(std::move(q));
  }
  return r;
}

// The reference's greedy decode, one row per step through the graph, with the engine's rules:
// stop after a stop token (kept) or after max_tokens.
std::vector<TokenId> reference_greedy(Backend& b, const std::vector<TokenId>& prompt,
                                      int max_tokens, const std::vector<TokenId>& stops) {
  b.reset();
  std::vector<TokenId> out;
  TokenId next = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    forward(b, Batch::single(prompt[p], int32_t(p)));
  }
  next = b.read(Stage::sampled, kModelLayer, 0).i32.at(0);
  while (true) {
    out.push_back(next);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    if (int(out.size()) >= max_tokens) break;
    forward(b, Batch::single(next, int32_t(prompt.size() + out.size() - 1)));
    next = b.read(Stage::sampled, kModelLayer, 0).i32.at(0);
  }
  return out;
}

std::vector<TokenId> tiny_stops() {
  const Tokenizer t = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  return model_stop_tokens(test::tiny_model_dir(), t);
}

TEST(EngineBatch, GreedyEqualsTheReferenceDecode) {
  auto ref = backend("reference");
  auto oracle = backend("reference");
  EngineOptions o;
  o.max_tokens = 12;
  o.stop_tokens = tiny_stops();
  o.limits.max_batch = 3;
  o.limits.step_tokens = 16;
  Engine engine(*ref, o);
  const auto requests = prompts(5);
  const auto results = engine.run(requests);
  ASSERT_EQ(results.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(results[i].generated,
              reference_greedy(*oracle, requests[i].prompt, o.max_tokens, o.stop_tokens))
        << "request " << i;
}

class EngineBatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineBatchInvariance, AloneOrBatchedGivesTheSameTokens) {
  if (const std::string why = test::candidate_unavailable(GetParam()); !why.empty())
    GTEST_SKIP() << why;
  for (const double temperature : {0.0, 0.9}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    EngineOptions o;
    o.max_tokens = 10;
    o.sampling.temperature = temperature;
    o.sampling.top_p = 0.95;
    o.sampling.seed = 99;
    o.stop_tokens = tiny_stops();
    const auto requests = prompts(9);
    auto b = backend(GetParam());
    std::vector<std::vector<TokenId>> alone;
    {
      EngineOptions one = o;
      one.limits.max_batch = 1;
      Engine engine(*b, one);
      for (const EngineRequest& r : requests) alone.push_back(engine.run({r}).at(0).generated);
    }
    for (const auto& [batch, step_tokens] : std::vector<std::pair<int, int>>{{4, 7}, {9, 256}}) {
      EngineOptions many = o;
      many.limits.max_batch = batch;
      many.limits.step_tokens = step_tokens;
      Engine engine(*b, many);
      const auto results = engine.run(requests);
      for (size_t i = 0; i < requests.size(); ++i)
        EXPECT_EQ(results[i].generated, alone[i])
            << "request " << i << " max_batch " << batch << " step_tokens " << step_tokens;
      int64_t prompt_tokens = 0;
      for (const auto& r : requests) prompt_tokens += int64_t(r.prompt.size());
      EXPECT_EQ(engine.stats().prompt_tokens, prompt_tokens);
      EXPECT_EQ(engine.stats().requests, requests.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineBatchInvariance,
                         ::testing::Values("reference", "cpu-f32", "hip"));

TEST(EngineBatch, StopsAtMaxTokensAndContext) {
  auto b = backend("cpu-f32");
  EngineOptions o;
  o.max_tokens = 50;
  o.context = 20;
  Engine engine(*b, o);
  EngineRequest r;
  r.prompt.assign(15, 3);
  const auto res = engine.run({r});
  ASSERT_EQ(res.size(), 1u);
  // Positions 15..19 run the generated tokens 1..5; the sixth has no position left.
  EXPECT_EQ(res[0].generated.size(), 6u);
  EXPECT_EQ(res[0].finish, FinishReason::context);
  EXPECT_EQ(engine.check_prompt(std::vector<TokenId>(21, 3)).empty(), false);
  EXPECT_EQ(engine.check_prompt(std::vector<TokenId>(20, 3)), "");
  EXPECT_EQ(engine.check_prompt({}), "empty prompt");
}

TEST(EngineScheduler, ManyRequestsSmallBatchNothingLost) {
  SchedulerLimits limits;
  limits.max_batch = 2;
  limits.step_tokens = 5;
  Scheduler s(limits);
  for (size_t i = 0; i < 6; ++i) s.enqueue(i, std::vector<TokenId>(1 + 4 * i, 1));
  std::vector<int> generated(6, 0);
  int steps = 0;
  while (!s.idle()) {
    s.admit();
    ASSERT_LE(s.running(), 2u);
    const StepPlan p = s.plan();
    ASSERT_GT(p.batch.rows(), 0);
    ASSERT_LE(p.batch.rows(), 5);
    for (const auto& sample : p.samples) {
      ScheduledSequence& q = s.sequence(sample.slot);
      if (++generated[q.request] == 3)
        s.retire(sample.slot);
      else
        s.append(sample.slot, 2);
    }
    ASSERT_LT(++steps, 1000);
  }
  for (int g : generated) EXPECT_EQ(g, 3);
}

}  // namespace
}  // namespace parity
