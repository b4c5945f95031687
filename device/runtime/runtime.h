// One model on one device: the pieces a forward pass runs on, set up in order -- the device,
// a stream, the memory plan (refused with the sizes when it does not fit), the weights, the
// activation arena, the paged KV pool -- and the step: begin_step() validates a batch, pages its
// KV blocks, grows the arena if the step needs it (the only allocation, between steps) and
// uploads the step's rows. The parity backend (device/hip_backend.cpp) and the production engine
// both run their kernels over it.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "device/kernel_types.h"
#include "device/runtime/activation_arena.h"
#include "device/runtime/device.h"
#include "device/runtime/device_weights.h"
#include "device/runtime/kv_cache_pool.h"
#include "device/runtime/memory_report.h"
#include "device/runtime/options.h"
#include "device/runtime/shard_plan.h"
#include "device/runtime/step.h"
#include "device/runtime/step_graphs.h"
#include "device/runtime/stream.h"
#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity::device {

class DeviceRuntime {
 public:
  // Opens options.device, plans the memory (MemoryReport; options.log gets its text), throws
  // parity::Error with the sizes when the model does not fit, then uploads the weights and
  // allocates the arena and the KV pool. `m` must outlive the runtime.
  DeviceRuntime(const Model& m, const DeviceOptions& options);
  ~DeviceRuntime();
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;

  // Makes `b` the current step: validates it (nothing changes when it is refused), takes and
  // releases KV blocks, grows the arena when needed (the step graphs then go: they launch on the
  // old buffers), uploads the rows and block tables.
  void begin_step(const Batch& b);
  // Launches the current step's kernels: `launch` enqueues every one of them on stream(), from
  // the state begin_step leaves (no split scratch holding anything). With graphs on (the option,
  // and no synchronization after every launch) through StepGraphs: a step of the previous step's
  // shape is captured once and replayed after; else directly. Only an untraced step comes here:
  // nothing may be read or written between its kernels.
  StepGraphs::Launch run_step(const std::function<void()>& launch);
  // The largest position the attention kernels' grids cover in this step: the step's largest
  // position rounded up to a multiple of kLaunchPositions (less one; at most the context's
  // last), so that one step graph serves kLaunchPositions consecutive decode positions. A block
  // past its own row's position exits at once: no value depends on the bound.
  static constexpr int kLaunchPositions = 256;
  int launch_max_pos() const;
  const StepGraphs& graphs() const { return graphs_; }
  void release(int seq) { kv_->blocks().release(seq); }  // a finished sequence's blocks
  void clear() { kv_->blocks().clear(); }                // every sequence
  // Every call runs on the calling thread's current device: a thread that drives runtimes of
  // several devices makes each current before using it.
  void make_current() const;

  // The model as this runtime computes it: rank_config of its shard under tensor parallel
  // (its heads, its experts' intermediate slice), else the model's.
  const Config& config() const { return c_; }
  const Device& device() const { return device_; }
  hipStream_t stream() const { return stream_.get(); }
  const DeviceWeights& weights() const { return *weights_; }
  const ActivationArena& arena() const { return *arena_; }
  const KvCachePool& kv() const { return *kv_; }
  const Step& step() const { return step_; }
  const MemoryReport& memory() const { return memory_; }
  int max_context() const { return max_context_; }
  // The products' precision every stage's launch reads (DeviceOptions::precision).
  Precision precision() const { return options_.precision; }

  // Tensor parallel (DeviceOptions::tensor_parallel): this rank's part of the model; null for
  // the whole model.
  const ShardPlan* shard() const { return shard_ ? &*shard_ : nullptr; }
  // The group's all-reduce of a partial sum on the stream: data (n floats, this rank's part)
  // becomes the ranks' parts added in rank order (the same bits on every rank and in any batch),
  // and with resid_out, resid_out = residual + data. Under tensor parallel only.
  void all_reduce(float* data, int64_t n, const float* residual, float* resid_out);
  // The last all_reduce's partial sums as the group gathered them: rank r's part, that call's n
  // floats, at reduced_parts() + r n (the tracer reads them; waits for the stream); overwritten
  // by the next all_reduce or join_logits. reduced_floats() is that n, 0 when the parts hold
  // something else.
  const float* reduced_parts() const;
  int64_t reduced_floats() const { return reduced_floats_; }
  // After the stream was waited for: throws parity::Error, one line, when an all-reduce of the
  // peer path ended without every rank (a rank that never came, or the group given up), so that
  // no output of that step is taken.
  void check_collectives() const;
  // lm_head's vocabulary shards of the rows [r0, r0 + n) of final_norm into full rows of logits,
  // n <= kJoinRows: `launch` writes this rank's shard, rows of shard()->vocab.size() floats, to
  // the pointer it gets; then the group gathers the shards and joins them into logits (n rows of
  // the vocabulary). Under tensor parallel only.
  static constexpr int kJoinRows = kShardJoinRows;
  void join_logits(int n, const std::function<void(float* shard)>& launch, float* logits);

  // The attention shape and KV place of `layer`, and the kernels' view of the KV cache for the
  // current step.
  AttentionShape attention_shape(int layer) const;
  KvCacheView kv_view() const { return kv_->view(step_.device_block_tables()); }

  // Device facts plus the runtime's sizes, as traces record them.
  nlohmann::json facts() const;

  // Which stage output (of which layer) each of the arena's split-input scratches
  // (ActivationArena::split_of) holds, written there with it by its producer (the norms, the
  // attention output, mlp1's SwiGLU epilogue), so that the MMA kernel reading it next launches no
  // split. launch_stage records and asks; forgotten when a step begins, when a kernel splits
  // another input into that scratch (forget_split(s): the scratch of s), and when a stage output
  // is written from the host (forget_split()).
  bool split_holds(Stage s, int layer) const {
    const auto& src = split_source_[size_t(split_scratch_of(s))];
    return src.has_value() && src->first == s && src->second == layer;
  }
  void set_split_source(Stage s, int layer) {
    split_source_[size_t(split_scratch_of(s))] = std::pair{s, layer};
  }
  void forget_split(Stage s) { split_source_[size_t(split_scratch_of(s))].reset(); }
  void forget_split() {
    for (auto& src : split_source_) src.reset();
  }

 private:
  void check_kernel_limits(const std::string& model) const;
  void reserve_join(int rows);  // the all-reduces' parts for steps of `rows` rows

  std::optional<ShardPlan> shard_;
  Config c_;
  DeviceOptions options_;
  Device device_;
  int max_context_ = 0;
  Stream stream_;
  MemoryReport memory_;
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<ActivationArena> arena_;
  std::unique_ptr<KvCachePool> kv_;
  Step step_;
  std::array<std::optional<std::pair<Stage, int>>, 2> split_source_;
  DeviceBuffer join_parts_;  // tensor parallel: the ranks' gathered parts
  int64_t join_floats_ = 0;  // floats of one rank's part in join_parts_
  int64_t reduced_floats_ = 0;  // what join_parts_ holds: the last all_reduce's n, or 0
  bool reduced_by_peers_ = false;  // the last all_reduce took the peer path: its parts are there
  StepGraphs graphs_;  // destroyed before the stream (the destructor waits for it first)
};

}  // namespace parity::device
