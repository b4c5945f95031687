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
#include "model/checkpoint.h"

namespace parity::device {

// The device element type of a real checkpoint tensor (BF16, F16, F32); throws otherwise.
WeightType weight_type_of(const TensorView& t);

struct WeightEntry {
  enum class Pack { none, mxfp4_blocks, mxfp4_scales };
  const TensorView* tensor = nullptr;
  bool to_f32 = false;
  Pack pack = Pack::none;
  int experts = 0, out = 0, in = 0;  // the expert projection of a packed entry
  size_t offset = 0, bytes = 0;      // bytes on the device (packed, when packed)
};
struct WeightPlan {
  std::vector<WeightEntry> entries;
  std::map<std::string, size_t> bytes_by_kind;  // "BF16", "U8 (MXFP4 blocks + scales, packed)", ...
  size_t total = 0;
  const WeightEntry& find(const TensorView* t) const;  // throws if the tensor is not placed
};
WeightPlan plan_weights(const Model& m);

}  // namespace parity::device
