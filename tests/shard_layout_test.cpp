// Where a tensor-parallel rank's row of each stage sits in the full row, and the gathering of a
// group's rows (device/runtime/shard_layout.h): every stage of the tiny and the 20b's shapes
// splits and gathers back to the same bits at degrees 1, 2 and 4 both ways of splitting the
// experts, and the bugs a sharded port makes -- a wrong shard offset, a rank computing too much,
// an all-reduce missing or doubled on one rank, an expert computed on the wrong rank, a replicated
// stage that drifts on one rank -- are refused or located with the rank named.
#include "device/runtime/shard_layout.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/error.h"
#include "model/synth.h"

namespace parity::device {
namespace {

constexpr int kPos = 7;

int64_t full_size(const Config& c, Stage s) {
  int64_t n = 1;
  for (const size_t d : stage_dims(c, s, kPos)) n *= int64_t(d);
  return n;
}

std::vector<float> random_row(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// k distinct experts.
std::vector<int32_t> choices(std::mt19937_64& rng, const Config& c) {
  std::vector<int32_t> all(size_t(c.num_local_experts));
  for (int e = 0; e < c.num_local_experts; ++e) all[size_t(e)] = e;
  std::shuffle(all.begin(), all.end(), rng);
  return {all.begin(), all.begin() + c.num_experts_per_tok};
}

// A group's rows of one stage built from the full row as the layouts say (the partial sums of
// the reduced and partial stages random, the full row their float64 sum rounded once).
struct Group {
  std::vector<StageShard> layouts;
  std::vector<std::vector<float>> rows, partials;
  std::vector<float> full;

  std::vector<RankRow> rank_rows() const {
    std::vector<RankRow> out;
    for (size_t r = 0; r < rows.size(); ++r)
      out.push_back({rows[r], partials.empty() ? std::span<const float>() : partials[r]});
    return out;
  }
  Gathered gather(Stage s) const {
    return gather_shards(s, layouts, rank_rows(), int64_t(full.size()));
  }
};

Group make_group(std::mt19937_64& rng, const Config& c, Stage s, int degree, ExpertSplit split,
                 const std::vector<int32_t>& topk) {
  Group g;
  const int64_t n = full_size(c, s);
  for (int r = 0; r < degree; ++r)
    g.layouts.push_back(stage_shard(s, c, ShardPlan::of(c, degree, r, split), topk, kPos));
  const ShardKind kind = g.layouts[0].kind;
  if (kind == ShardKind::reduced || kind == ShardKind::partial) {
    std::vector<double> sum(size_t(n), 0.0);
    for (int r = 0; r < degree; ++r) {
      g.partials.push_back(random_row(rng, n));
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += double(g.partials.back()[size_t(i)]);
    }
    for (const double v : sum) g.full.push_back(float(v));
    if (kind == ShardKind::reduced) {
      g.rows.assign(size_t(degree), g.full);
    } else {
      g.rows = g.partials;
      g.partials.clear();
    }
    return g;
  }
  g.full = random_row(rng, n);
  for (int r = 0; r < degree; ++r) {
    std::vector<float> row;
    if (kind == ShardKind::replicated) {
      row = g.full;
    } else {
      for (const ShardRange& range : g.layouts[size_t(r)].ranges)
        row.insert(row.end(), g.full.begin() + range.begin, g.full.begin() + range.end);
    }
    g.rows.push_back(std::move(row));
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ShardLayout, EveryStageSplitsAndGathersBackToTheSameBits) {
  std::mt19937_64 rng(11);
  for (const char* preset : {"tiny", "20b"}) {
    const Config c = synth_preset(preset).config;
    const std::vector<int32_t> topk = choices(rng, c);
    for (const int degree : {1, 2, 4})
      for (const ExpertSplit split : {ExpertSplit::by_expert, ExpertSplit::by_intermediate}) {
        if (!tensor_parallel_problem(c, degree, split).empty()) continue;
        for (const StageInfo& info : kStages) {
          SCOPED_TRACE(fmt::format("{} degree {} {} {}", preset, degree, expert_split_name(split),
                                   info.name));
          const Group g = make_group(rng, c, info.stage, degree, split, topk);
          const Gathered out = g.gather(info.stage);
          ASSERT_EQ(out.problem, "");
          EXPECT_TRUE(same_bits(out.row, g.full));
          if (g.layouts[0].kind != ShardKind::ranges) continue;
          // Each element is held by exactly the rank whose ranges hold it.
          for (int64_t i = 0; i < int64_t(g.full.size()); i += 7) {
            const int r = rank_holding(g.layouts, i);
            ASSERT_GE(r, 0) << i;
            bool in = false;
            for (const ShardRange& range : g.layouts[size_t(r)].ranges)
              in |= range.contains(int(i));
            EXPECT_TRUE(in) << i;
          }
        }
      }
  }
}

TEST(ShardLayout, TheStagesSplitAsThePlanSays) {
  const Config c = synth_preset("20b").config;  // 64 query heads, 8 KV heads of 64, 32 experts
  const ShardPlan p = ShardPlan::of(c, 4, 1, ExpertSplit::by_expert);
  const std::vector<int32_t> topk = {9, 3, 15, 8};  // rank 1 owns experts 8 .. 15
  EXPECT_EQ(stage_shard(Stage::attn_norm, c, p, {}, kPos).kind, ShardKind::replicated);
  EXPECT_EQ(stage_shard(Stage::o_proj, c, p, {}, kPos).kind, ShardKind::reduced);
  EXPECT_EQ(stage_shard(Stage::moe_out, c, p, {}, kPos).kind, ShardKind::reduced);
  const StageShard scores = stage_shard(Stage::scores, c, p, {}, kPos);
  ASSERT_EQ(scores.ranges.size(), 1u);
  EXPECT_EQ(scores.ranges[0], (ShardRange{16 * (kPos + 2), 32 * (kPos + 2)}));  // heads 16 .. 31
  const StageShard mlp1 = stage_shard(Stage::mlp1, c, p, topk, kPos);
  const int w = 2 * c.intermediate_size;
  EXPECT_EQ(mlp1.ranges, (std::vector<ShardRange>{{0, w}, {2 * w, 3 * w}, {3 * w, 4 * w}}));
  // by_intermediate: rank 1's columns of every slot; mlp2 is a partial sum.
  const ShardPlan q = ShardPlan::of(c, 4, 1, ExpertSplit::by_intermediate);
  const StageShard swiglu = stage_shard(Stage::swiglu, c, q, topk, kPos);
  ASSERT_EQ(swiglu.ranges.size(), 4u);
  EXPECT_EQ(swiglu.ranges[2],
            (ShardRange{2 * c.intermediate_size + 736, 2 * c.intermediate_size + 1472}));
  EXPECT_EQ(stage_shard(Stage::mlp2, c, q, topk, kPos).kind, ShardKind::partial);
  EXPECT_THROW(stage_shard(Stage::mlp2, c, p, {}, kPos), Error);  // the choices are needed
}

class ShardBugs : public ::testing::Test {
 protected:
  const Config c = synth_preset("20b").config;
  std::mt19937_64 rng{12};
  std::vector<int32_t> topk = {1, 9, 17, 25};  // one expert on each of four ranks
};

TEST_F(ShardBugs, AWrongShardOffsetIsLocatedOnItsRank) {
  Group g = make_group(rng, c, Stage::qkv, 4, ExpertSplit::by_expert, topk);
  // Rank 2 computes its q rows one head further on.
  const ShardRange q = g.layouts[2].ranges[0];
  for (int i = 0; i < q.size(); ++i)
    g.rows[2][size_t(i)] = g.full[size_t(q.begin + c.head_dim + i) % g.full.size()];
  const Gathered out = g.gather(Stage::qkv);
  ASSERT_EQ(out.problem, "");  // the sizes are right: the values are wrong
  int64_t first = -1;
  for (size_t i = 0; i < out.row.size() && first < 0; ++i)
    if (out.row[i] != g.full[i]) first = int64_t(i);
  EXPECT_EQ(first, q.begin);
  EXPECT_EQ(rank_holding(g.layouts, first), 2);
}

TEST_F(ShardBugs, ARankComputingMoreThanItsShardIsNamed) {
  Group g = make_group(rng, c, Stage::attn_out, 4, ExpertSplit::by_expert, topk);
  g.rows[3].resize(g.rows[3].size() + size_t(c.head_dim), 0.0f);  // one head too many
  const Gathered out = g.gather(Stage::attn_out);
  EXPECT_EQ(out.rank, 3);
  EXPECT_NE(out.problem.find("attn_out: rank 3's row holds"), std::string::npos) << out.problem;
}

TEST_F(ShardBugs, AnExpertComputedOnTheWrongRankIsNamed) {
  // Rank 0 also computes slot 1 (expert 9, rank 1's): its mlp1 row has a slot too many.
  Group g = make_group(rng, c, Stage::mlp1, 4, ExpertSplit::by_expert, topk);
  const int w = 2 * c.intermediate_size;
  g.rows[0].insert(g.rows[0].end(), g.full.begin() + w, g.full.begin() + 2 * w);
  const Gathered out = g.gather(Stage::mlp1);
  EXPECT_EQ(out.rank, 0);
  EXPECT_NE(out.problem.find("mlp1: rank 0's row holds"), std::string::npos) << out.problem;
  // An expert index outside the experts: no rank holds its slot.
  const std::vector<int32_t> bad = {1, 9, 17, 32};
  const Group h = make_group(rng, c, Stage::swiglu, 4, ExpertSplit::by_expert, bad);
  const Gathered none = h.gather(Stage::swiglu);
  EXPECT_EQ(none.rank, -1);
  EXPECT_NE(none.problem.find("no rank's shard holds element"), std::string::npos);
}

TEST_F(ShardBugs, AnAllReduceMissingOrDoubledOnOneRankIsNamed) {
  for (const int degree : {2, 4}) {
    SCOPED_TRACE(degree);
    Group g = make_group(rng, c, Stage::o_proj, degree, ExpertSplit::by_expert, topk);
    ASSERT_EQ(g.gather(Stage::o_proj).problem, "");
    Group missing = g;
    missing.rows[1] = missing.partials[1];  // rank 1 kept its partial sum
    Gathered out = missing.gather(Stage::o_proj);
    EXPECT_EQ(out.rank, 1);
    EXPECT_NE(out.problem.find("o_proj: rank 1's all-reduced element 0"), std::string::npos)
        << out.problem;
    Group doubled = g;
    const int last = degree - 1;
    for (float& v : doubled.rows[size_t(last)]) v *= 2.0f;  // the all-reduce ran twice there
    out = doubled.gather(Stage::o_proj);
    EXPECT_EQ(out.rank, last);
    Group short_of_one = g;  // every rank's all-reduce left out the last rank's partial sum
    for (auto& row : short_of_one.rows)
      for (size_t i = 0; i < row.size(); ++i) row[i] -= short_of_one.partials[size_t(last)][i];
    out = short_of_one.gather(Stage::o_proj);
    EXPECT_EQ(out.rank, 0);
    EXPECT_NE(out.problem.find("partial sums add to"), std::string::npos) << out.problem;
  }
}

TEST_F(ShardBugs, AllReducesThatDifferInBitsAreNamedAndRoundingIsNot) {
  Group g = make_group(rng, c, Stage::moe_out, 4, ExpertSplit::by_intermediate, topk);
  // The all-reduce's own rounding (a float32 sum in another order): within the bound, the same
  // bits on every rank -- accepted.
  for (size_t i = 0; i < g.full.size(); ++i) {
    float s = 0.0f;
    for (int r = 3; r >= 0; --r) s += g.partials[size_t(r)][i];
    for (auto& row : g.rows) row[i] = s;
  }
  EXPECT_EQ(g.gather(Stage::moe_out).problem, "");
  // One rank one unit in the last place away: named.
  g.rows[2][5] = std::nextafter(g.rows[2][5], INFINITY);
  const Gathered out = g.gather(Stage::moe_out);
  EXPECT_EQ(out.rank, 2);
  EXPECT_NE(out.problem.find("differ in bits"), std::string::npos) << out.problem;
  // NaN partial sums that reduce to NaN (an invalid expert index, visibly): accepted.
  Group nan = make_group(rng, c, Stage::moe_out, 2, ExpertSplit::by_expert, topk);
  nan.partials[0][3] = NAN;
  for (auto& row : nan.rows) row[3] = NAN;
  EXPECT_EQ(nan.gather(Stage::moe_out).problem, "");
}

TEST_F(ShardBugs, AReplicatedStageThatDriftsOnOneRankIsNamed) {
  Group g = make_group(rng, c, Stage::ffn_norm, 4, ExpertSplit::by_expert, topk);
  g.rows[2][100] = std::nextafter(g.rows[2][100], 0.0f);
  Gathered out = g.gather(Stage::ffn_norm);
  EXPECT_EQ(out.rank, 2);
  EXPECT_NE(out.problem.find("ffn_norm: rank 2's element 100"), std::string::npos) << out.problem;
  Group two = make_group(rng, c, Stage::router, 2, ExpertSplit::by_expert, topk);
  two.rows[1][4] += 1.0f;
  out = two.gather(Stage::router);
  EXPECT_EQ(out.rank, 1);  // two ranks: the second is named
}

}  // namespace
}  // namespace parity::device
