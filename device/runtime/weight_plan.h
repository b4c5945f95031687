// How a model's checkpoint tensors are placed on the device (host arithmetic, no GPU toolkit
// needed; device/runtime/device_weights.h uploads them): one allocation, 256-byte aligned.
// Matrices and norm scales are copied as stored (BF16 dense); MXFP4 expert blocks and their E8M0
// scales keep their bytes, packed into the order the MMA kernel reads (Mxfp4Packing,
// device/kernel_types.h; rows padded to tiles of 16, blocks to pairs); biases and sinks (small
// vectors read in kernel epilogues) are converted to float32, exactly.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "device/kernel_types.h"
#include "device/runtime/shard_plan.h"
#include "model/checkpoint.h"

namespace parity::device {

// The device element type of a real checkpoint tensor (BF16, F16, F32); throws otherwise.
WeightType weight_type_of(const TensorView& t);

// The part of a tensor a device holds, in the tensor's own indices: experts [experts) of an
// expert tensor (its leading dimension), output rows [rows) of a matrix or an expert projection
// (a vector's elements; an expert bias's per-expert elements), input columns [cols). Whole unless
// the model is split over ranks (plan_weights with a ShardPlan).
struct WeightSlice {
  ShardRange experts, rows, cols;
  friend bool operator==(const WeightSlice&, const WeightSlice&) = default;
};

struct WeightEntry {
  enum class Pack { none, mxfp4_blocks, mxfp4_scales };
  const TensorView* tensor = nullptr;
  bool to_f32 = false;
  Pack pack = Pack::none;
  int experts = 0, out = 0, in = 0;  // the expert projection of a packed entry (as held: sliced)
  WeightSlice slice;
  size_t offset = 0, bytes = 0;      // bytes on the device (packed, when packed)
};
struct WeightPlan {
  std::vector<WeightEntry> entries;
  std::map<std::string, size_t> bytes_by_kind;  // "BF16", "U8 (MXFP4 blocks + scales, packed)", ...
  size_t total = 0;
  const WeightEntry& find(const TensorView* t) const;  // throws if the tensor is not placed
};
// Every tensor whole (one device, or data parallel).
WeightPlan plan_weights(const Model& m);
// The parts rank `shard.rank` of a tensor-parallel group holds (device/runtime/shard_plan.h): its
// rows of q, k, v (and their biases) and its heads' sinks; o_proj's columns of its heads; its
// experts whole (by_expert), or every expert's rows of mlp1 and columns of mlp2 for its slice of
// the intermediate dimension (by_intermediate; mlp1's gate and linear rows interleaved, so rows
// [2 i0, 2 i1)); its vocabulary rows of lm_head. Replicated whole: the embedding, the norms, the
// router, and the biases of the all-reduced projections (o_proj's; mlp2's by_intermediate), which
// rank 0 alone adds. A tensor placed twice (lm_head tied to the embedding) keeps its first, whole
// placement. The ranks' plans hold every split tensor's bytes once between them, except that a
// rank's packed MXFP4 slice is padded to whole row tiles of 16 and chunks of two blocks
// (Mxfp4Packing): mlp2's input split by_intermediate into an odd count of blocks per rank pads one
// block of each row (the 20b and 120b at degree 2: 45 blocks each, packed as 46).
WeightPlan plan_weights(const Model& m, const ShardPlan& shard);

}  // namespace parity::device
