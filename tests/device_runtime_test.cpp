// The device runtime (device/runtime/). Its host logic -- the paged KV cache's block allocation,
// free list and sliding-window release, step building, the arena layout, the memory report's
// arithmetic, the options -- needs no GPU and runs everywhere (parity_device_host). The device
// parts (DeviceRuntime, the `hip` backend over it) run where a GPU is present and skip cleanly,
// with the reason, elsewhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/fusion.h"
#include "device/kernel_types.h"
#include "device/runtime/arena_layout.h"
#include "device/runtime/kv_blocks.h"
#include "device/runtime/memory_report.h"
#include "device/runtime/options.h"
#include "device/runtime/shard_plan.h"
#include "device/runtime/step_layout.h"
#include "device/runtime/weight_plan.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/synth.h"
#include "tests/test_util.h"

#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#include "device/runtime/runtime.h"
#include "device/stage_launch.h"
#include "model/forward.h"
#endif

namespace parity::device {
namespace {

using ::testing::HasSubstr;

Config tiny_config() {
  return synth_preset("tiny").config;  // 4 layers alternating sliding (window 8) and full
}

// Positions [first, first + n) of one sequence as one step.
Batch rows_of(int seq, int first, int n, int token = 1) {
  Batch b;
  for (int p = first; p < first + n; ++p) {
    b.tokens.push_back(token);
    b.positions.push_back(p);
    b.seqs.push_back(seq);
  }
  return b;
}

Batch join(const Batch& a, const Batch& b) {
  Batch j = a;
  j.tokens.insert(j.tokens.end(), b.tokens.begin(), b.tokens.end());
  j.positions.insert(j.positions.end(), b.positions.begin(), b.positions.end());
  j.seqs.insert(j.seqs.end(), b.seqs.begin(), b.seqs.end());
  return j;
}

int live(std::span<const int32_t> table) {
  return int(std::count_if(table.begin(), table.end(), [](int32_t b) { return b != kNoBlock; }));
}

// Every block of the pool is either free or held by exactly one (sequence, group, entry).
void expect_blocks_accounted(const KvBlockManager& kv, const std::vector<int>& seqs) {
  std::multiset<int32_t> held;
  for (int seq : seqs)
    for (int g = 0; g < kKvGroups; ++g)
      for (int32_t b : kv.table(seq, g))
        if (b != kNoBlock) {
          EXPECT_GE(b, 0);
          EXPECT_LT(b, kv.num_blocks());
          held.insert(b);
        }
  for (int32_t b : held) EXPECT_EQ(held.count(b), 1u) << "block " << b << " held twice";
  EXPECT_EQ(int(held.size()) + kv.free_blocks(), kv.num_blocks());
}

// ----------------------------------------------------------------------------- layout ---

TEST(KvLayout, GroupsLayersByAttentionKind) {
  const Config c = tiny_config();
  const KvLayout k = KvLayout::of(c, 4);
  EXPECT_EQ(k.block_size, 4);
  EXPECT_EQ(k.block_shift, 2);
  EXPECT_EQ(k.window, 8);
  EXPECT_EQ(k.layers_in_group[kKvFullGroup], 2);
  EXPECT_EQ(k.layers_in_group[kKvSlidingGroup], 2);
  EXPECT_EQ(k.slots, 2);
  EXPECT_EQ(k.group_of_layer, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(k.slot_of_layer, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(k.block_bytes(), size_t(2 * 2 * 4 * c.kv_dim() * 4));
  EXPECT_EQ(k.blocks_for(0), 0);
  EXPECT_EQ(k.blocks_for(4), 1);
  EXPECT_EQ(k.blocks_for(5), 2);
}

TEST(KvLayout, TwentyBBlockIsOneAndAHalfMiB) {
  const KvLayout k = KvLayout::of(synth_preset("20b").config, 32);
  // 12 layers x K,V x 32 positions x 8 KV heads x 64 x f32.
  EXPECT_EQ(k.block_bytes(), size_t(12 * 2 * 32 * 512 * 4));
  // A sequence of 4096 positions: 128 blocks of full layers, the window of 128 plus a step of 64
  // rows on sliding layers: ceil(191 / 32) + 1 = 7.
  EXPECT_EQ(k.blocks_per_sequence(4096, 64), 128 + 7);
}

TEST(KvLayout, TheBf16PrecisionsCacheIsBf16WhereItsAttentionReadsBf16) {
  // The 20b's heads (64 of 64 over 8 KV heads) take the bf16 precision's MMA attention: its
  // cache is BF16, a block half the bytes; the fp32 precision's stays float32.
  const Config c = synth_preset("20b").config;
  EXPECT_EQ(kv_cache_dtype(c, Precision::bf16), KvDtype::bf16);
  EXPECT_EQ(kv_cache_dtype(c, Precision::fp32), KvDtype::f32);
  const KvLayout f = KvLayout::of(c, 32), b = KvLayout::of(c, 32, KvDtype::bf16);
  EXPECT_EQ(b.block_elements(), f.block_elements());
  EXPECT_EQ(2 * b.block_bytes(), f.block_bytes());
  EXPECT_EQ(b.blocks_per_sequence(4096, 64), f.blocks_per_sequence(4096, 64));
  // Shapes the MMA attention does not take keep a float32 cache in either precision: a head of
  // 48, more than 8 query heads per KV head.
  Config odd = c;
  odd.head_dim = 48;
  EXPECT_EQ(kv_cache_dtype(odd, Precision::bf16), KvDtype::f32);
  odd = c;
  odd.num_key_value_heads = 4;  // 16 per KV head
  EXPECT_EQ(kv_cache_dtype(odd, Precision::bf16), KvDtype::f32);
  EXPECT_EQ(kv_dtype_name(KvDtype::bf16), "bf16");
  EXPECT_EQ(kv_dtype_name(KvDtype::f32), "f32");
}

TEST(KvLayout, ModelWithoutSlidingLayersHasOneGroup) {
  Config c = tiny_config();
  c.layer_is_sliding.assign(size_t(c.num_hidden_layers), false);
  const KvLayout k = KvLayout::of(c, 16);
  EXPECT_FALSE(k.has_group(kKvSlidingGroup));
  EXPECT_EQ(k.slots, 4);
  EXPECT_EQ(k.window, 0);
  EXPECT_EQ(k.blocks_per_sequence(100, 8), 7);
}

TEST(KvLayout, RejectsBlockSizesThatAreNotPowersOfTwo) {
  for (int b : {0, 3, 24, -4, 1 << 17}) EXPECT_THROW(KvLayout::of(tiny_config(), b), Error) << b;
}

// ----------------------------------------------------------------- block allocation ---

TEST(KvBlockManager, AllocatesBlocksAsASequenceGrows) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 4), 64, 256);
  EXPECT_EQ(kv.free_blocks(), 64);
  kv.begin_step(rows_of(0, 0, 1), c);  // position 0: one block per group
  EXPECT_EQ(kv.length(0), 1);
  EXPECT_EQ(kv.table(0, kKvFullGroup).size(), 1u);
  EXPECT_EQ(kv.table(0, kKvSlidingGroup).size(), 1u);
  EXPECT_EQ(kv.free_blocks(), 62);
  for (int p = 1; p < 4; ++p) kv.begin_step(rows_of(0, p, 1), c);  // the same blocks
  EXPECT_EQ(kv.free_blocks(), 62);
  kv.begin_step(rows_of(0, 4, 1), c);  // position 4 opens the second block of each group
  EXPECT_EQ(kv.free_blocks(), 60);
  EXPECT_EQ(kv.table(0, kKvFullGroup).size(), 2u);
  expect_blocks_accounted(kv, {0});
}

TEST(KvBlockManager, FreeListHandsOutTheLowestBlocksFirstAndReusesReleasedOnes) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 4), 16, 256);
  kv.begin_step(rows_of(0, 0, 8), c);  // two blocks per group
  const auto full0 =
      std::vector<int32_t>(kv.table(0, kKvFullGroup).begin(), kv.table(0, kKvFullGroup).end());
  std::vector<int32_t> all;
  for (int g = 0; g < kKvGroups; ++g)
    for (int32_t b : kv.table(0, g)) all.push_back(b);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3}));
  kv.release(0);
  EXPECT_EQ(kv.free_blocks(), 16);
  EXPECT_EQ(kv.sequences(), 0);
  EXPECT_EQ(kv.length(0), 0);
  kv.begin_step(rows_of(7, 0, 8), c);  // sequence 7 takes the released blocks again
  all.clear();
  for (int g = 0; g < kKvGroups; ++g)
    for (int32_t b : kv.table(7, g)) all.push_back(b);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3}));
  kv.clear();
  EXPECT_EQ(kv.free_blocks(), 16);
  kv.begin_step(rows_of(0, 0, 8), c);  // after clear() the same placement as the first time
  EXPECT_EQ(
      std::vector<int32_t>(kv.table(0, kKvFullGroup).begin(), kv.table(0, kKvFullGroup).end()),
      full0);
}

