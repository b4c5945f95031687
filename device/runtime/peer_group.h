// The all-reduce of a tensor-parallel group without NCCL, for ranks that are threads of one
// process on GPUs that reach each other's memory (NVLink or PCIe peer access on NVIDIA; xGMI on
// AMD): each rank stores its partial sums straight into every rank's parts buffer, raises a flag
// there, waits for every rank's flag, and adds the parts in rank order
// (launch_f32_peer_rank_sum_residual): one kernel and one crossing of the link, where the
// all-gather path (DeviceRuntime::all_reduce) takes NCCL's kernel and protocol and then a kernel
// for the sum. The parts and the rank-order sum are the all-gather path's, so the bits are too.
// lm_head's vocabulary shards are joined the same way (launch_f32_peer_vocab_join).
//
// The group is set up once for its GPUs, before their runtimes (open); a runtime takes its rank
// (DeviceOptions::TensorParallel::peers) and uses it for every all-reduce and join of at most
// capacity() floats a rank, the all-gather path above that. A wait is bounded: when the group is
// given up (abort, from the rank group on a rank's failure) or a rank does not arrive within the
// timeout, the waiting kernels end without their outputs, and check() says so on the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/kernel_types.h"
#include "device/runtime/device_buffer.h"

namespace parity::device {

class PeerGroup;

// One rank's view of the group: the places its kernel touches.
class PeerRank {
 public:
  int rank() const { return view_.rank; }
  // Floats of a rank's part: the largest all-reduce this path takes.
  int64_t capacity() const { return view_.capacity; }
  // Whether an all-reduce of n floats goes this way (n fits, and is whole float4s).
  bool takes(int64_t n) const { return n > 0 && n % 4 == 0 && n <= view_.capacity; }
  // launch_f32_peer_rank_sum_residual on `stream` (this rank's GPU current).
  void all_reduce(const float* data, int64_t n, const float* residual, float* sum, float* resid_out,
                  hipStream_t stream) const;
  // launch_f32_peer_vocab_join on `stream`: this rank's vocabulary shard (a part of `part`
  // floats, takes(part)) into full rows of logits.
  void join_vocab(const float* shard, int64_t part, int rows, int vocab, float* logits,
                  hipStream_t stream) const;
  // The parts of the last all_reduce on `stream` (waits for it): rank r's n floats at + r n.
  const float* last_parts(hipStream_t stream) const;
  // Throws parity::Error, one line, when a wait of this rank ended without its peer (timed out,
  // naming the rank it waited for, or the group was given up).
  void check() const;

 private:
  friend class PeerGroup;
  PeerReduceView view_;
  const PeerGroup* group_ = nullptr;
};

class PeerGroup {
 public:
  // Floats of each rank's part (1 MiB): a step of up to 91 rows of the 20b's and 120b's hidden
  // size of 2880.
  static constexpr int64_t kPartFloats = int64_t(1) << 18;
  static constexpr double kDefaultTimeoutSeconds = 60;
  // Device bytes a rank of a group of `ranks` holds for it.
  static size_t bytes_per_rank(int ranks);

  // The group of ranks on `devices` (rank i on devices[i]), or null when it cannot be: fewer than
  // two or more than kPeerMaxRanks GPUs, or a pair of them that cannot reach each other's memory
  // (then the group's all-reduces take the all-gather path). Enables peer access between every
  // pair. Throws parity::Error, one line, when the runtime fails.
  static std::unique_ptr<PeerGroup> open(std::span<const int> devices,
                                         double timeout_seconds = kDefaultTimeoutSeconds);
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  int size() const { return int(ranks_.size()); }
  const PeerRank* rank(int r) const { return &ranks_.at(size_t(r)); }
  double timeout_seconds() const { return timeout_seconds_; }
  // Ends every wait of the group's kernels, those running and those to come; callable from any
  // thread. The group is of no further use.
  void abort();
  bool aborted() const;

 private:
  PeerGroup() = default;
  // Host-mapped words the kernels read and write: [0] abort, [1 + r] rank r's failure.
  static constexpr size_t kStatusWords = 1 + kPeerMaxRanks;
  uint32_t* status_ = nullptr;  // pinned, mapped, portable
  std::vector<int> devices_;
  std::vector<DeviceBuffer> memory_;  // per rank: parts of both parities, flags, epochs
  std::vector<PeerRank> ranks_;
  double timeout_seconds_ = kDefaultTimeoutSeconds;
};

}  // namespace parity::device
