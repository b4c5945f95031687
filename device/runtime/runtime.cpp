#include "device/runtime/runtime.h"

#include <algorithm>
#include <cmath>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/runtime/communicator.h"
#include "device/runtime/peer_group.h"
#include "model/error.h"

namespace parity::device {

namespace {

std::optional<ShardPlan> shard_of(const Config& c, const DeviceOptions& o) {
  o.validate();
  const DeviceOptions::TensorParallel& tp = o.tensor_parallel;
  if (tp.degree == 1) return std::nullopt;
  if (tp.comm->size() != tp.degree || tp.comm->rank() != tp.rank)
    fail("tensor parallel: rank {} of {} given the communicator of rank {} of {}", tp.rank,
         tp.degree, tp.comm->rank(), tp.comm->size());
  if (tp.peers != nullptr && tp.peers->rank() != tp.rank)
    fail("tensor parallel: rank {} given the peer all-reduce of rank {}", tp.rank,
         tp.peers->rank());
  return ShardPlan::of(c, tp.degree, tp.rank, tp.experts_split);
}

}  // namespace

DeviceRuntime::DeviceRuntime(const Model& m, const DeviceOptions& options)
    : shard_(shard_of(m.config, options)),
      c_(shard_ ? rank_config(m.config, *shard_) : m.config),
      options_(options),
      device_(Device::open(options.device)),
      max_context_(options.resolve_max_context(m.config)) {
  if (options_.sync_after_launch) enable_sync_after_launch();
  check_kernel_limits(m.dir);
  WeightPlan plan = shard_ ? plan_weights(m, *shard_) : plan_weights(m);
  memory_ = MemoryReport::plan(options_, c_, max_context_, plan, device_.describe(),
                               device_.free_bytes(), device_.total_bytes, shard());
  if (options_.log) options_.log(memory_.text());
  if (const std::string why = memory_.refusal(m.dir); !why.empty()) throw Error(why);

  weights_ = std::make_unique<DeviceWeights>(m, std::move(plan), shard());
  arena_ = std::make_unique<ActivationArena>(c_, max_context_, options_.arena_rows,
                                             scores_floats_for_one_row(c_, max_context_),
                                             options_.max_step_rows);
  kv_ = std::make_unique<KvCachePool>(memory_.kv, memory_.kv_blocks, max_context_, stream_.get());
  reserve_join(options_.arena_rows);
  stream_.synchronize();
}

void DeviceRuntime::reserve_join(int rows) {
  if (!shard_) return;
  const int64_t floats = shard_join_floats(c_, shard_->degree, rows, kJoinRows);
  if (floats <= join_floats_) return;
  stream_.synchronize();  // no kernel reads the old parts
  join_parts_.allocate(size_t(floats) * size_t(shard_->degree) * sizeof(float));
  join_floats_ = floats;
  reduced_floats_ = 0;
  graphs_.clear();  // they launch on the old buffer
}

void DeviceRuntime::all_reduce(float* data, int64_t n, const float* residual, float* resid_out) {
  PARITY_CHECK(shard_ && n <= join_floats_, "all_reduce of {} floats (parts of {})", n,
               join_floats_);
  reduced_floats_ = n;
  const PeerRank* peers = options_.tensor_parallel.peers;
  reduced_by_peers_ = peers != nullptr && peers->takes(n);
  if (reduced_by_peers_) {
    peers->all_reduce(data, n, residual, data, resid_out, stream_.get());
    return;
  }
  float* parts = join_parts_.as<float>();
  options_.tensor_parallel.comm->all_gather(data, parts, size_t(n), stream_.get());
  launch_f32_rank_sum_residual(parts, shard_->degree, n, residual, data, resid_out, stream_.get());
}

const float* DeviceRuntime::reduced_parts() const {
  if (reduced_by_peers_) return options_.tensor_parallel.peers->last_parts(stream_.get());
  return join_parts_.as<float>();
}

void DeviceRuntime::check_collectives() const {
  if (const PeerRank* peers = options_.tensor_parallel.peers) peers->check();
}

void DeviceRuntime::join_logits(int n, const std::function<void(float* shard)>& launch,
                                float* logits) {
  PARITY_CHECK(shard_ && n >= 1 && n <= kJoinRows, "join_logits of {} rows", n);
  float* parts = join_parts_.as<float>();
  // Each rank's shard at its place in the gathered parts (in place): n rows of its vocabulary
  // rows, in parts of n rows of the largest shard.
  const int64_t part =
      int64_t(n) * ((int64_t(c_.vocab_size) + shard_->degree - 1) / shard_->degree);
  float* own = parts + int64_t(shard_->rank) * part;
  reduced_floats_ = 0;
  reduced_by_peers_ = false;
  launch(own);
  if (const PeerRank* peers = options_.tensor_parallel.peers;
      peers != nullptr && peers->takes(part)) {
    peers->join_vocab(own, part, n, c_.vocab_size, logits, stream_.get());
    return;
  }
  options_.tensor_parallel.comm->all_gather(own, parts, size_t(part), stream_.get());
  launch_f32_vocab_join(parts, shard_->degree, n, c_.vocab_size, part, logits, stream_.get());
}

DeviceRuntime::~DeviceRuntime() {
  (void)hipStreamSynchronize(stream_.get());
}

void DeviceRuntime::check_kernel_limits(const std::string& model) const {
  const int g = c_.heads_per_kv(), d = c_.head_dim;
  if (g * d > 1024)
    fail(
        "{}: {} query heads per KV head of dimension {} exceed the attention kernel's block of "
        "1024 threads",
        model, g, d);
  if (c_.num_local_experts > 256)
    fail("{}: {} experts exceed the router kernel's limit of 256", model, c_.num_local_experts);
  if (c_.hidden_size > kRouterMaxInputs)
    fail("{}: hidden size {} exceeds the router kernel's staged input of {}", model,
         c_.hidden_size, kRouterMaxInputs);
  if (c_.num_experts_per_tok > 32)
    fail("{}: {} experts per token exceed the router kernel's limit of 32", model,
         c_.num_experts_per_tok);
}

void DeviceRuntime::begin_step(const Batch& b) {
  if (options_.max_step_rows > 0 && b.rows() > options_.max_step_rows)
    fail("device runtime: a step of {} rows exceeds the limit of {} rows per step", b.rows(),
         options_.max_step_rows);
  kv_->blocks().begin_step(b, c_);  // validates; throws before anything changes
  StepLayout layout = build_step(b, c_, kv_->blocks());
  // Both wait for the stream before they move a buffer, so no graph is in flight then.
  const bool arena_moved = arena_->reserve(b.rows(), layout.scores_floats, stream_.get());
  const bool step_moved = step_.upload(std::move(layout), stream_.get());
  reserve_join(b.rows());
  if (arena_moved || step_moved) graphs_.clear();
  forget_split();
}

int DeviceRuntime::launch_max_pos() const {
  const int64_t covered =
      (int64_t(step_.max_pos()) + kLaunchPositions) / kLaunchPositions * kLaunchPositions;
  return int(std::min<int64_t>(covered, max_context_)) - 1;
}

StepGraphs::Launch DeviceRuntime::run_step(const std::function<void()>& launch) {
  forget_split();
  if (!options_.graphs || options_.sync_after_launch) return graphs_.direct(launch);
  const QueryTiles tiles = step_.device_query_tiles();
  const StepGraphs::Launch how = graphs_.run(
      StepShape{step_.rows(), launch_max_pos(), tiles.count, tiles.singles}, stream_.get(), launch);
  // A replay leaves the host's record of the split scratches as it was; forgetting them is
  // always safe (a consumer then splits its input itself).
  if (how == StepGraphs::Launch::replayed) forget_split();
  return how;
}

void DeviceRuntime::make_current() const {
  HIP_CHECK(hipSetDevice(device_.index));
}

AttentionShape DeviceRuntime::attention_shape(int layer) const {
  AttentionShape a;
  a.n_heads = c_.num_attention_heads;
  a.n_kv = c_.num_key_value_heads;
  a.head_dim = c_.head_dim;
  a.window = c_.sliding(layer) ? c_.sliding_window : 0;
  a.max_context = max_context_;
  a.kv_group = kv_->layout().group_of_layer.at(size_t(layer));
  a.kv_slot = kv_->layout().slot_of_layer.at(size_t(layer));
  a.scale = float(1.0 / std::sqrt(double(c_.head_dim)));
  return a;
}

nlohmann::json DeviceRuntime::facts() const {
  nlohmann::json f = device_.facts();
  f["max_context"] = max_context_;
  f["weights_bytes"] = weights_->bytes();
  f["kv_block_size"] = kv_->layout().block_size;
  f["kv_blocks"] = kv_->blocks().num_blocks();
  f["kv_bytes"] = kv_->bytes();
  f["kv_dtype"] = std::string(kv_dtype_name(kv_->layout().dtype));
  f["step_graphs"] = options_.graphs && !options_.sync_after_launch;
  f["precision"] = std::string(precision_name(options_.precision));
  if (shard_) {
    f["tensor_parallel"] = shard_->degree;
    f["tensor_parallel_rank"] = shard_->rank;
    f["experts_split"] = expert_split_name(shard_->experts_split);
  }
  return f;
}

}  // namespace parity::device