TEST(KvBlockManager, SequencesNeverShareABlock) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 2), 200, 256);
  for (int p = 0; p < 30; ++p) {
    Batch b = join(rows_of(0, p, 1), rows_of(1, 2 * p, 2));
    if (p % 3 == 0) b = join(b, rows_of(2, p / 3, 1));
    kv.begin_step(b, c);
    expect_blocks_accounted(kv, {0, 1, 2});
  }
}

TEST(KvBlockManager, SlidingLayersReleaseTheBlocksThatLeaveTheWindow) {
  const Config c = tiny_config();  // window 8
  KvBlockManager kv(KvLayout::of(c, 4), 64, 256);
  for (int p = 0; p <= 40; ++p) kv.begin_step(rows_of(0, p, 1), c);
  // Full layers keep all 41 positions: 11 blocks.
  EXPECT_EQ(live(kv.table(0, kKvFullGroup)), 11);
  // The step at 40 reads keys 33..40: blocks 8..10; 0..7 were released.
  const auto sliding = kv.table(0, kKvSlidingGroup);
  ASSERT_EQ(sliding.size(), 11u);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(sliding[size_t(b)], kNoBlock) << b;
  for (int b = 8; b < 11; ++b) EXPECT_NE(sliding[size_t(b)], kNoBlock) << b;
  EXPECT_EQ(kv.free_blocks(), 64 - 11 - 3);
  expect_blocks_accounted(kv, {0});
}

TEST(KvBlockManager, ReleasedWindowBlocksServeOtherSequences) {
  const Config c = tiny_config();
  const KvLayout layout = KvLayout::of(c, 4);
  // Exactly what one sequence of 64 positions holds at most, decoding one row per step.
  const int per_seq = layout.blocks_per_sequence(64, 1);
  KvBlockManager kv(layout, per_seq, 64);
  for (int p = 0; p < 64; ++p) kv.begin_step(rows_of(0, p, 1), c);
  EXPECT_LE(kv.blocks_held(0), per_seq);
  EXPECT_GT(kv.free_blocks(), 0);  // sliding blocks came back
  expect_blocks_accounted(kv, {0});
}

TEST(KvBlockManager, BlocksPerSequenceBoundsWhatASequenceHolds) {
  for (int block : {1, 4, 8, 32})
    for (int rows : {1, 3, 8, 20}) {
      const Config c = tiny_config();
      const KvLayout layout = KvLayout::of(c, block);
      const int max_context = 200;
      const int bound = layout.blocks_per_sequence(max_context, rows);
      KvBlockManager kv(layout, bound, max_context);
      int most = 0;
      for (int p = 0; p < max_context; p += rows) {
        kv.begin_step(rows_of(0, p, std::min(rows, max_context - p)), c);  // never exhausted
        most = std::max(most, kv.blocks_held(0));
      }
      EXPECT_LE(most, bound) << "block " << block << ", rows " << rows;
    }
}

TEST(KvBlockManager, RestartInsideTheWindowTruncatesAndBehindItIsRefused) {
  const Config c = tiny_config();  // window 8
  KvBlockManager kv(KvLayout::of(c, 4), 64, 256);
  for (int p = 0; p < 33; ++p) kv.begin_step(rows_of(0, p, 1), c);  // blocks 0..8
  const int free_before = kv.free_blocks();
  // Restarting at 31 reads keys 24..30 (blocks 6, 7): still there. The tail block 8 of each
  // group is given back.
  kv.begin_step(rows_of(0, 31, 1), c);
  EXPECT_EQ(kv.length(0), 32);
  EXPECT_EQ(kv.table(0, kKvFullGroup).size(), 8u);
  EXPECT_EQ(kv.free_blocks(), free_before + 2);
  expect_blocks_accounted(kv, {0});
  // Restarting at 30 needs key 23 (block 5), released when the step at 32 moved past it, and at
  // 5 keys from 0: refused, nothing changes.
  const auto sliding = std::vector<int32_t>(kv.table(0, kKvSlidingGroup).begin(),
                                            kv.table(0, kKvSlidingGroup).end());
  const int free_now = kv.free_blocks();
  for (int restart : {30, 5}) {
    try {
      kv.begin_step(rows_of(0, restart, 1), c);
      ADD_FAILURE() << "a restart at " << restart << " behind the released window was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("released"));
    }
  }
  EXPECT_EQ(kv.length(0), 32);
  EXPECT_EQ(kv.free_blocks(), free_now);
  EXPECT_EQ(std::vector<int32_t>(kv.table(0, kKvSlidingGroup).begin(),
                                 kv.table(0, kKvSlidingGroup).end()),
            sliding);
}

TEST(KvBlockManager, AnExhaustedPoolRefusesTheWholeStepAndChangesNothing) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 4), 6, 256);
  kv.begin_step(rows_of(0, 0, 8), c);  // 4 blocks
  EXPECT_EQ(kv.free_blocks(), 2);
  // Sequence 0 grows by a block per group (2) and sequence 1 needs 2 more: 4 > 2 free.
  try {
    kv.begin_step(join(rows_of(0, 8, 1), rows_of(1, 0, 1)), c);
    ADD_FAILURE() << "an exhausted pool was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("exhausted"));
    EXPECT_THAT(e.what(), HasSubstr("needs 4 new blocks"));
  }
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_EQ(kv.length(0), 8);
  EXPECT_EQ(kv.length(1), 0);
  EXPECT_EQ(kv.sequences(), 1);
  kv.begin_step(rows_of(0, 8, 1), c);  // alone it fits
  EXPECT_EQ(kv.free_blocks(), 0);
}

TEST(KvBlockManager, AnInvalidBatchChangesNothing) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 4), 16, 32);
  kv.begin_step(rows_of(0, 0, 3), c);
  EXPECT_THROW(kv.begin_step(rows_of(0, 5, 1), c), Error);                // gap
  EXPECT_THROW(kv.begin_step(rows_of(0, 3, 1, c.vocab_size), c), Error);  // token id
  EXPECT_THROW(kv.begin_step(rows_of(0, 3, 30), c), Error);               // past max_context
  EXPECT_EQ(kv.length(0), 3);
  EXPECT_EQ(kv.free_blocks(), 14);
}

TEST(KvBlockManager, AppendAndReleasePerSequence) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 8), 32, 128);
  kv.append(3, 0, 20);  // a prefill of 20 positions: 3 blocks per group
  EXPECT_EQ(kv.length(3), 20);
  EXPECT_EQ(kv.blocks_held(3), 6);
  kv.append(3, 20, 21);
  EXPECT_EQ(kv.length(3), 21);
  EXPECT_THROW(kv.append(3, 25, 26), Error);  // not contiguous
  EXPECT_THROW(kv.append(4, 0, 129), Error);  // past max_context
  kv.release(3);
  EXPECT_EQ(kv.free_blocks(), 32);
  kv.release(3);  // unknown: nothing
  EXPECT_EQ(kv.free_blocks(), 32);
}

