// A tensor-parallel group of ranks in one process: one communicator per GPU (nccl_group) and one
// thread per rank. run() calls fn(rank) on every rank's thread at once and returns when all have
// ended, so that each rank's collectives meet the others'. A rank that throws would leave the
// others waiting in a collective for it: on the first failure the group aborts its
// communicators (their collectives end with an error), rethrows that rank's error, and refuses
// every later run with it. The production engine (engine/tensor_parallel_runner.h) and the
// traced group backend (device/hip_group_backend.cpp) both drive their ranks through it.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/runtime/communicator.h"

namespace parity::device {

class RankGroup {
 public:
  // Rank i on GPU devices[i]. Throws parity::Error, one line, as nccl_group does.
  explicit RankGroup(std::span<const int> devices);
  ~RankGroup();  // the threads end first
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return int(comms_.size()); }
  Communicator* comm(int rank) const { return comms_.at(size_t(rank)).get(); }
  // fn(r) on every rank's thread at once; the first rank's exception after all have ended.
  void run(const std::function<void(int)>& fn);

 private:
  class Pool;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<Pool> pool_;
  std::string broken_;  // the error that stopped the group
};

}  // namespace parity::device
