// Which part of the model one rank of a tensor-parallel group holds and computes (host
// arithmetic, no GPU toolkit needed): the bookkeeping that the sharded weight upload, the
// kernels' launches, the all-reduces and the tracer's gathering of the shards all read, written
// once here.
//
// Attention is split by heads: a rank computes the query heads [q_heads) and the KV heads they
// read [kv_heads) (a KV head is never split: its query heads stay on one rank), so its rows of
// the fused qkv projection are three ranges of the full output (its q, k and v rows), its
// attention sinks are those of its query heads, and o_proj reads its heads' columns of the
// attention output and yields a partial sum of the whole hidden row: the ranks' partial sums are
// all-reduced (with o_proj's bias added once, on rank 0). The experts are split one of two ways:
//   by_expert        a rank owns the experts [experts) whole: a routed pair computes on its
//                    expert's rank only; moe_out's weighted sums are partial, all-reduced;
//   by_intermediate  every rank holds every expert's slice [intermediate) of the intermediate
//                    dimension (mlp1's gate and linear rows of the slice, mlp2's columns of it),
//                    in whole MXFP4 blocks of 32; mlp2's outputs are partial, all-reduced (its
//                    bias added once, on rank 0).
// The norms, the router, the embedding and the residual stream are replicated. lm_head is split
// by vocabulary rows [vocab); the sampler reads every rank's shard.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace parity::device {

struct ShardRange {
  int begin = 0, end = 0;  // [begin, end)
  int size() const { return end - begin; }
  bool contains(int i) const { return i >= begin && i < end; }
  friend bool operator==(const ShardRange&, const ShardRange&) = default;
};

enum class ExpertSplit { by_expert, by_intermediate };

// "by-expert", "by-intermediate"; and back (throws parity::Error naming the choices).
std::string expert_split_name(ExpertSplit s);
ExpertSplit expert_split_from_name(const std::string& name);

// The MXFP4 block: the experts' input dimensions are split in whole blocks.
inline constexpr int kShardBlock = 32;

struct ShardPlan {
  int degree = 1, rank = 0;
  ExpertSplit experts_split = ExpertSplit::by_expert;
  ShardRange q_heads, kv_heads;
  // This rank's rows of the fused qkv output [q | k | v] (each within its part of it).
  ShardRange q_rows, k_rows, v_rows;
  ShardRange o_proj_cols;   // o_proj's input columns: the attention output of q_heads
  ShardRange experts;       // by_expert: the experts it owns; by_intermediate: all
  ShardRange intermediate;  // by_intermediate: each expert's slice; by_expert: all
  ShardRange vocab;         // lm_head's rows, the logits it computes

  // The plan of `rank` in a group of `degree` (>= 1). Throws parity::Error, one line naming the
  // degree and what it does not divide, when the model cannot be split so (see
  // tensor_parallel_problem).
  static ShardPlan of(const Config& c, int degree, int rank, ExpertSplit split);

  // Whether this rank adds the biases of the all-reduced projections (o_proj's; mlp2's when
  // split by_intermediate): rank 0 alone, so that the sum holds each bias once.
  bool adds_reduced_bias() const { return rank == 0; }
  // The expert's rank under by_expert (every rank under by_intermediate: -1).
  int rank_of_expert(int expert) const;
};

// The model as rank `p.rank` computes it: its query and KV heads, its experts' intermediate slice
// (by_intermediate); the hidden size, the vocabulary (the sampler's full rows), the experts and
// the rest as the model's. The device runtime sizes its activations, KV cache and kernels by it.
Config rank_config(const Config& c, const ShardPlan& p);

// Floats of one rank's part of the device's all-reduce scratch (DeviceRuntime::all_reduce,
// join_logits): the partial sums of a step of `rows` rows (rows x hidden), or the vocabulary
// shards of `join_rows` rows, whichever is larger. The scratch holds `degree` parts.
int64_t shard_join_floats(const Config& c, int degree, int rows, int join_rows);
// The rows of logits joined at a time (DeviceRuntime::join_logits).
inline constexpr int kShardJoinRows = 128;

// Why `degree` ranks cannot split `c` with `split` ("" when they can): a degree below 1, query or
// KV heads it does not divide, experts (by_expert) it does not divide, fewer MXFP4 blocks of the
// intermediate dimension than ranks (by_intermediate), more ranks than vocabulary rows.
std::string tensor_parallel_problem(const Config& c, int degree, ExpertSplit split);

// The balanced split of [0, n) into `parts` contiguous ranges in units of `unit` (the last
// unit may be partial): part p's range. The first (n / unit) % parts parts hold one unit more.
ShardRange split_range(int n, int parts, int part, int unit = 1);

}  // namespace parity::device