// The kernels' address arithmetic (kv_row_offset) over the manager's tables: every
// (sequence, layer, position, K or V) row has its own place inside the pool.
TEST(KvBlockManager, EveryCachedRowHasItsOwnPlaceInThePool) {
  const Config c = tiny_config();
  const KvLayout layout = KvLayout::of(c, 4);
  KvBlockManager kv(layout, 40, 64);
  for (int p = 0; p < 20; ++p) kv.begin_step(join(rows_of(0, p, 1), rows_of(1, p, 1)), c);
  std::set<int64_t> seen;
  const int64_t pool_floats = int64_t(kv.num_blocks()) * int64_t(layout.block_elements());
  for (int seq : {0, 1})
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const int g = layout.group_of_layer[size_t(l)];
      const auto table = kv.table(seq, g);
      const KvCacheView view{nullptr, table.data(), layout.block_shift, layout.slots};
      const int first = g == kKvSlidingGroup ? 19 - layout.window + 1 : 0;  // what step 19 reads
      for (int j = first; j < 20; ++j)
        for (int which : {0, 1}) {
          const int64_t at = kv_row_offset(view, table.data(), layout.slot_of_layer[size_t(l)],
                                           which, j, layout.kv_dim);
          EXPECT_GE(at, 0);
          EXPECT_LE(at + layout.kv_dim, pool_floats);
          EXPECT_EQ(at % layout.kv_dim, 0);
          EXPECT_TRUE(seen.insert(at).second) << "seq " << seq << " layer " << l << " pos " << j;
        }
    }
}

// ------------------------------------------------------------------------------- step ---

TEST(StepLayout, RowsPointAtTheirSequencesTablesAndPackedScores) {
  const Config c = tiny_config();
  KvBlockManager kv(KvLayout::of(c, 4), 64, 256);
  kv.begin_step(rows_of(1, 0, 5), c);
  const Batch b = join(rows_of(1, 5, 2, 7), rows_of(0, 0, 3, 9));
  kv.begin_step(b, c);
  const StepLayout s = build_step(b, c, kv);
  ASSERT_EQ(s.rows.size(), 5u);
  EXPECT_EQ(s.max_pos, 6);
  int64_t at = 0;
  for (size_t r = 0; r < s.rows.size(); ++r) {
    const StepRow& row = s.rows[r];
    EXPECT_EQ(row.token, b.tokens[r]);
    EXPECT_EQ(row.pos, b.positions[r]);
    EXPECT_EQ(row.seq, b.seqs[r]);
    EXPECT_EQ(row.scores_offset, at);
    at += int64_t(c.num_attention_heads) * (row.pos + 2);
    for (int g = 0; g < kKvGroups; ++g) {
      const auto want = kv.table(row.seq, g);
      ASSERT_LE(size_t(row.kv_table[g]) + want.size(), s.block_tables.size());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), s.block_tables.begin() + row.kv_table[g]))
          << "row " << r << " group " << g;
    }
  }
  EXPECT_EQ(s.scores_floats, at);
  // Rows of one sequence share its tables; the two sequences' tables are apart.
  EXPECT_EQ(s.rows[0].kv_table[0], s.rows[1].kv_table[0]);
  EXPECT_NE(s.rows[0].kv_table[0], s.rows[2].kv_table[0]);
  // Each sequence once: 2 sequences x 2 groups x (blocks for its length).
  EXPECT_EQ(s.block_tables.size(), size_t(2 * 2 + 2 * 1));
}

