#include "device/runtime/device_weights.h"

#include <algorithm>
#include <cstring>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "model/config.h"
#include "model/error.h"
#include "model/safetensors.h"

namespace parity::device {

namespace {

// Bytes of the staging buffer through which packed tensors go to the device, a few experts at a
// time (at least one expert whatever its size).
constexpr size_t kPackStagingBytes = size_t(64) << 20;

// Uploads a packed entry's tensor (checkpoint layout [E, out, in / 32, 16] blocks or [E, out,
// in / 32] scales) through `staging` and packs it into dst: the entry's experts, rows and blocks
// of columns (WeightEntry::slice; all of them for a whole tensor), as many experts per copy as
// the staging buffer holds, a sliced tensor gathered on the host first.
void upload_packed(const WeightEntry& e, char* dst, DeviceBuffer& staging) {
  const TensorView& t = *e.tensor;
  const bool blocks = e.pack == WeightEntry::Pack::mxfp4_blocks;
  const int64_t full_out = t.dim(1), full_groups = t.dim(2), unit = blocks ? 16 : 1;
  const WeightSlice& sl = e.slice;
  const bool sliced = sl.rows.size() != full_out || int64_t(sl.cols.size()) != full_groups * 32;
  const size_t raw_per_expert = size_t(e.out) * size_t(e.in / 32) * size_t(unit);
  const Mxfp4Packing pk(e.out, e.in);
  const size_t packed_per_expert = size_t(blocks ? pk.block_bytes(1) : pk.scale_bytes(1));
  const int per_copy = int(std::max<size_t>(1, kPackStagingBytes / raw_per_expert));
  if (staging.bytes() < size_t(per_copy) * raw_per_expert)
    staging.allocate(size_t(per_copy) * raw_per_expert);
  std::vector<uint8_t> host;
  for (int e0 = 0; e0 < e.experts; e0 += per_copy) {
    const int n = std::min(per_copy, e.experts - e0);
    const uint8_t* src = t.data + size_t(sl.experts.begin + e0) * size_t(full_out) *
                                      size_t(full_groups) * size_t(unit);
    if (sliced) {  // rows [rows) of each expert, groups [cols / 32)
      host.resize(size_t(n) * raw_per_expert);
      const size_t run = size_t(e.in / 32) * size_t(unit);
      uint8_t* out = host.data();
      for (int x = 0; x < n; ++x)
        for (int r = sl.rows.begin; r < sl.rows.end; ++r, out += run)
          std::memcpy(out,
                      src + ((size_t(x) * size_t(full_out) + size_t(r)) * size_t(full_groups) +
                             size_t(sl.cols.begin / 32)) *
                                size_t(unit),
                      run);
      src = host.data();
    }
    HIP_CHECK(hipMemcpy(staging.as(), src, size_t(n) * raw_per_expert, hipMemcpyHostToDevice));
    uint8_t* packed = reinterpret_cast<uint8_t*>(dst + size_t(e0) * packed_per_expert);
    if (blocks)
      launch_u8_mxfp4_pack_blocks(staging.as<uint8_t>(), n, e.out, e.in, packed, nullptr);
    else
      launch_u8_mxfp4_pack_scales(staging.as<uint8_t>(), n, e.out, e.in, packed, nullptr);
    HIP_CHECK(hipDeviceSynchronize());  // the staging buffer is reused next
  }
}

// A converted (float32) entry: a vector [n] or an expert bias [E, out]; the entry's experts and
// rows (elements) of it.
void upload_f32(const WeightEntry& e, char* dst) {
  const TensorView& t = *e.tensor;
  std::vector<float> all(size_t(t.numel()));
  read_vector(t, all.data());
  const size_t per_expert = t.shape.size() == 2 ? size_t(t.dim(1)) : all.size();
  const WeightSlice& sl = e.slice;
  std::vector<float> held;
  held.reserve(e.bytes / sizeof(float));
  for (int x = sl.experts.begin; x < sl.experts.end; ++x)
    held.insert(held.end(), all.begin() + ptrdiff_t(size_t(x) * per_expert + size_t(sl.rows.begin)),
                all.begin() + ptrdiff_t(size_t(x) * per_expert + size_t(sl.rows.end)));
  PARITY_CHECK(held.size() * sizeof(float) == e.bytes, "weights: {} floats placed as {} bytes",
               held.size(), e.bytes);
  HIP_CHECK(hipMemcpy(dst, held.data(), e.bytes, hipMemcpyHostToDevice));
}

// A dense entry's rows and columns: a matrix [out, in], or dense experts [E, in, out] (the
// experts, their input rows `cols` and output columns `rows`), copied as 2D regions.
void upload_dense(const WeightEntry& e, char* dst) {
  const TensorView& t = *e.tensor;
  if (e.bytes == t.nbytes) {  // the whole tensor
    HIP_CHECK(hipMemcpy(dst, t.data, e.bytes, hipMemcpyHostToDevice));
    return;
  }
  const size_t es = dtype_size(t.dtype);
  const WeightSlice& sl = e.slice;
  if (t.shape.size() == 2) {
    const size_t in = size_t(t.dim(1));
    HIP_CHECK(hipMemcpy2D(dst, size_t(sl.cols.size()) * es,
                          t.data + (size_t(sl.rows.begin) * in + size_t(sl.cols.begin)) * es,
                          in * es, size_t(sl.cols.size()) * es, size_t(sl.rows.size()),
                          hipMemcpyHostToDevice));
    return;
  }
  PARITY_CHECK(t.shape.size() == 3, "weights: a sliced tensor of {} dimensions", t.shape.size());
  const size_t in = size_t(t.dim(1)), out = size_t(t.dim(2));
  const size_t held = size_t(sl.cols.size()) * size_t(sl.rows.size()) * es;
  for (int x = sl.experts.begin; x < sl.experts.end; ++x)
    HIP_CHECK(hipMemcpy2D(
        dst + size_t(x - sl.experts.begin) * held, size_t(sl.rows.size()) * es,
        t.data + ((size_t(x) * in + size_t(sl.cols.begin)) * out + size_t(sl.rows.begin)) * es,
        out * es, size_t(sl.rows.size()) * es, size_t(sl.cols.size()), hipMemcpyHostToDevice));
}

}  // namespace

DeviceWeights::DeviceWeights(const Model& m, WeightPlan plan, const ShardPlan* shard)
    : plan_(std::move(plan)) {
  buffer_.allocate(plan_.total);
  DeviceBuffer staging;
  for (const auto& e : plan_.entries) {
    char* dst = buffer_.as<char>(e.offset);
    if (e.pack != WeightEntry::Pack::none)
      upload_packed(e, dst, staging);
    else if (e.to_f32)
      upload_f32(e, dst);
    else
      upload_dense(e, dst);
  }
  // The biases of the all-reduced projections (o_proj's, mlp2's): rank 0's alone count in the
  // group's sum; the other ranks hold zeros in their place (adding zero changes no sum).
  if (shard != nullptr && !shard->adds_reduced_bias())
    for (const auto& l : m.layers)
      for (const TensorView* bias : {l.o.bias, l.mlp2.bias})
        if (bias != nullptr) {
          const WeightEntry& e = plan_.find(bias);
          HIP_CHECK(hipMemset(buffer_.as<char>(e.offset), 0, e.bytes));
        }
  embed_ = matrix(m.embed);
  lm_head_ = matrix(m.lm_head.weight);
  // A tied lm_head keeps the embedding's whole placement: a rank reads its vocabulary rows of it.
  if (shard != nullptr && lm_head_.rows != shard->vocab.size()) {
    PARITY_CHECK(lm_head_.rows == m.config.vocab_size, "weights: lm_head of {} rows",
                 lm_head_.rows);
    lm_head_.data =
        static_cast<const char*>(lm_head_.data) +
        size_t(shard->vocab.begin) * size_t(lm_head_.cols) * dtype_size(m.lm_head.weight->dtype);
    lm_head_.rows = shard->vocab.size();
  }
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
  const WeightEntry& e = plan_.find(t);
  Matrix mm;
  mm.type = weight_type_of(*t);
  mm.data = buffer_.as<char>(e.offset);
  mm.rows = e.slice.rows.size();  // the rows and columns held
  mm.cols = e.slice.cols.size();
  return mm;
}

ExpertWeights DeviceWeights::experts(const ExpertLinear& w) const {
  ExpertWeights e;
  e.mxfp4 = w.layout == ExpertLayout::Mxfp4;
  const WeightSlice& held = plan_.find(e.mxfp4 ? w.blocks : w.dense).slice;
  e.experts = held.experts.size();
  e.out = held.rows.size();
  e.in = held.cols.size();
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
