// How the device runtime is set up: which device, how much memory the KV cache and the
// activations may take, and where the runtime reports. Host-only (no GPU toolkit needed).
//
// The runtime reads no environment variable. device_options_from_environment() is the one place
// that does, for the tools and the `hip` backend's environment factory (make_hip_backend(model));
// the production engine fills DeviceOptions itself.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "device/kernel_types.h"
#include "device/runtime/shard_plan.h"

namespace parity {
struct Config;
}

namespace parity::device {

class Communicator;
class PeerRank;

// How a tensor-parallel group's all-reduces cross between its GPUs: `peer`, each rank's partial
// sums stored into its peers' memory by one kernel (device/runtime/peer_group.h) where the GPUs
// allow it and the sums fit, NCCL's all-gather otherwise; `nccl`, NCCL's all-gather always.
// Both add the parts in rank order: the same bits.
enum class AllReduce : int { peer, nccl };
const char* all_reduce_name(AllReduce a);
// "peer" or "nccl"; throws parity::Error naming the choices otherwise.
AllReduce parse_all_reduce(const std::string& name, const char* option);

inline constexpr int kDefaultMaxContext = 4096;  // positions per sequence unless asked otherwise
inline constexpr int kDefaultArenaRows = 64;     // parity-trace's default rows per step
inline constexpr int kDefaultKvBlockSize = 32;   // positions per KV-cache block
// The environment factory sizes the KV pool for this many sequences of max_context positions:
// the parity tools run two (the free-running one and its replay), with room to spare.
inline constexpr int kEnvironmentKvSequences = 4;

struct DeviceOptions {
  // Device index; -1: the current device (as HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES leave it).
  int device = -1;
  // Positions per sequence: the KV cache's and the step validator's limit; 0: min(4096, the
  // model's context).
  int max_context = 0;
  // The paged KV cache: positions per block (a power of two), and the pool's size. kv_bytes > 0:
  // that many bytes; else kv_sequences > 0: room for that many sequences of max_context
  // positions; else kv_free_fraction of the memory left free after the weights and activations.
  int kv_block_size = kDefaultKvBlockSize;
  size_t kv_bytes = 0;
  int kv_sequences = 0;
  double kv_free_fraction = 0.9;
  // Activations: sized first for arena_rows rows per step, grown (between steps) for a larger
  // step up to max_step_rows rows (0: no limit).
  int arena_rows = kDefaultArenaRows;
  int max_step_rows = 0;
  // Synchronize after every kernel launch so that a fault names its kernel (debugging; process
  // wide once on).
  bool sync_after_launch = false;
  // Untraced steps launched as captured graphs (device/runtime/step_graphs.h): one launch per
  // step instead of one per kernel. Off with sync_after_launch (a graph cannot synchronize
  // between its kernels).
  bool graphs = true;
  // The products' precision (device/kernel_types.h): fp32 exact, or bf16 inputs.
  Precision precision = Precision::fp32;
  // Tensor parallel (device/runtime/shard_plan.h): this runtime is rank `rank` of a group of
  // `degree` GPUs that split the model (experts split by `experts_split`; only by_intermediate
  // runs), joined by `comm` (its rank and size these; it outlives the runtime), and by `peers`
  // where the group's GPUs reach each other's memory (device/runtime/peer_group.h: the
  // all-reduces that fit it; null: NCCL's all-gather for all). Degree 1: the whole model.
  struct TensorParallel {
    int degree = 1, rank = 0;
    ExpertSplit experts_split = ExpertSplit::by_intermediate;
    Communicator* comm = nullptr;
    const PeerRank* peers = nullptr;
    AllReduce all_reduce = AllReduce::peer;  // what a group built for these options sets up
  } tensor_parallel;
  // Verbose messages (the memory report at load); null: silent.
  std::function<void(const std::string&)> log;

  // Throws parity::Error naming the field that is out of range.
  void validate() const;
  // max_context resolved against the model: the value, or min(4096, the model's context);
  // throws when it exceeds the model's context.
  int resolve_max_context(const Config& c) const;
};

// DeviceOptions from the environment, for the tools (the only getenv of the device code):
//   PARITY_DEVICE_MAX_CONTEXT  positions per sequence (default min(4096, the model's context))
//   PARITY_DEVICE_ROWS         rows per step the activations are first sized for (default 64)
//   PARITY_DEVICE_KV_BYTES     KV pool size in bytes, with an optional K, M or G suffix (powers
//                              of 1024), or "free" for 90 % of the free memory; default: room
//                              for 4 sequences of the context
//   PARITY_DEVICE_SYNC         1: synchronize after every launch (names a faulting kernel)
//   PARITY_DEVICE_PRECISION    fp32 (default) or bf16: the products' precision (the tools'
//                              --precision sets it)
//   PARITY_DEVICE_GRAPHS       0: launch every kernel of an untraced step on its own (default 1:
//                              the step as one captured graph)
// The memory report at load goes to standard error. The device is the current one.
DeviceOptions device_options_from_environment();

// "fp32", "bf16".
std::string_view precision_name(Precision p);
std::vector<std::string_view> precision_names();
// The precision `name` names; throws parity::Error "<option> NAME: not a precision (fp32, bf16)"
// (the name quoted, capped) otherwise.
Precision parse_precision(std::string_view name, std::string_view option);

// The parser behind its counts, on a value given as text (`name` is the variable, for the
// message); byte sizes are read by parity::parse_byte_size (model/untrusted.h).
int parse_positive_int(const std::string& value, const char* name);

}  // namespace parity::device