TEST(StepLayout, QueryTilesAreRunsOfOneSequenceAtMostATileLong) {
  std::vector<StepRow> rows(21);
  for (size_t r = 0; r < rows.size(); ++r) rows[r].seq = r < 3 ? 7 : r < 4 ? 2 : 9;
  // 3 rows of sequence 7, 1 of 2, then 17 of 9 in tiles of 8, 8 and 1.
  static_assert(kQueryTileRows == 8);
  EXPECT_EQ(query_tiles(rows), (std::vector<int32_t>{0, 3, 4, 12, 20, 21}));
  EXPECT_EQ(query_tiles({}), std::vector<int32_t>{0});
  // A sequence's rows apart in the batch are tiles apart.
  rows.resize(3);
  rows[0].seq = rows[2].seq = 1;
  rows[1].seq = 2;
  EXPECT_EQ(query_tiles(rows), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(StepLayout, LeadingSingleTilesAreTheDecodeRowsAhead) {
  // Tile t < singles is row t: a decode step's every row, a mixed step's decode rows ahead.
  const std::vector<int32_t> decode{0, 1, 2, 3}, mixed{0, 1, 2, 10, 11, 14}, prefill{0, 8, 9};
  EXPECT_EQ(leading_single_tiles(decode.data(), 3), 3);
  EXPECT_EQ(leading_single_tiles(mixed.data(), 5), 2);  // the tile of row 10 is not ahead
  EXPECT_EQ(leading_single_tiles(prefill.data(), 2), 0);
  EXPECT_EQ(leading_single_tiles(decode.data(), 0), 0);
}

TEST(StepLayout, RowsAreThirtyTwoBytesForTheKernels) {
  EXPECT_EQ(sizeof(StepRow), 32u);
  EXPECT_EQ(offsetof(StepRow, scores_offset) % 8, 0u);
}

// ------------------------------------------------------------------------------ arena ---

// The fusion table (device/fusion.h): the stages the engine leaves out of its launch sequence,
// and what makes a covered part stale, checked against the stage graph.
TEST(Fusion, TheEngineLaunchesNothingForTheStagesAnEarlierKernelWritesWhole) {
  std::set<Stage> whole;
  for (const auto& s : kStages)
    if (fused_into_producer(s.stage)) whole.insert(s.stage);
  EXPECT_EQ(whole, (std::set<Stage>{Stage::k_rope, Stage::v, Stage::resid_attn, Stage::topk_idx,
                                    Stage::topk_w, Stage::swiglu, Stage::resid_ffn}));
  // Covered at decode only, or only in part: they launch their own kernels otherwise.
  for (Stage s : {Stage::scores, Stage::att, Stage::attn_out}) {
    ASSERT_NE(fusion_of(s), nullptr) << name(s);
    EXPECT_FALSE(fused_into_producer(s)) << name(s);
  }
  EXPECT_EQ(fusion_of(Stage::qkv), nullptr);
  EXPECT_EQ(fusion_of(Stage::mlp2), nullptr);
}

TEST(Fusion, ProducersRunEarlierInTheLayerAndStalenessFollowsTheGraphsInputs) {
  const auto order = [](Stage s) { return int(s); };  // the stage list is execution order
  for (const Fusion& f : fusions()) {
    SCOPED_TRACE(name(f.covered));
    EXPECT_NE(info(f.covered).scope, Scope::Model);
    EXPECT_NE(info(f.producer).scope, Scope::Model);
    EXPECT_LT(order(f.producer), order(f.covered));
    EXPECT_EQ(fusion_of(f.covered), &f);  // one entry per covered stage
    // What makes the covered part stale is what it is computed from: an input of the covered
    // stage, or an input of another stage the same kernel covers (attn_out from att from
    // scores).
    std::set<Stage> from;
    for (const Fusion& g : fusions())
      if (g.producer == f.producer && order(g.covered) <= order(f.covered))
        for (const StageInput& in : info(g.covered).inputs)
          if (in.kind == InputKind::stage || in.kind == InputKind::append) from.insert(in.stage);
    for (Stage w : f.recompute_when) EXPECT_TRUE(from.count(w)) << name(w);
  }
  const auto overwritten = [](std::set<Stage> written) {
    return [written](Stage s) { return written.count(s) > 0; };
  };
  EXPECT_TRUE(covered_part_stale(Stage::scores, overwritten({Stage::v})));
  EXPECT_FALSE(covered_part_stale(Stage::scores, overwritten({Stage::q_rope})));
  EXPECT_TRUE(covered_part_stale(Stage::attn_out, overwritten({Stage::scores})));
  EXPECT_TRUE(covered_part_stale(Stage::resid_ffn, overwritten({Stage::moe_out})));
  EXPECT_FALSE(covered_part_stale(Stage::k_rope, overwritten({Stage::qkv, Stage::q_rope})));
  EXPECT_FALSE(covered_part_stale(Stage::mlp2, overwritten({Stage::swiglu})));
}

TEST(ArenaLayout, StagesAreAlignedAndApart) {
  const Config c = tiny_config();
  const ArenaLayout a = ArenaLayout::of(c, 7, 512);
  size_t end = 0;
  for (const auto& s : kStages) {
    if (s.shape == Shape::keys) continue;
    const size_t off = a.stage_offset[size_t(s.stage)];
    EXPECT_EQ(off % 256, 0u) << name(s.stage);
    EXPECT_GE(off, end) << name(s.stage);
    end = off + 7 * stage_row_floats(c, s.stage) * sizeof(float);
  }
  // The scratches after the stages, apart: routing, router tickets (one per row), the sampled
  // rows gathered (rows x hidden), the split of the row-sized inputs, then mlp2's (rows x k x
  // intermediate), then the attention workspace.
  EXPECT_GE(a.moe_routing_offset, end);
  EXPECT_GE(a.router_tickets_offset, a.moe_routing_offset + a.moe_routing_ints * 4);
  EXPECT_EQ(a.router_tickets, 7u);
  EXPECT_GE(a.sampled_rows_offset, a.router_tickets_offset + a.router_tickets * 4);
  EXPECT_GE(a.split_offset, a.sampled_rows_offset + size_t(7) * size_t(c.hidden_size) * 4);
  EXPECT_EQ(a.split_words, size_t(7) *
                               std::max(size_t(c.hidden_size),
                                        size_t(c.num_attention_heads) * size_t(c.head_dim)) *
                               3 / 2);
  EXPECT_GE(a.expert_split_offset, a.split_offset + a.split_words * 4);
  EXPECT_EQ(a.expert_split_words,
            size_t(7) * size_t(c.num_experts_per_tok) * size_t(c.intermediate_size) * 3 / 2);
  EXPECT_GE(a.workspace_offset, a.expert_split_offset + a.expert_split_words * 4);
  for (size_t off : {a.moe_routing_offset, a.router_tickets_offset, a.sampled_rows_offset,
                     a.split_offset, a.expert_split_offset, a.workspace_offset})
    EXPECT_EQ(off % 256, 0u);
  AttentionShape shape;
  shape.n_heads = c.num_attention_heads;
  shape.n_kv = c.num_key_value_heads;
  shape.head_dim = c.head_dim;
  shape.max_context = 512;
  EXPECT_EQ(a.bytes, a.workspace_offset + attention_workspace_floats(shape, 7) * sizeof(float));
  EXPECT_GT(ArenaLayout::of(c, 64, 512).bytes, a.bytes);
}

TEST(ArenaLayout, SplitKeysBoundTheWorkspace) {
  EXPECT_EQ(attention_split_keys(1), 256);
  EXPECT_EQ(attention_split_keys(4096), 256);
  EXPECT_EQ(attention_split_keys(131072), 2048);
  AttentionShape a;
  a.n_heads = 64;
  a.head_dim = 64;
  a.max_context = 4096;
  a.n_kv = 8;
  // The bf16 decode partials of every key tile (64 of 64 keys) outweigh the float32 split sums
  // (16 of 256 keys), whatever the window (the arena is sized for full attention) ...
  EXPECT_EQ(attention_workspace_floats(a, 2), size_t(2 * 64 * 64 * 66));
  a.window = 128;
  EXPECT_EQ(attention_workspace_floats(a, 2), size_t(2 * 64 * 64 * 66));
  EXPECT_EQ(attention_partials_floats(a, 2, 4095), size_t(2 * 64 * 3 * 66));
  // ... up to their cap; beyond it the split sums are what the workspace holds.
  EXPECT_EQ(attention_workspace_floats(a, 300), kAttentionPartialsMaxFloats);
  EXPECT_EQ(attention_workspace_floats(a, 2000), size_t(2000 * 16 * 64 * 64));
}

TEST(ArenaLayout, KeyTilesOfTheWindow) {
  // Tiles of 64 keys at fixed offsets: every tile up to the position's, or as many as the
  // window's keys can straddle.
  EXPECT_EQ(attention_key_tiles(0, 0), 1);
  EXPECT_EQ(attention_key_tiles(63, 0), 1);
  EXPECT_EQ(attention_key_tiles(64, 0), 2);
  EXPECT_EQ(attention_key_tiles(4095, 0), 64);
  EXPECT_EQ(attention_key_tiles(4095, 128), 3);
  EXPECT_EQ(attention_key_tiles(100, 128), 2);
  EXPECT_EQ(attention_key_tiles(4095, 64), 2);
  EXPECT_EQ(attention_key_tiles(4095, 65), 2);
  EXPECT_EQ(attention_key_tiles(4095, 66), 3);
  EXPECT_EQ(attention_key_tiles(4095, 1), 1);
  // Brute force: the tiles a window's keys touch at every start never exceed the bound.
  for (int w = 1; w <= 200; ++w)
    for (int first = 0; first < 128; ++first) {
      const int last = first + w - 1;
      EXPECT_LE(last / 64 - first / 64 + 1, attention_key_tiles(last, w)) << w << " " << first;
    }
}

// ------------------------------------------------------------------------ weight plan ---

// MXFP4 experts go to the device packed for the MMA kernel (Mxfp4Packing): rows padded to tiles
// of 16, blocks to chunks of two; shapes already whole (the 20b's, the tiny model's) keep their
// size, so the device footprint of the real models does not change.
TEST(WeightPlan, PacksMxfp4ExpertsIntoWholeTilesAndChunks) {
  const Mxfp4Packing odd(33, 96);  // 3 row tiles, 3 blocks -> 2 chunks
  EXPECT_EQ(odd.row_tiles, 3);
  EXPECT_EQ(odd.chunks, 2);
  EXPECT_EQ(odd.block_bytes(2), 2 * 3 * 2 * 512);
  EXPECT_EQ(odd.scale_bytes(2), 2 * 3 * 2 * 32);
  for (const auto& [out, in] : {std::pair{5760, 2880}, std::pair{2880, 2880}}) {
    const Mxfp4Packing pk(out, in);  // the 20b's and 120b's gate_up and down
    EXPECT_EQ(pk.block_bytes(32), int64_t(32) * out * (in / 32) * 16);
    EXPECT_EQ(pk.scale_bytes(32), int64_t(32) * out * (in / 32));
  }
  const auto model = Model::load(test::tiny_model_dir());
  const WeightPlan plan = plan_weights(*model);
  int packed = 0;
  for (const auto& l : model->layers)
    for (const ExpertLinear* w : {&l.mlp1, &l.mlp2}) {
      const WeightEntry& b = plan.find(w->blocks);
      const WeightEntry& sc = plan.find(w->scales);
      EXPECT_EQ(b.pack, WeightEntry::Pack::mxfp4_blocks);
      EXPECT_EQ(sc.pack, WeightEntry::Pack::mxfp4_scales);
      const Mxfp4Packing pk(w->out, w->in);
      EXPECT_EQ(b.bytes, size_t(pk.block_bytes(w->experts)));
      EXPECT_EQ(sc.bytes, size_t(pk.scale_bytes(w->experts)));
      EXPECT_EQ(b.bytes, w->blocks->nbytes);  // the tiny model's shapes are whole tiles
      EXPECT_EQ(b.experts, w->experts);
      EXPECT_EQ(b.offset % 256, 0u);
      packed += 2;
    }
  EXPECT_EQ(packed, 4 * model->config.num_hidden_layers);
  EXPECT_EQ(plan.find(model->lm_head.weight).pack, WeightEntry::Pack::none);
}

// One rank's part of each tensor under tensor parallelism (plan_weights with a ShardPlan), on the
// tiny model (4 query heads, 2 KV heads, 8 experts, intermediate 64: two MXFP4 blocks) split over
// two ranks both ways: each split tensor's bytes are held exactly once between the ranks, each
// replicated one by every rank; the ranks' slices tile the split dimension; the sizes are those of
// the shard plan's ranges; a group of one holds what the unsharded plan holds.
TEST(WeightPlan, ShardsHoldEverySplitTensorOnceAndTheRestOnEveryRank) {
  const auto model = Model::load(test::tiny_model_dir());
  const Config& c = model->config;
  const WeightPlan one = plan_weights(*model);
  for (const ExpertSplit split : {ExpertSplit::by_expert, ExpertSplit::by_intermediate}) {
    SCOPED_TRACE(expert_split_name(split));
    const WeightPlan alone = plan_weights(*model, ShardPlan::of(c, 1, 0, split));
    ASSERT_EQ(alone.entries.size(), one.entries.size());
    EXPECT_EQ(alone.total, one.total);
    for (size_t i = 0; i < one.entries.size(); ++i) {
      EXPECT_EQ(alone.entries[i].tensor, one.entries[i].tensor);
      EXPECT_EQ(alone.entries[i].bytes, one.entries[i].bytes) << one.entries[i].tensor->name;
      EXPECT_EQ(alone.entries[i].offset, one.entries[i].offset) << one.entries[i].tensor->name;
      EXPECT_EQ(alone.entries[i].slice, one.entries[i].slice) << one.entries[i].tensor->name;
    }

    constexpr int kDegree = 2;
    std::vector<ShardPlan> shards;
    std::vector<WeightPlan> plans;
    for (int r = 0; r < kDegree; ++r) {
      shards.push_back(ShardPlan::of(c, kDegree, r, split));
      plans.push_back(plan_weights(*model, shards.back()));
      ASSERT_EQ(plans.back().entries.size(), one.entries.size());
      EXPECT_LT(plans.back().total, one.total);
    }
    // The tensors every rank holds whole; mlp2's packed blocks and scales.
    std::set<const TensorView*> replicated = {model->embed, model->final_norm}, mlp2_packed;
    for (const LayerWeights& l : model->layers) {
      replicated.insert({l.attn_norm, l.ffn_norm, l.router.weight, l.router.bias, l.o.bias});
      if (split == ExpertSplit::by_intermediate) replicated.insert(l.mlp2.bias);
      mlp2_packed.insert({l.mlp2.blocks, l.mlp2.scales});
    }
    int split_tensors = 0;
    for (size_t i = 0; i < one.entries.size(); ++i) {
      const WeightEntry& whole = one.entries[i];
      const std::string& name = whole.tensor->name;
      size_t sum = 0;
      std::vector<WeightSlice> slices;
      for (const WeightPlan& p : plans) {
        EXPECT_EQ(p.entries[i].tensor, whole.tensor);
        sum += p.entries[i].bytes;
        slices.push_back(p.entries[i].slice);
      }
      if (replicated.count(whole.tensor) != 0) {
        EXPECT_EQ(slices[0], whole.slice) << name;
        EXPECT_EQ(slices[1], whole.slice) << name;
        EXPECT_EQ(sum, kDegree * whole.bytes) << name << ": replicated";
        continue;
      }
      // A split tensor: the ranks' slices tile the one dimension they split, in rank order.
      ++split_tensors;
      int dims_split = 0;
      for (const auto member : {&WeightSlice::experts, &WeightSlice::rows, &WeightSlice::cols}) {
        if (slices[0].*member == slices[1].*member) {
          EXPECT_EQ(slices[0].*member, whole.slice.*member) << name;
          continue;
        }
        ++dims_split;
        EXPECT_EQ((slices[0].*member).begin, (whole.slice.*member).begin) << name;
        EXPECT_EQ((slices[0].*member).end, (slices[1].*member).begin) << name;
        EXPECT_EQ((slices[1].*member).end, (whole.slice.*member).end) << name;
      }
      EXPECT_EQ(dims_split, 1) << name;
      // Packed MXFP4 pads each rank's slice to whole row tiles and chunks of two blocks: mlp2's
      // input split by_intermediate gives each rank one block of 32 here, padded to a chunk.
      if (whole.pack == WeightEntry::Pack::none)
        EXPECT_EQ(sum, whole.bytes) << name << ": split";
      else if (split == ExpertSplit::by_intermediate && mlp2_packed.count(whole.tensor) != 0)
        EXPECT_EQ(sum, 2 * whole.bytes) << name << ": split, each rank's block padded";
      else
        EXPECT_EQ(sum, whole.bytes) << name << ": split in whole tiles and chunks";
    }
    // Per layer q, k and v with their biases, o_proj, the sinks, mlp1 and mlp2 (blocks and scales
    // each), mlp1's bias, and mlp2's by_expert; and lm_head.
    EXPECT_EQ(split_tensors, c.num_hidden_layers * (3 * 2 + 1 + 1 + 2 + 2 + 1 +
                                                    (split == ExpertSplit::by_expert ? 1 : 0)) +
                                 1);

    // The sizes follow the shard plan's ranges.
    const LayerWeights& l = model->layers[1];
    for (int r = 0; r < kDegree; ++r) {
      const ShardPlan& s = shards[size_t(r)];
      const WeightPlan& p = plans[size_t(r)];
      EXPECT_EQ(p.find(l.q.weight).bytes, size_t(s.q_rows.size()) * c.hidden_size * 2);
      EXPECT_EQ(p.find(l.k.bias).bytes, size_t(s.k_rows.size()) * sizeof(float));
      EXPECT_EQ(p.find(l.o.weight).slice.cols, s.o_proj_cols);
      EXPECT_EQ(p.find(l.sinks).bytes, size_t(s.q_heads.size()) * sizeof(float));
      EXPECT_EQ(p.find(model->lm_head.weight).bytes, size_t(s.vocab.size()) * c.hidden_size * 2);
      const WeightEntry& b1 = p.find(l.mlp1.blocks);
      const WeightEntry& b2 = p.find(l.mlp2.blocks);
      EXPECT_EQ(b1.experts, s.experts.size());
      EXPECT_EQ(b1.out, 2 * s.intermediate.size());
      EXPECT_EQ(b2.in, s.intermediate.size());
      EXPECT_EQ(b1.bytes, size_t(Mxfp4Packing(b1.out, b1.in).block_bytes(b1.experts)));
      EXPECT_EQ(p.find(l.mlp2.scales).bytes,
                size_t(Mxfp4Packing(b2.out, b2.in).scale_bytes(b2.experts)));
    }
  }
}

// ---------------------------------------------------------------------- memory report ---

WeightPlan weights_of(size_t bytes) {
  WeightPlan w;
  w.total = bytes;
  w.bytes_by_kind["BF16"] = bytes;
  return w;
}

constexpr size_t kGiB = size_t(1) << 30;
constexpr size_t kMiB = size_t(1) << 20;

TEST(MemoryReport, KvPoolFromAByteBudget) {
  const Config c = synth_preset("20b").config;
  DeviceOptions o;
  o.kv_bytes = 100 * kMiB + 5;
  const MemoryReport r =
      MemoryReport::plan(o, c, 4096, weights_of(13 * kGiB), "GPU (x)", 70 * kGiB, 80 * kGiB);
  EXPECT_EQ(r.kv.block_bytes(), size_t(1536) * 1024);
  EXPECT_EQ(r.kv_blocks, 66);  // 100 MiB / 1.5 MiB
  EXPECT_EQ(r.kv_bytes(), 66 * r.kv.block_bytes());
  EXPECT_EQ(r.sequence_blocks, 135);
  EXPECT_EQ(r.sequences(), 0);
  EXPECT_FALSE(r.fits());  // less than one sequence of the context
  EXPECT_THAT(r.refusal("m"), HasSubstr("holds 66 blocks of 32 positions"));
  EXPECT_THAT(r.refusal("m"), HasSubstr("needs 135"));
}

TEST(MemoryReport, KvPoolForSequencesAndTheTotal) {
  const Config c = synth_preset("20b").config;
  DeviceOptions o;
  o.kv_sequences = 4;
  const MemoryReport r =
      MemoryReport::plan(o, c, 4096, weights_of(13 * kGiB), "GPU (x)", 70 * kGiB, 80 * kGiB);
  EXPECT_EQ(r.kv_blocks, 4 * 135);
  EXPECT_EQ(r.sequences(), 4);
  EXPECT_EQ(r.need(), r.weights_bytes + r.arena_bytes + r.scores_bytes + r.kv_bytes());
  EXPECT_EQ(r.arena_bytes, ArenaLayout::of(c, 64, 4096).bytes);
  EXPECT_EQ(r.scores_bytes, size_t(2 * 64 * 4097 * 4));
  EXPECT_TRUE(r.fits());
  EXPECT_EQ(r.refusal("m"), "");
  const std::string text = r.text();
  EXPECT_THAT(text, HasSubstr("540 blocks of 32 positions"));
  EXPECT_THAT(text, HasSubstr("room for 4"));
  EXPECT_THAT(text, HasSubstr("12 sliding layers only their window of 128"));
}

TEST(MemoryReport, KvPoolFromFreeMemory) {
  const Config c = synth_preset("20b").config;
  DeviceOptions o;
  o.kv_free_fraction = 0.5;
  const size_t free_bytes = 40 * kGiB;
  const MemoryReport r =
      MemoryReport::plan(o, c, 4096, weights_of(13 * kGiB), "GPU (x)", free_bytes, 80 * kGiB);
  const size_t rest = r.weights_bytes + r.arena_bytes + r.scores_bytes;
  EXPECT_EQ(size_t(r.kv_blocks), (free_bytes - rest) / 2 / r.kv.block_bytes());
  EXPECT_TRUE(r.fits());
  EXPECT_LE(r.need(), free_bytes);
}

TEST(MemoryReport, RefusesAModelThatDoesNotFitWithTheSizes) {
  const Config c = synth_preset("20b").config;
  DeviceOptions o;
  o.kv_sequences = 1;
  const MemoryReport r =
      MemoryReport::plan(o, c, 4096, weights_of(13 * kGiB), "Small GPU (y)", 8 * kGiB, 8 * kGiB);
  EXPECT_FALSE(r.fits());
  const std::string why = r.refusal("/models/20b");
  EXPECT_THAT(why, HasSubstr("/models/20b: the model does not fit on Small GPU (y)"));
  EXPECT_THAT(why, HasSubstr("weights 13.00 GiB"));
  EXPECT_THAT(why, HasSubstr("only 8.00 GiB is free"));
  // From free memory with nothing left: no blocks at all, refused the same way.
  DeviceOptions f;
  const MemoryReport none =
      MemoryReport::plan(f, c, 4096, weights_of(13 * kGiB), "Small GPU (y)", 8 * kGiB, 8 * kGiB);
  EXPECT_EQ(none.kv_blocks, 0);
  EXPECT_FALSE(none.fits());
}

// One rank of a tensor-parallel group (the 120b over two GPUs): its KV blocks hold its four of
// the eight KV heads, so the same bytes hold twice the blocks; the report and the refusal name
// the rank; a group of one is the unsharded report.
TEST(MemoryReport, ARankHoldsItsKvHeadsAndIsNamed) {
  const Config c = synth_preset("120b").config;
  DeviceOptions o;
  o.kv_bytes = 3 * kGiB;
  const MemoryReport whole =
      MemoryReport::plan(o, c, 4096, weights_of(61 * kGiB), "GPU (x)", 75 * kGiB, 80 * kGiB);
  const ShardPlan one = ShardPlan::of(c, 1, 0, ExpertSplit::by_expert);
  const MemoryReport alone =
      MemoryReport::plan(o, c, 4096, weights_of(61 * kGiB), "GPU (x)", 75 * kGiB, 80 * kGiB, &one);
  EXPECT_EQ(alone.kv_blocks, whole.kv_blocks);
  EXPECT_EQ(alone.text(), whole.text());
  EXPECT_EQ(whole.text().find("tensor parallel"), std::string::npos);

  const ShardPlan shard = ShardPlan::of(c, 2, 1, ExpertSplit::by_expert);
  const MemoryReport r = MemoryReport::plan(o, c, 4096, weights_of(31 * kGiB), "GPU (x)", 75 * kGiB,
                                            80 * kGiB, &shard);
  EXPECT_EQ(r.kv.kv_dim, c.kv_dim() / 2);
  EXPECT_EQ(2 * r.kv.block_bytes(), whole.kv.block_bytes());
  EXPECT_EQ(r.kv_blocks, int(3 * kGiB / r.kv.block_bytes()));
  EXPECT_EQ(r.sequence_blocks, whole.sequence_blocks);  // positions, not heads
  // The all-reduces' parts: two ranks' parts of 128 rows of the larger vocabulary half.
  EXPECT_EQ(r.arena_bytes,
            whole.arena_bytes + 2 * sizeof(float) * size_t(128) * size_t((c.vocab_size + 1) / 2));
  EXPECT_TRUE(r.fits());
  EXPECT_THAT(r.text(), HasSubstr("tensor parallel: rank 1 of 2"));
  DeviceOptions big = o;
  big.kv_bytes = 60 * kGiB;
  const MemoryReport over = MemoryReport::plan(big, c, 4096, weights_of(31 * kGiB), "GPU (x)",
                                               75 * kGiB, 80 * kGiB, &shard);
  EXPECT_FALSE(over.fits());
  EXPECT_THAT(over.refusal("/models/120b"),
              HasSubstr("/models/120b (tensor parallel rank 1 of 2): the model does not fit"));
}

TEST(MemoryReport, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(85 * kMiB + kMiB / 2), "85.5 MiB");
  EXPECT_EQ(format_bytes(kGiB + kGiB / 2), "1.50 GiB");
}

// ---------------------------------------------------------------------------- options ---

TEST(DeviceOptions, ValidateNamesTheField) {
  const auto why = [](auto change) {
    DeviceOptions o;
    change(o);
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(why([](DeviceOptions&) {}), "");
  EXPECT_THAT(why([](DeviceOptions& o) { o.kv_block_size = 24; }), HasSubstr("kv_block_size"));
  EXPECT_THAT(why([](DeviceOptions& o) { o.arena_rows = 0; }), HasSubstr("arena_rows"));
  EXPECT_THAT(why([](DeviceOptions& o) { o.kv_free_fraction = 0; }), HasSubstr("kv_free_fraction"));
  EXPECT_THAT(why([](DeviceOptions& o) { o.max_step_rows = 8; }), HasSubstr("max_step_rows"));
  EXPECT_THAT(why([](DeviceOptions& o) { o.device = -2; }), HasSubstr("device index"));
}

TEST(DeviceOptions, MaxContextResolvesAgainstTheModel) {
  const Config c = tiny_config();  // 4096 positions
  DeviceOptions o;
  EXPECT_EQ(o.resolve_max_context(c), 4096);
  o.max_context = 100;
  EXPECT_EQ(o.resolve_max_context(c), 100);
  o.max_context = 5000;
  EXPECT_THROW(o.resolve_max_context(c), Error);
  Config big = synth_preset("20b").config;
  o.max_context = 0;
  EXPECT_EQ(o.resolve_max_context(big), kDefaultMaxContext);
}

// Sets environment variables for one scope and restores them.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DeviceOptions, FromTheEnvironment) {
  {
    ScopedEnv a("PARITY_DEVICE_MAX_CONTEXT", nullptr), b("PARITY_DEVICE_ROWS", nullptr),
        k("PARITY_DEVICE_KV_BYTES", nullptr), s("PARITY_DEVICE_SYNC", nullptr),
        g("PARITY_DEVICE_GRAPHS", nullptr);
    const DeviceOptions o = device_options_from_environment();
    EXPECT_TRUE(o.graphs);
    EXPECT_EQ(o.max_context, 0);
    EXPECT_EQ(o.arena_rows, kDefaultArenaRows);
    EXPECT_EQ(o.kv_bytes, 0u);
    EXPECT_EQ(o.kv_sequences, kEnvironmentKvSequences);
    EXPECT_FALSE(o.sync_after_launch);
    EXPECT_TRUE(bool(o.log));
    EXPECT_EQ(o.device, -1);
  }
  {
    ScopedEnv a("PARITY_DEVICE_MAX_CONTEXT", "2048"), b("PARITY_DEVICE_ROWS", "16"),
        k("PARITY_DEVICE_KV_BYTES", "512M"), s("PARITY_DEVICE_SYNC", "1");
    const DeviceOptions o = device_options_from_environment();
    EXPECT_EQ(o.max_context, 2048);
    EXPECT_EQ(o.arena_rows, 16);
    EXPECT_EQ(o.kv_bytes, 512 * kMiB);
    EXPECT_EQ(o.kv_sequences, 0);
    EXPECT_TRUE(o.sync_after_launch);
  }
  {
    ScopedEnv k("PARITY_DEVICE_KV_BYTES", "free"), s("PARITY_DEVICE_SYNC", "0");
    const DeviceOptions o = device_options_from_environment();
    EXPECT_EQ(o.kv_bytes, 0u);
    EXPECT_EQ(o.kv_sequences, 0);  // from free memory
    EXPECT_FALSE(o.sync_after_launch);
  }
  {
    ScopedEnv g("PARITY_DEVICE_GRAPHS", "0");
    EXPECT_FALSE(device_options_from_environment().graphs);
  }
  for (const char* bad : {"yes", "2", "off"}) {
    ScopedEnv g("PARITY_DEVICE_GRAPHS", bad);
    try {
      device_options_from_environment();
      ADD_FAILURE() << "PARITY_DEVICE_GRAPHS=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("PARITY_DEVICE_GRAPHS"));
    }
  }
  {
    ScopedEnv a("PARITY_DEVICE_MAX_CONTEXT", "-5");
    EXPECT_THROW(device_options_from_environment(), Error);
  }
  {
    ScopedEnv k("PARITY_DEVICE_KV_BYTES", "lots");
    EXPECT_THROW(device_options_from_environment(), Error);
  }
}

TEST(DeviceOptions, ByteSizesAndCountsAreReadStrictly) {
  {
    ScopedEnv k("PARITY_DEVICE_KV_BYTES", "3K");
    EXPECT_EQ(device_options_from_environment().kv_bytes, 3072u);
  }
  for (const char* bad : {"0", "-1", " -5", "+5", "1.5G", "G", "12T", "99999999999999999999"}) {
    ScopedEnv k("PARITY_DEVICE_KV_BYTES", bad);
    EXPECT_THROW(device_options_from_environment(), Error) << bad;
  }
  EXPECT_EQ(parse_positive_int("64", "X"), 64);
  for (const char* bad : {"", "0", " 5", "+5", "5 ", "010x", "2147483648"})
    EXPECT_THROW(parse_positive_int(bad, "X"), Error) << bad;
}

// ----------------------------------------------------------------- on the device ---

#ifdef PARITY_HAVE_DEVICE

// One untraced step; every row's logits appended to `all`, in order.
void forward_logits(Backend& b, const Batch& batch, std::vector<float>& all) {
  forward(b, batch);
  for (int r = 0; r < batch.rows(); ++r) {
    const StageData d = b.read(Stage::logits, kModelLayer, r);
    all.insert(all.end(), d.f32.begin(), d.f32.end());
  }
}

class DeviceRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no GPU: " << device_unavailable_reason();
    model_ = Model::load(test::tiny_model_dir());
  }
  // Options given explicitly, as the engine will: nothing read from the environment.
  static DeviceOptions options(int block_size, size_t kv_bytes = 0) {
    DeviceOptions o;
    o.kv_block_size = block_size;
    o.kv_bytes = kv_bytes;
    o.kv_sequences = kv_bytes == 0 ? 4 : 0;
    o.max_context = 256;
    o.arena_rows = 8;
    return o;
  }
  // Logits of a prefill of `prompt` tokens in one step, then `decode` steps of one token, for
  // sequence `seq`; every row's logits, in order.
  static std::vector<float> run(Backend& b, int prompt, int decode, int seq = 0) {
    std::vector<float> all;
    const auto step = [&](const Batch& batch) { forward_logits(b, batch, all); };
    Batch p;
    for (int i = 0; i < prompt; ++i) {
      p.tokens.push_back((7 + 31 * i) % 1024);
      p.positions.push_back(i);
      p.seqs.push_back(seq);
    }
    step(p);
    for (int i = prompt; i < prompt + decode; ++i) step(Batch::single((7 + 31 * i) % 1024, i, seq));
    return all;
  }
  std::unique_ptr<Model> model_;
};

