// check_batch, the one validator of a step's rows that every backend (reference, cpu-f32, hip)
// runs before touching its caches, and the reference backend's cache truncation through it.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"

namespace parity {
namespace {

Config small_config() {
  Config c;
  c.vocab_size = 100;
  c.max_position_embeddings = 64;
  return c;
}

std::string refusal(const Batch& b, int max_positions, const std::map<int, int>& cached) {
  try {
    check_batch(b, small_config(), max_positions, [&](int seq) {
      auto it = cached.find(seq);
      return it == cached.end() ? 0 : it->second;
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckBatch, ReturnsEachSequencesFirstPositionAndEnd) {
  const Batch b{{1, 2, 3, 4, 5}, {7, 0, 8, 1, 2}, {0, 1, 0, 1, 1}};
  const auto steps = check_batch(b, small_config(), 64, [](int seq) { return seq == 0 ? 7 : 0; });
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps.at(0).first, 7);
  EXPECT_EQ(steps.at(0).end, 9);
  EXPECT_EQ(steps.at(1).first, 0);
  EXPECT_EQ(steps.at(1).end, 3);
}

TEST(CheckBatch, RestartingAtOrBeforeTheCachedLengthIsAllowed) {
  EXPECT_EQ(refusal(Batch{{1, 2}, {3, 4}, {0, 0}}, 64, {{0, 10}}), "");
  EXPECT_EQ(refusal(Batch::single(1, 10), 64, {{0, 10}}), "");
}

TEST(CheckBatch, RefusesEachMalformedStepWithItsReason) {
  struct Case {
    Batch b;
    int max_positions;
    std::map<int, int> cached;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {Batch{{1, 2}, {0}, {0, 0}}, 64, {}, "differ in length"},
      {Batch{}, 64, {}, "no tokens"},
      {Batch::single(100, 0), 64, {}, "token id 100 out of range"},
      {Batch::single(-1, 0), 64, {}, "token id -1 out of range"},
      {Batch::single(1, 64), 64, {}, "position 64 out of range"},
      {Batch::single(1, -1), 64, {}, "position -1 out of range"},
      {Batch::single(1, 32), 32, {{0, 32}}, "past the device KV cache of 32"},
      {Batch::single(1, 5), 64, {{0, 4}}, "position 5 does not follow position 3"},
      {Batch{{1, 2}, {0, 2}, {0, 0}}, 64, {}, "position 2 does not follow position 0"},
      {Batch{{1, 2}, {1, 0}, {0, 0}}, 64, {{0, 1}}, "position 0 does not follow position 1"},
  };
  for (const auto& c : cases) {
    const std::string got = refusal(c.b, c.max_positions, c.cached);
    EXPECT_NE(got.find(c.expect), std::string::npos)
        << "expected \"" << c.expect << "\", got \"" << got << "\"";
  }
}

TEST(CheckBatch, ReferenceRestartFromAnEarlierPositionReproducesTheFirstRun) {
  // Positions 0..5, then a restart at 3 with the same tokens: the cache is truncated at 3, so
  // positions 3..5 give bitwise the logits of the first run.
  auto m = Model::load(test::tiny_model_dir());
  auto b = make_reference_backend(*m);
  const std::vector<int32_t> tokens = {5, 17, 300, 42, 999, 8};
  std::vector<StageData> first;
  for (int p = 0; p < 6; ++p) {
    forward(*b, Batch::single(tokens[size_t(p)], p));
    first.push_back(b->read(Stage::logits, kModelLayer, 0));
  }
  for (int p = 3; p < 6; ++p) {
    forward(*b, Batch::single(tokens[size_t(p)], p));
    EXPECT_EQ(b->read(Stage::logits, kModelLayer, 0).f64, first[size_t(p)].f64) << "position " << p;
  }
  EXPECT_THROW(forward(*b, Batch::single(1, 7)), Error);  // cached length is 6 again
}

}  // namespace
}  // namespace parity
