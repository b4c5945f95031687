// The tensor-parallel shard plan (device/runtime/shard_plan.h): the ranks of a group cover each
// split dimension exactly once, contiguously, and a rank's KV heads are those its query heads read.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/runtime/shard_plan.h"
#include "model/error.h"
#include "model/synth.h"

namespace parity::device {
namespace {

// The ranks' ranges of one dimension tile [0, n): in rank order, no gap, no overlap.
void expect_tiles(const std::vector<ShardRange>& ranges, int n, const std::string& what) {
  int at = 0;
  for (size_t r = 0; r < ranges.size(); ++r) {
    EXPECT_EQ(ranges[r].begin, at) << what << " rank " << r;
    EXPECT_GE(ranges[r].size(), 0) << what << " rank " << r;
    at = ranges[r].end;
  }
  EXPECT_EQ(at, n) << what;
}

TEST(ShardPlan, RanksTileEverySplitDimensionOfTheRealShapes) {
  for (const char* preset : {"tiny", "20b", "120b"}) {
    const Config c = synth_preset(preset).config;
    for (int degree : {1, 2, 4, 8}) {
      for (ExpertSplit split : {ExpertSplit::by_expert, ExpertSplit::by_intermediate}) {
        SCOPED_TRACE(std::string(preset) + " degree " + std::to_string(degree) + " " +
                     expert_split_name(split));
        if (!tensor_parallel_problem(c, degree, split).empty()) continue;  // tiny at 8
        std::vector<ShardRange> q, kv, qr, kr, vr, e, in, voc;
        for (int r = 0; r < degree; ++r) {
          const ShardPlan p = ShardPlan::of(c, degree, r, split);
          q.push_back(p.q_heads);
          kv.push_back(p.kv_heads);
          qr.push_back(p.q_rows);
          kr.push_back({p.k_rows.begin - c.q_dim(), p.k_rows.end - c.q_dim()});
          vr.push_back({p.v_rows.begin - c.q_dim() - c.kv_dim(), p.v_rows.end - c.q_dim() - c.kv_dim()});
          e.push_back(p.experts);
          in.push_back(p.intermediate);
          voc.push_back(p.vocab);
          EXPECT_EQ(p.o_proj_cols, p.q_rows);
          EXPECT_EQ(p.adds_reduced_bias(), r == 0);
          // The KV heads a rank holds are exactly those its query heads read.
          EXPECT_EQ(p.kv_heads.begin, p.q_heads.begin / c.heads_per_kv());
          EXPECT_EQ(p.kv_heads.end, (p.q_heads.end - 1) / c.heads_per_kv() + 1);
          if (split == ExpertSplit::by_intermediate) {
            EXPECT_EQ(p.intermediate.begin % kShardBlock, 0);  // whole MXFP4 blocks
            EXPECT_EQ(p.experts, (ShardRange{0, c.num_local_experts}));
            EXPECT_EQ(p.rank_of_expert(0), -1);
          } else {
            EXPECT_EQ(p.intermediate, (ShardRange{0, c.intermediate_size}));
            for (int x = p.experts.begin; x < p.experts.end; ++x) EXPECT_EQ(p.rank_of_expert(x), r);
          }
        }
        expect_tiles(q, c.num_attention_heads, "query heads");
        expect_tiles(kv, c.num_key_value_heads, "KV heads");
        expect_tiles(qr, c.q_dim(), "q rows");
        expect_tiles(kr, c.kv_dim(), "k rows");
        expect_tiles(vr, c.kv_dim(), "v rows");
        if (split == ExpertSplit::by_expert) expect_tiles(e, c.num_local_experts, "experts");
        else expect_tiles(in, c.intermediate_size, "intermediate");
        expect_tiles(voc, c.vocab_size, "vocabulary");
      }
    }
  }
}

TEST(ShardPlan, TheTwentyBAtFourSplitsItsIntermediateInUnevenWholeBlocks) {
  // 2880 = 90 blocks of 32: 23, 23, 22, 22 blocks.
  const Config c = synth_preset("20b").config;
  std::vector<int> sizes;
  for (int r = 0; r < 4; ++r)
    sizes.push_back(ShardPlan::of(c, 4, r, ExpertSplit::by_intermediate).intermediate.size());
  EXPECT_EQ(sizes, (std::vector<int>{736, 736, 704, 704}));
  // 64 query heads, 8 KV heads over 4: 16 and 2 each; rank 1's q rows start at head 16.
  const ShardPlan p = ShardPlan::of(c, 4, 1, ExpertSplit::by_expert);
  EXPECT_EQ(p.q_heads, (ShardRange{16, 32}));
  EXPECT_EQ(p.kv_heads, (ShardRange{2, 4}));
  EXPECT_EQ(p.q_rows, (ShardRange{16 * 64, 32 * 64}));
  EXPECT_EQ(p.experts, (ShardRange{8, 16}));
}

TEST(ShardPlan, ADegreeTheModelCannotTakeIsOneLineNamingWhatItDoesNotDivide) {
  const Config c = synth_preset("20b").config;  // 64 query heads, 8 KV heads, 32 experts
  const auto message = [&](int degree, ExpertSplit split) {
    try {
      ShardPlan::of(c, degree, 0, split);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(3, ExpertSplit::by_expert).find("does not divide the model's 64 query heads"),
            std::string::npos);
  EXPECT_NE(message(16, ExpertSplit::by_expert).find("does not divide the model's 8 KV heads"),
            std::string::npos);
  EXPECT_NE(message(0, ExpertSplit::by_expert).find("at least 1"), std::string::npos);
  EXPECT_NE(message(-2, ExpertSplit::by_intermediate).find("at least 1"), std::string::npos);
  Config odd = c;
  odd.num_local_experts = 6;
  odd.num_experts_per_tok = 4;
  EXPECT_NE(tensor_parallel_problem(odd, 4, ExpertSplit::by_expert).find("6 experts"),
            std::string::npos);
  EXPECT_EQ(tensor_parallel_problem(odd, 4, ExpertSplit::by_intermediate), "");
  Config narrow = c;
  narrow.intermediate_size = 64;  // two blocks
  EXPECT_NE(tensor_parallel_problem(narrow, 4, ExpertSplit::by_intermediate).find("fewer blocks"),
            std::string::npos);
  EXPECT_THROW(ShardPlan::of(c, 2, 2, ExpertSplit::by_expert), Error);
  EXPECT_THROW(expert_split_from_name("by-row"), Error);
  EXPECT_EQ(expert_split_from_name("by-intermediate"), ExpertSplit::by_intermediate);
}

TEST(ShardPlan, SplitRangeIsBalancedInUnits) {
  EXPECT_EQ(split_range(10, 3, 0), (ShardRange{0, 4}));
  EXPECT_EQ(split_range(10, 3, 1), (ShardRange{4, 7}));
  EXPECT_EQ(split_range(10, 3, 2), (ShardRange{7, 10}));
  // 70 in units of 32: 3 units (the last partial) over 2 parts.
  EXPECT_EQ(split_range(70, 2, 0, 32), (ShardRange{0, 64}));
  EXPECT_EQ(split_range(70, 2, 1, 32), (ShardRange{64, 70}));
  EXPECT_EQ(split_range(1, 4, 3), (ShardRange{1, 1}));  // more parts than elements: empty tail
}

// What a rank's runtime sizes itself by: its heads and its intermediate slice; the hidden size,
// the vocabulary (the sampler's full rows), the experts and the layers the model's. The ranks'
// slices add up to the model's.
TEST(ShardPlan, ARanksConfigIsItsHeadsAndItsIntermediateSlice) {
  const Config c = synth_preset("20b").config;
  int heads = 0, kv = 0, inter = 0;
  for (int r = 0; r < 4; ++r) {
    const ShardPlan p = ShardPlan::of(c, 4, r, ExpertSplit::by_intermediate);
    const Config rc = rank_config(c, p);
    EXPECT_EQ(rc.num_attention_heads, 16);
    EXPECT_EQ(rc.num_key_value_heads, 2);
    EXPECT_EQ(rc.heads_per_kv(), c.heads_per_kv());
    EXPECT_EQ(rc.intermediate_size, r < 2 ? 23 * 32 : 22 * 32) << r;  // 90 blocks over 4
    EXPECT_EQ(rc.hidden_size, c.hidden_size);
    EXPECT_EQ(rc.vocab_size, c.vocab_size);
    EXPECT_EQ(rc.num_local_experts, c.num_local_experts);
    EXPECT_EQ(rc.num_hidden_layers, c.num_hidden_layers);
    EXPECT_EQ(rc.head_dim, c.head_dim);
    heads += rc.num_attention_heads, kv += rc.num_key_value_heads, inter += rc.intermediate_size;
  }
  EXPECT_EQ(heads, c.num_attention_heads);
  EXPECT_EQ(kv, c.num_key_value_heads);
  EXPECT_EQ(inter, c.intermediate_size);
  // by_expert keeps every expert's whole intermediate dimension.
  EXPECT_EQ(rank_config(c, ShardPlan::of(c, 2, 1, ExpertSplit::by_expert)).intermediate_size,
            c.intermediate_size);
}

// The all-reduces' scratch, per rank: a step's partial sums or the vocabulary shards of the
// joined rows, whichever is larger (the largest shard: 1000 rows over 3 ranks hold 334).
TEST(ShardPlan, TheJoinScratchHoldsAStepsPartialSumsOrTheVocabularyShards) {
  Config c = synth_preset("tiny").config;
  c.vocab_size = 1000;
  EXPECT_EQ(shard_join_floats(c, 3, 8, 128), int64_t(128) * 334);
  EXPECT_EQ(shard_join_floats(c, 3, 4096, 128), int64_t(4096) * c.hidden_size);
  EXPECT_EQ(shard_join_floats(c, 1, 1, 1), int64_t(1000));
}

}  // namespace
}  // namespace parity::device