TEST_F(DeviceRuntimeTest, TheBlockSizeDoesNotChangeABit) {
  // 20 prompt rows and 20 decode steps: past twice the window of 8.
  auto ref = make_hip_backend(*model_, options(256));  // one block per sequence
  const std::vector<float> want = run(*ref, 20, 20);
  for (int block : {1, 4, 32}) {
    auto b = make_hip_backend(*model_, options(block));
    const std::vector<float> got = run(*b, 20, 20);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "block size " << block;
  }
}

TEST_F(DeviceRuntimeTest, APromptInOneStepIsItsTokensOneAtATimeBitForBit) {
  // 20 rows of one sequence go to the attention kernels in query tiles of 8, 8 and 4; one row a
  // step takes the one-row kernels. Every logit the same, past twice the window of 8.
  auto prefill = make_hip_backend(*model_, options(4));
  const std::vector<float> want = run(*prefill, 20, 0);
  auto single = make_hip_backend(*model_, options(4));
  const std::vector<float> got = run(*single, 1, 19);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(DeviceRuntimeTest, ASequenceGetsTheSameBitsBesideAnother) {
  auto alone = make_hip_backend(*model_, options(4));
  const std::vector<float> want = run(*alone, 12, 12, 5);
  auto shared = make_hip_backend(*model_, options(4));
  run(*shared, 30, 3, 1);  // another sequence holds (and slides out of) blocks first
  EXPECT_EQ(run(*shared, 12, 12, 5), want);
  shared->reset();
  EXPECT_EQ(run(*shared, 12, 12, 5), want);
}

TEST_F(DeviceRuntimeTest, ExplicitOptionsAndTheEnvironmentFactoryAgree) {
  auto explicit_options = make_hip_backend(*model_, options(kDefaultKvBlockSize));
  auto from_environment = make_hip_backend(*model_);
  EXPECT_EQ(run(*explicit_options, 9, 3), run(*from_environment, 9, 3));
}

TEST_F(DeviceRuntimeTest, MemoryReportGoesToTheLogCallback) {
  std::string log;
  DeviceOptions o = options(16);
  o.log = [&](const std::string& s) { log += s; };
  DeviceRuntime rt(*model_, o);
  EXPECT_THAT(log, HasSubstr("device runtime on"));
  EXPECT_THAT(log, HasSubstr("KV cache"));
  EXPECT_EQ(rt.kv().blocks().num_blocks(), rt.memory().kv_blocks);
  EXPECT_EQ(rt.kv().bytes(), rt.memory().kv_bytes());
  EXPECT_EQ(rt.facts().at("kv_block_size"), 16);
}

TEST_F(DeviceRuntimeTest, RefusesAPoolSmallerThanOneSequence) {
  const KvLayout layout = KvLayout::of(model_->config, 16);
  try {
    DeviceRuntime rt(*model_, options(16, layout.block_bytes()));
    ADD_FAILURE() << "a pool of one block was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds 1 blocks of 16 positions"));
  }
}

