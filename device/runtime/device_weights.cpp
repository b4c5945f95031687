#include "device/runtime/device_weights.h"

#include <algorithm>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "model/config.h"

namespace parity::device {

namespace {

// Bytes of the staging buffer through which packed tensors go to the device, a few experts at a
// time (at least one expert whatever its size).
constexpr size_t kPackStagingBytes = size_t(64) << 20;

// Uploads a packed entry's tensor (checkpoint layout, expert-major) through `staging` and packs
// it into dst, as many whole experts per copy as the staging buffer holds.
void upload_packed(const WeightEntry& e, char* dst, DeviceBuffer& staging) {
  const size_t raw_per_expert = e.tensor->nbytes / size_t(e.experts);
  const Mxfp4Packing pk(e.out, e.in);
  const bool blocks = e.pack == WeightEntry::Pack::mxfp4_blocks;
  const size_t packed_per_expert = size_t(blocks ? pk.block_bytes(1) : pk.scale_bytes(1));
  const int per_copy = int(std::max<size_t>(1, kPackStagingBytes / raw_per_expert));
  if (staging.bytes() < size_t(per_copy) * raw_per_expert)
    staging.allocate(size_t(per_copy) * raw_per_expert);
  for (int e0 = 0; e0 < e.experts; e0 += per_copy) {
    const int n = std::min(per_copy, e.experts - e0);
    HIP_CHECK(hipMemcpy(staging.as(), e.tensor->data + size_t(e0) * raw_per_expert,
                        size_t(n) * raw_per_expert, hipMemcpyHostToDevice));
    uint8_t* out = reinterpret_cast<uint8_t*>(dst + size_t(e0) * packed_per_expert);
    if (blocks)
      launch_u8_mxfp4_pack_blocks(staging.as<uint8_t>(), n, e.out, e.in, out, nullptr);
    else
      launch_u8_mxfp4_pack_scales(staging.as<uint8_t>(), n, e.out, e.in, out, nullptr);
    HIP_CHECK(hipDeviceSynchronize());  // the staging buffer is reused next
  }
}

}  // namespace

DeviceWeights::DeviceWeights(const Model& m, WeightPlan plan) : plan_(std::move(plan)) {
  buffer_.allocate(plan_.total);
  std::vector<float> converted;
  DeviceBuffer staging;
  for (const auto& e : plan_.entries) {
    char* dst = buffer_.as<char>(e.offset);
    if (e.pack != WeightEntry::Pack::none) {
      upload_packed(e, dst, staging);
    } else if (e.to_f32) {
      converted.resize(size_t(e.tensor->numel()));
      read_vector(*e.tensor, converted.data());
      HIP_CHECK(hipMemcpy(dst, converted.data(), e.bytes, hipMemcpyHostToDevice));
    } else {
      HIP_CHECK(hipMemcpy(dst, e.tensor->data, e.bytes, hipMemcpyHostToDevice));
    }
  }
  embed_ = matrix(m.embed);
  lm_head_ = matrix(m.lm_head.weight);
  final_norm_ = {weight_type_of(*m.final_norm), weight(m.final_norm)};
  for (const auto& l : m.layers) {
    DeviceLayer d;
    d.attn_norm = {weight_type_of(*l.attn_norm), weight(l.attn_norm)};
    d.ffn_norm = {weight_type_of(*l.ffn_norm), weight(l.ffn_norm)};
    d.q = linear(l.q);
    d.k = linear(l.k);
    d.v = linear(l.v);
    d.o = linear(l.o);
    d.router = linear(l.router);
    d.sinks = weight_f32(l.sinks);
    d.mlp1 = experts(l.mlp1);
    d.mlp2 = experts(l.mlp2);
    layers_.push_back(d);
  }
  // YaRN table: computed in double (model/config.cpp), kept as float on the device.
  const Rope rope = Rope::from_config(m.config);
  std::vector<float> inv(rope.inv_freq.begin(), rope.inv_freq.end());
  concentration_ = float(rope.concentration);
  inv_freq_.allocate(inv.size() * sizeof(float));
  HIP_CHECK(
      hipMemcpy(inv_freq_.as(), inv.data(), inv.size() * sizeof(float), hipMemcpyHostToDevice));
  // The copies ran on the default stream; the kernels run on non-blocking ones.
  HIP_CHECK(hipDeviceSynchronize());
}

const void* DeviceWeights::weight(const TensorView* t) const {
  return t == nullptr ? nullptr : buffer_.as<char>(plan_.find(t).offset);
}

Matrix DeviceWeights::matrix(const TensorView* t) const {
  Matrix mm;
  mm.type = weight_type_of(*t);
  mm.data = weight(t);
  mm.rows = int(t->dim(0));
  mm.cols = int(t->numel() / t->dim(0));
  return mm;
}

ExpertWeights DeviceWeights::experts(const ExpertLinear& w) const {
  ExpertWeights e;
  e.mxfp4 = w.layout == ExpertLayout::Mxfp4;
  e.experts = w.experts;
  e.out = w.out;
  e.in = w.in;
  e.bias = weight_f32(w.bias);
  if (e.mxfp4) {
    e.packed_blocks = static_cast<const uint8_t*>(weight(w.blocks));
    e.packed_scales = static_cast<const uint8_t*>(weight(w.scales));
  } else {
    e.dense_type = weight_type_of(*w.dense);
    e.dense = weight(w.dense);
  }
  return e;
}

}  // namespace parity::device
