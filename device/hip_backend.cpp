// The `hip` backend over the forward graph (model/forward.h): each stage call runs that stage's
// kernels (device/stage_launch.h, shared with the production engine), or none where an earlier
// fused kernel already wrote the stage's output, on the device runtime
// (device/runtime/runtime.h), which owns the weights, activations, KV cache and the step. Host
// code, compiled by the host compiler; the kernels live in the .hip files behind
// device/kernels.h.
//
// Fused kernels write every stage output they cover (device/fusion.h): when write() overwrites
// an output a covered part was computed from (injection, replay), the covered stage's run()
// recomputes that part with its own kernel. The MMA kernels' BF16 splits of an input are tracked
// by the runtime, and write() forgets them, so the consumer then splits the written values itself.
//
// An untraced step (forward() with no observer and no injection) comes as one run_step(): the
// same launches in the same order, through the runtime's step graphs (one captured graph per
// step shape, replayed). A traced step runs stage by stage, so each read sees that stage's own
// output of that layer.
#include "device/hip_backend.h"

#include <algorithm>
#include <bit>
#include <bitset>
#include <cstring>
#include <span>
#include <vector>

#include "device/build_facts.h"
#include "device/fusion.h"
#include "device/hip_compat.h"
#include "device/hip_stage_backend.h"
#include "device/kernels.h"
#include "device/runtime/runtime.h"
#include "device/stage_launch.h"
#include "model/error.h"
#include "model/forward.h"

