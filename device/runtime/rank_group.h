// A tensor-parallel group of ranks in one process: one communicator per GPU (nccl_group), the
// peer-store all-reduce where the GPUs reach each other's memory (device/runtime/peer_group.h),
// and one thread per rank. run() calls fn(rank) on every rank's thread at once and returns when all
// have ended, so that each rank's collectives meet the others'. A rank that throws would leave the
// others waiting in a collective for it: on the first failure the group aborts its
// communicators and its peer all-reduce (their waits end with an error), rethrows the error of the
// rank that failed first, and refuses every later run with it. The production engine
// (engine/tensor_parallel_runner.h) and the traced group backend (device/hip_group_backend.cpp)
// both drive their ranks through it.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/runtime/communicator.h"
#include "device/runtime/peer_group.h"

namespace parity::device {

class RankGroup {
 public:
  // Rank i on GPU devices[i]; `peer_all_reduce`: the peer-store all-reduce where the GPUs allow
  // it (else every all-reduce is NCCL's all-gather and a sum). Throws parity::Error, one line, as
  // nccl_group does.
  explicit RankGroup(std::span<const int> devices, bool peer_all_reduce = true);
  ~RankGroup();  // the threads end first
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return int(comms_.size()); }
  Communicator* comm(int rank) const { return comms_.at(size_t(rank)).get(); }
  // The rank's part of the peer all-reduce; null when the group has none.
  const PeerRank* peers(int rank) const { return peers_ ? peers_->rank(rank) : nullptr; }
  // fn(r) on every rank's thread at once; the first rank's exception after all have ended.
  void run(const std::function<void(int)>& fn);

 private:
  class Pool;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<PeerGroup> peers_;
  std::unique_ptr<Pool> pool_;
  std::string broken_;  // the error that stopped the group
};

}  // namespace parity::device
