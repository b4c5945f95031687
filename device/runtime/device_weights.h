// The model's weights on a device, in their checkpoint dtypes (BF16/F16/F32 matrices and norm
// scales, MXFP4 expert blocks with their E8M0 scales; biases and sinks as exact float32 copies),
// uploaded once from a model/ Model along a WeightPlan, with the views the kernels take and the
// byte counts. Also the YaRN inverse frequencies (model constants the kernels read).
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "device/kernel_types.h"
#include "device/runtime/device_buffer.h"
#include "device/runtime/weight_plan.h"
#include "model/checkpoint.h"

namespace parity::device {

struct DeviceNorm {
  WeightType type = WeightType::bf16;
  const void* data = nullptr;
};

struct DeviceLinear {
  Matrix w;
  const float* bias = nullptr;
};

struct DeviceLayer {
  DeviceNorm attn_norm, ffn_norm;
  DeviceLinear q, k, v, o, router;
  const float* sinks = nullptr;
  ExpertWeights mlp1, mlp2;
};

class DeviceWeights {
 public:
  // Uploads every tensor of `plan` (plan_weights(m), or plan_weights(m, *shard): each tensor's
  // part the rank holds) to the current device; synchronous. The views are of the parts held; a
  // rank other than 0 holds zeros for the biases of the all-reduced projections (o_proj's,
  // mlp2's), so that the group's sum adds each once; a tied lm_head is viewed at the rank's
  // vocabulary rows of the embedding.
  DeviceWeights(const Model& m, WeightPlan plan, const ShardPlan* shard = nullptr);

  const Matrix& embed() const { return embed_; }
  const Matrix& lm_head() const { return lm_head_; }
  const DeviceNorm& final_norm() const { return final_norm_; }
  const DeviceLayer& layer(int l) const { return layers_.at(size_t(l)); }
  const float* inv_freq() const { return inv_freq_.as<float>(); }  // (head_dim / 2,)
  float concentration() const { return concentration_; }           // YaRN attention scaling

  size_t bytes() const { return plan_.total; }
  const std::map<std::string, size_t>& bytes_by_kind() const { return plan_.bytes_by_kind; }

 private:
  const void* weight(const TensorView* t) const;
  const float* weight_f32(const TensorView* t) const {
    return static_cast<const float*>(weight(t));
  }
  Matrix matrix(const TensorView* t) const;
  DeviceLinear linear(const Linear& l) const { return {matrix(l.weight), weight_f32(l.bias)}; }
  ExpertWeights experts(const ExpertLinear& w) const;

  WeightPlan plan_;
  DeviceBuffer buffer_;
  Matrix embed_, lm_head_;
  DeviceNorm final_norm_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer inv_freq_;
  float concentration_ = 1;
};

}  // namespace parity::device