namespace parity {
namespace device {

bool HipBackend::replays(Stage s, int layer) const {
  return !(s == Stage::attn_out && layer >= 0 && layer < c_.num_hidden_layers &&
           attention_mma_fuses(rt_.attention_shape(layer), rt_.precision()));
}

// The text and policy of the runtime's precision (DeviceOptions::precision).
std::string HipBackend::precision() const {
  const bool bf16 = rt_.precision() == Precision::bf16;
  return std::string(bf16 ? "bf16: " : "fp32: ") +
         "weights in checkpoint dtypes on the device (BF16/F16/F32 matrices, MXFP4 experts "
         "decoded exactly in-kernel; biases and sinks as exact float32 copies), float32 "
         "activations and KV cache, float32 accumulation with explicit fma in a fixed order, "
         "no other contraction (" PARITY_DEVICE_FP_CONTRACT
         "); MXFP4 experts and BF16 "
         "projections on BF16 MMA tiles " +
         (bf16 ? "with each input rounded once to BF16 (nearest even) and float32 "
                 "accumulation per block of 32; attention on BF16 MMA tiles (q, k, the "
                 "probabilities and v rounded once to BF16, float32 accumulation, the softmax "
                 "online in float32)"
               : "with exact products (weights exact in BF16, inputs split into three BF16 "
                 "parts summing exactly) and float32 accumulation per block of 32 and part, "
                 "the parts then added in float32") +
         "; precise expf/sinf/cosf/sqrtf";
}
// CUDA's and HIP's expf, sinf, cosf and sqrtf (no fast-math) are within 2 ulp; the policy
// allows twice that. bf16: the products' inputs are BF16 operands (the bf16-operands preset;
// it declares them for every product stage, attention's two included, and the GEMV of F16/F32
// weights, which rounds nothing: a bound, not the exact error).
PrecisionPolicy HipBackend::precision_policy() const {
  return rt_.precision() == Precision::bf16 ? PrecisionPolicy::preset("bf16-operands")
                                            : PrecisionPolicy::float32(4);
}

void HipBackend::begin_step(const Batch& b) {
  rt_.begin_step(b);  // validates; throws before anything changes
  batch_ = b;
  ran_.reset();
  overwritten_.reset();
  reduced_.reset();
}

void HipBackend::run(Stage s, int layer) {
  if (batch_.rows() == 0) fail("hip backend: run({}) before begin_step", parity::name(s));
  if (is_model_scope(s) ? layer != kModelLayer : (layer < 0 || layer >= c_.num_hidden_layers))
    fail("hip backend: run({}) at layer {}: out of range", parity::name(s), layer);
  ran_.set(size_t(s));
  ran_layer_[size_t(s)] = layer;
  // Was an output its covered part came from overwritten since? Then the stage recomputes it.
  const bool stale =
      covered_part_stale(s, [&](Stage w) { return overwritten_.test(size_t(w)); });
  // The rows written since, over the outputs that make the covered part stale.
  StaleRows rows{batch_.rows(), 0};
  if (const Fusion* f = fusion_of(s); stale && f != nullptr)
    for (Stage w : f->recompute_when)
      if (overwritten_.test(size_t(w))) {
        rows.first = std::min(rows.first, written_rows_[size_t(w)].first);
        rows.end = std::max(rows.end, written_rows_[size_t(w)].end);
      }
  overwritten_.reset(size_t(s));
  written_rows_[size_t(s)] = {};
  launch_stage(rt_, s, layer, stale ? StageCall::recompute : StageCall::traced, rows);
  if (rt_.reduced_floats() == 0)
    reduced_.reset();  // the logits' join took the parts
  else if (s == Stage::o_proj || s == Stage::moe_out)
    reduced_ = std::pair{s, layer};
}

bool HipBackend::run_step() {
  if (batch_.rows() == 0) fail("hip backend: run_step() before begin_step");
  rt_.run_step([&] {
    for (const auto& [layer, s] : sequence_) launch_stage(rt_, s, layer, StageCall::untraced);
  });
  for (const auto& [layer, s] : sequence_) {
    ran_.set(size_t(s));
    ran_layer_[size_t(s)] = layer;
  }
  reduced_.reset();
  return true;
}

std::optional<StageData> HipBackend::own_partial(Stage s, int layer, int row) {
  check_row("read", s, layer, row);
  const ShardPlan* p = rt_.shard();
  const int64_t H = c_.hidden_size, n = rt_.reduced_floats();
  if (p == nullptr || reduced_ != std::pair{s, layer} || n != int64_t(batch_.rows()) * H)
    return std::nullopt;
  StageData d;
  d.type = StageData::Type::F32;
  d.dims = {size_t(H)};
  d.f32.resize(size_t(H));
  const hipStream_t st = rt_.stream();
  HIP_CHECK(hipMemcpyAsync(d.f32.data(), rt_.reduced_parts() + int64_t(p->rank) * n + row * H,
                           size_t(H) * sizeof(float), hipMemcpyDeviceToHost, st));
  HIP_CHECK(hipStreamSynchronize(st));
  rt_.check_collectives();
  return d;
}

void HipBackend::check_row(const char* what, Stage s, int layer, int row) const {
  if (row < 0 || row >= batch_.rows())
    fail("hip backend: {}({}) row {} of {}", what, parity::name(s), row, batch_.rows());
  if (!ran_.test(size_t(s)) || ran_layer_[size_t(s)] != layer)
    fail("hip backend: {}({}, layer {}) before that stage ran in this step", what, parity::name(s),
         layer);
}

// The paged cache's rows of one layer, block by block (KvLayout: [slot][K, V][position in
// block][kv_dim] per block, float32 or BF16, widened exactly); a block a sliding layer released
// reads as zeros.
std::optional<KvRows> HipBackend::cache_rows(int seq, int layer, int first, int count) {
  const KvCachePool& kv = rt_.kv();
  const KvLayout& L = kv.layout();
  if (layer < 0 || layer >= c_.num_hidden_layers || first < 0 || count < 0 ||
      first + count > kv.blocks().length(seq))
    fail("hip: cache rows {}..{} of sequence {}, layer {}: not cached (length {})", first,
         first + count - 1, seq, layer, kv.blocks().length(seq));
  const int g = L.group_of_layer[size_t(layer)], slot = L.slot_of_layer[size_t(layer)];
  const size_t bs = size_t(L.block_size), kvd = size_t(L.kv_dim);
  const size_t elem = size_t(kv_dtype_bytes(L.dtype));
  const std::span<const int32_t> table = kv.blocks().table(seq, g);
  KvRows r;
  r.count = count;
  r.k.assign(size_t(count) * kvd, 0.0);
  r.v.assign(size_t(count) * kvd, 0.0);
  std::vector<unsigned char> block(2 * bs * kvd * elem);
  const auto element = [&](size_t i) -> double {
    if (L.dtype == KvDtype::bf16) {
      uint16_t b;
      std::memcpy(&b, block.data() + i * 2, 2);
      return double(std::bit_cast<float>(uint32_t(b) << 16));
    }
    float f;
    std::memcpy(&f, block.data() + i * 4, 4);
    return double(f);
  };
  const hipStream_t st = rt_.stream();
  for (int b = first >> L.block_shift; b <= (first + count - 1) >> L.block_shift && count > 0; ++b) {
    const int32_t id = table[size_t(b)];
    if (id == kNoBlock) continue;
    const auto* src = static_cast<const unsigned char*>(kv.data()) +
                      (size_t(id) * L.block_elements() + size_t(slot) * 2 * bs * kvd) * elem;
    HIP_CHECK(hipMemcpyAsync(block.data(), src, block.size(), hipMemcpyDeviceToHost, st));
    HIP_CHECK(hipStreamSynchronize(st));
    for (size_t i = 0; i < bs; ++i) {
      const int64_t pos = int64_t(b) * int64_t(bs) + int64_t(i);
      if (pos < first || pos >= first + count) continue;
      const size_t at = size_t(pos - first) * kvd;
      for (size_t e = 0; e < kvd; ++e) {
        r.k[at + e] = element(i * kvd + e);
        r.v[at + e] = element((bs + i) * kvd + e);
      }
    }
  }
  return r;
}

StageData HipBackend::read(Stage s, int layer, int row) {
  check_row("read", s, layer, row);
  StageData d;
  d.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
  size_t n = 1;
  for (size_t x : d.dims) n *= x;
  const hipStream_t st = rt_.stream();
  if (info(s).kind == ValueKind::Index) {
    d.type = StageData::Type::I32;
    d.i32.resize(n);
    HIP_CHECK(hipMemcpyAsync(d.i32.data(), index_out(s) + size_t(row) * n, n * sizeof(int32_t),
                             hipMemcpyDeviceToHost, st));
  } else {
    d.type = StageData::Type::F32;
    d.f32.resize(n);
    HIP_CHECK(hipMemcpyAsync(d.f32.data(), row_ptr(s, row), n * sizeof(float),
                             hipMemcpyDeviceToHost, st));
  }
  HIP_CHECK(hipStreamSynchronize(st));
  rt_.check_collectives();
  return d;
}

void HipBackend::write(Stage s, int layer, int row, const StageData& data) {
  check_row("write", s, layer, row);
  size_t n = 1;
  for (size_t x : stage_dims(c_, s, batch_.positions[size_t(row)])) n *= x;
  if (data.size() != n)
    fail("write {}: {} values for a row of {}", parity::name(s), data.size(), n);
  const hipStream_t st = rt_.stream();
  if (info(s).kind == ValueKind::Index) {
    std::vector<int32_t> idx(n);
    const double limit = s == Stage::sampled ? c_.vocab_size : c_.num_local_experts;
    for (size_t i = 0; i < n; ++i) {
      const double e = data.at(i);
      if (!(e >= 0 && e < limit)) fail("write {}: index {} out of range", parity::name(s), e);
      idx[i] = int32_t(e);
    }
    HIP_CHECK(hipMemcpyAsync(index_out(s) + size_t(row) * n, idx.data(), n * sizeof(int32_t),
                             hipMemcpyHostToDevice, st));
    HIP_CHECK(hipStreamSynchronize(st));
  } else {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(data.at(i));
    HIP_CHECK(
        hipMemcpyAsync(row_ptr(s, row), v.data(), n * sizeof(float), hipMemcpyHostToDevice, st));
    HIP_CHECK(hipStreamSynchronize(st));
  }
  if (!overwritten_.test(size_t(s))) written_rows_[size_t(s)] = {row, row + 1};
  overwritten_.set(size_t(s));
  written_rows_[size_t(s)].first = std::min(written_rows_[size_t(s)].first, row);
  written_rows_[size_t(s)].end = std::max(written_rows_[size_t(s)].end, row + 1);
  rt_.forget_split();  // the scratch may hold the split of what was just overwritten
}

}  // namespace device

std::unique_ptr<Backend> make_hip_backend(const Model& m, const device::DeviceOptions& options) {
  return std::make_unique<device::HipBackend>(m, options);
}

std::unique_ptr<Backend> make_hip_backend(const Model& m) {
  return make_hip_backend(m, device::device_options_from_environment());
}

}  // namespace parity