TEST_F(DeviceRuntimeTest, AnExhaustedPoolRefusesTheStepAndTheRuntimeGoesOn) {
  const KvLayout layout = KvLayout::of(model_->config, 16);
  const int one = layout.blocks_per_sequence(256, 8);
  auto b = make_hip_backend(*model_, options(16, size_t(one) * layout.block_bytes()));
  const std::vector<float> want = run(*b, 40, 2, 0);
  try {
    run(*b, 200, 0, 1);  // a second long sequence: no room
    ADD_FAILURE() << "an exhausted pool was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("exhausted"));
  }
  b->reset();
  EXPECT_EQ(run(*b, 40, 2, 0), want);
}

TEST_F(DeviceRuntimeTest, StepUploadsItsRowsTablesAndQueryTiles) {
  DeviceRuntime rt(*model_, options(4));
  const Batch b = join(rows_of(0, 0, 6, 3), rows_of(2, 0, 2, 4));
  rt.begin_step(b);
  const StepLayout& host = rt.step().host();
  std::vector<StepRow> rows(host.rows.size());
  std::vector<int32_t> tables(host.block_tables.size());
  HIP_CHECK(hipStreamSynchronize(rt.stream()));
  HIP_CHECK(hipMemcpy(rows.data(), rt.step().device_rows(), rows.size() * sizeof(StepRow),
                      hipMemcpyDeviceToHost));
  HIP_CHECK(hipMemcpy(tables.data(), rt.step().device_block_tables(),
                      tables.size() * sizeof(int32_t), hipMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(rows.data(), host.rows.data(), rows.size() * sizeof(StepRow)), 0);
  EXPECT_EQ(tables, host.block_tables);
  EXPECT_EQ(rt.step().max_pos(), 5);
  const QueryTiles tiles = rt.step().device_query_tiles();
  ASSERT_EQ(tiles.count, 2);  // 6 rows of sequence 0, 2 of 2
  std::vector<int32_t> first(size_t(tiles.count) + 1);
  HIP_CHECK(
      hipMemcpy(first.data(), tiles.first, first.size() * sizeof(int32_t), hipMemcpyDeviceToHost));
  EXPECT_EQ(first, (std::vector<int32_t>{0, 6, 8}));
}

// ------------------------------------------------------------------ step graphs ---

// Options for the step-graph tests: a context of 512 positions, so that decoding crosses a
// launch bound (DeviceRuntime::kLaunchPositions) and the attention output's split (256 keys).
DeviceOptions graph_options(bool graphs) {
  DeviceOptions o;
  o.kv_sequences = 4;
  o.max_context = 512;
  o.arena_rows = 8;
  o.graphs = graphs;
  return o;
}

// One step on the runtime the way the hip backend's untraced step runs it; the step's logits.
std::vector<float> runtime_step(DeviceRuntime& rt, const Batch& b, StepGraphs::Launch* how) {
  rt.begin_step(b);
  const Config& c = rt.config();
  *how = rt.run_step([&] {
    for (const auto& [layer, s] : stage_sequence(c))
      launch_stage(rt, s, layer, StageCall::untraced);
  });
  std::vector<float> logits(size_t(b.rows()) * size_t(c.vocab_size));
  HIP_CHECK(hipStreamSynchronize(rt.stream()));
  HIP_CHECK(hipMemcpy(logits.data(), rt.arena().out(Stage::logits), logits.size() * sizeof(float),
                      hipMemcpyDeviceToHost));
  return logits;
}

TEST_F(DeviceRuntimeTest, AStepShapeIsCapturedOnItsSecondStepAndReplayedAfter) {
  using Launch = StepGraphs::Launch;
  DeviceRuntime on(*model_, graph_options(true)), off(*model_, graph_options(false));
  std::vector<Launch> seen;
  const auto both = [&](const Batch& b) {
    Launch how = Launch::direct, off_how = Launch::direct;
    const std::vector<float> got = runtime_step(on, b, &how);
    const std::vector<float> want = runtime_step(off, b, &off_how);
    EXPECT_EQ(off_how, Launch::direct);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "the step at position " << b.positions.back();
    seen.push_back(how);
  };
  both(rows_of(0, 0, 10, 5));  // a prefill of 10 rows
  for (int p = 10; p < 14; ++p) both(Batch::single(int32_t(p % 97), p));
  EXPECT_EQ(seen, (std::vector<Launch>{Launch::direct, Launch::direct, Launch::captured,
                                       Launch::replayed, Launch::replayed}));
  EXPECT_EQ(on.launch_max_pos(), DeviceRuntime::kLaunchPositions - 1);
  EXPECT_EQ(on.graphs().size(), 1);
  // Up to the launch bound and past it, where the attention output splits its keys: the new
  // bound is a new shape.
  for (int p = 14; p < 260; ++p) both(Batch::single(int32_t(p % 97), p));
  EXPECT_EQ(on.launch_max_pos(), 2 * DeviceRuntime::kLaunchPositions - 1);
  EXPECT_EQ(on.graphs().size(), 2);
  const std::vector<Launch> crossing(seen.end() - 6, seen.end());  // positions 254 .. 259
  EXPECT_EQ(crossing, (std::vector<Launch>{Launch::replayed, Launch::replayed, Launch::direct,
                                           Launch::captured, Launch::replayed, Launch::replayed}));
  // A second sequence beside the first: two rows a step, a shape of its own.
  both(rows_of(1, 0, 20, 9));  // more rows than ever: the arena moves, the graphs go
  EXPECT_EQ(on.graphs().size(), 0);
  for (int i = 0; i < 4; ++i) both(join(Batch::single(3, 260 + i, 0), Batch::single(4, 20 + i, 1)));
  EXPECT_EQ(on.graphs().size(), 1);
  EXPECT_EQ(on.graphs().counts().captured, 3);
  EXPECT_EQ(on.graphs().counts().replayed, int64_t(seen.size()) - 3 - on.graphs().counts().direct);
}

TEST_F(DeviceRuntimeTest, GraphLaunchedStepsAreTheStageByStageStepsBitForBit) {
  auto on = make_hip_backend(*model_, graph_options(true));
  auto off = make_hip_backend(*model_, graph_options(false));
  EXPECT_EQ(on->facts().at("step_graphs"), true);
  EXPECT_EQ(off->facts().at("step_graphs"), false);
  // Two sequences decoding together from positions 200 and 40, past the launch bound at 256.
  const auto steps = [](Backend& b) {
    std::vector<float> all;
    const auto step = [&](const Batch& batch) { forward_logits(b, batch, all); };
    step(rows_of(0, 0, 200, 11));
    step(rows_of(1, 0, 40, 12));
    for (int i = 0; i < 80; ++i)
      step(join(Batch::single(int32_t(i % 50), 200 + i, 0),
                Batch::single(int32_t(i % 31), 40 + i, 1)));
    return all;
  };
  const std::vector<float> want = steps(*off);
  const std::vector<float> got = steps(*on);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

// Every stage's row of every layer, as a trace records it.
class Recorder final : public Observer {
 public:
  bool wants(int, int, Stage) const override { return true; }
  void record(const StageKey& key, const StageData& data) override {
    rows[{key.layer, int(key.stage)}] = data;
  }
  std::map<std::pair<int, int>, StageData> rows;
};

bool same_bits(const StageData& a, const StageData& b) {
  if (a.type != b.type || a.dims != b.dims) return false;
  if (a.type == StageData::Type::I32) return a.i32 == b.i32;
  return a.f32.size() == b.f32.size() &&
         std::memcmp(a.f32.data(), b.f32.data(), a.f32.size() * sizeof(float)) == 0;
}

TEST_F(DeviceRuntimeTest, ATracedStepAfterGraphStepsSeesEveryLayersOwnOutput) {
  // Untraced steps replay a graph; the traced step among them runs stage by stage, and its
  // rows are each layer's own, the values of a backend that never launched a graph.
  const auto trace = [&](Backend& b) {
    forward(b, rows_of(0, 0, 20, 7));
    for (int p = 20; p < 30; ++p) forward(b, Batch::single(int32_t(p), p));
    Recorder r;
    forward(b, Batch::single(30, 30), &r);
    forward(b, Batch::single(31, 31));  // and untraced again
    r.rows[{kModelLayer, -1}] = b.read(Stage::logits, kModelLayer, 0);
    return r.rows;
  };
  auto on = make_hip_backend(*model_, graph_options(true));
  auto off = make_hip_backend(*model_, graph_options(false));
  const auto want = trace(*off);
  const auto got = trace(*on);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), size_t(stages_per_position(model_->config)) + 1);
  for (const auto& [key, data] : want) {
    ASSERT_TRUE(got.count(key)) << "layer " << key.first << " stage " << key.second;
    EXPECT_TRUE(same_bits(got.at(key), data))
        << "layer " << key.first << " stage " << name(Stage(std::max(0, key.second)));
  }
  // Each layer's rows are its own: no stage shows one buffer for every layer.
  for (const Stage s : {Stage::attn_norm, Stage::q_rope, Stage::attn_out, Stage::router,
                        Stage::mlp1, Stage::resid_ffn})
    for (int layer = 1; layer < model_->config.num_hidden_layers; ++layer)
      EXPECT_FALSE(same_bits(got.at({layer, int(s)}), got.at({layer - 1, int(s)})))
          << name(s) << " of layers " << layer - 1 << " and " << layer;
}

#endif  // PARITY_HAVE_DEVICE

}  // namespace
}  // namespace parity::device
