// How a model's checkpoint tensors are placed on the device (host arithmetic, no GPU toolkit
// needed; device/runtime/device_weights.h uploads them): one allocation, 256-byte aligned.
// Matrices, norm scales and MXFP4 blocks/scales are copied as stored (BF16 dense, MXFP4 experts
// with their E8M0 scales); biases and sinks (small vectors read in kernel epilogues) are
// converted to float32, exactly.
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
  const TensorView* tensor = nullptr;
  bool to_f32 = false;
  size_t offset = 0, bytes = 0;
};
struct WeightPlan {
  std::vector<WeightEntry> entries;
  std::map<std::string, size_t> bytes_by_kind;  // "BF16", "U8 (MXFP4 blocks + scales)", ...
  size_t total = 0;
  const WeightEntry& find(const TensorView* t) const;  // throws if the tensor is not placed
};
WeightPlan plan_weights(const Model& m);

}  // namespace parity::device
