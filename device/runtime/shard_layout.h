// Where one tensor-parallel rank's row of a stage sits in the stage's full row (the reference's
// shape, model/backend.h stage_dims), and the gathering of a group's rows into the full row that
// the tracer judges: host arithmetic over the ShardPlan (device/runtime/shard_plan.h), written
// once for the sharded trace and for naming the rank behind an element of a verdict.
//
// A stage's rows over the ranks are one of four kinds:
//   replicated  every rank computes the whole row, the same bits: the embedding, the norms, the
//               router and its choices, the residual stream, the sampled token;
//   ranges      the rank computes the elements of `ranges` of the full row, and its row holds
//               them in that order: its q, k and v rows of qkv; its query heads' q_rope, scores,
//               att and attn_out; its KV heads' k_rope and v; its vocabulary rows of logits; the
//               experts' stages by slot (by_expert: the whole rows of the slots whose expert it
//               owns) or by intermediate column (by_intermediate: mlp1's gate and linear columns
//               2i and 2i + 1 and swiglu's column i of each slot, i in its slice);
//   reduced     the rank computes a partial sum of the whole row (traced as its own dataset) and
//               the stage's row is the group's all-reduce of the partial sums, the same on every
//               rank: o_proj, moe_out;
//   partial     the rank computes a partial sum of the whole row and no all-reduce follows at this
//               stage: mlp2 under by_intermediate (moe_out's all-reduce adds its partial sums).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "device/runtime/shard_plan.h"
#include "model/config.h"
#include "model/stages.h"

namespace parity::device {

enum class ShardKind { replicated, ranges, reduced, partial };

struct StageShard {
  ShardKind kind = ShardKind::replicated;
  std::vector<ShardRange> ranges;  // kind ranges: the rank's, in the order its row holds them
  int64_t size() const;            // kind ranges: the elements of the rank's row
};

// The layout of rank `p.rank`'s row of `stage` at position `pos`. The experts' stages need the
// row's expert choices (`topk_idx`, num_experts_per_tok of them); other stages ignore it. A slot
// whose expert index is outside the experts is held by no rank (by_expert). Throws parity::Error
// when an expert stage comes without its choices.
StageShard stage_shard(Stage stage, const Config& c, const ShardPlan& p,
                       std::span<const int32_t> topk_idx, int pos);

// One rank's traced rows of one stage at one (layer, position): its row of the stage (its part,
// the whole row, or the all-reduced row) and, for the reduced stages, its partial sum before the
// all-reduce.
struct RankRow {
  std::span<const float> row;
  std::span<const float> partial;
};

struct Gathered {
  std::vector<float> row;  // the full row (empty when there is a problem)
  std::string problem;     // one line naming the stage, the rank and the element; "" when none
  int rank = -1;           // the rank the problem names, or -1 (every rank's, or none)
};

// Gathers a group's rows of `stage` (`layouts` and `rows` one per rank, in rank order) into its
// full row of `full_size` elements, and checks what the layouts promise:
//   replicated  every rank's row has the same bits: a rank whose row differs from the others' is
//               named (with two ranks, the second);
//   ranges      each rank's row has its ranges' size, and the ranks' ranges cover the row once;
//   reduced     each rank's row is the sum of the ranks' partial sums (float64, in rank order)
//               within the roundings of a float32 all-reduce, degree x 2^-23 of the sum of their
//               magnitudes: a rank whose all-reduce is missing, doubled or short of a rank is
//               named; and the ranks' rows have the same bits;
//   partial     the full row is the ranks' sum, float64 in rank order, rounded once to float.
Gathered gather_shards(Stage stage, std::span<const StageShard> layouts,
                       std::span<const RankRow> rows, int64_t full_size);

// The rank whose row holds element `i` of the full row: for ranges, the rank whose ranges hold
// it (-1 when none does); for the other kinds, -1 (every rank computes or sums it).
int rank_holding(std::span<const StageShard> layouts, int64_t i);

}  // namespace parity::device
