// The all-reduce of a tensor-parallel group whose ranks are threads of one process on the host
// (the host's stand-in for NCCL/RCCL, device/runtime/communicator.h): each rank's buffer becomes
// the sum of the group's buffers, added in rank order in float64 and rounded once, so every rank
// gets the same bits and they do not depend on which thread arrives first. A rank that fails
// leaves the group (leave()): every rank waiting in an all-reduce, and every later one, throws
// parity::Error naming it, instead of waiting forever.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace parity::device {

class HostGroup {
 public:
  explicit HostGroup(int size);  // size >= 1
  int size() const { return size_; }

  // Called by each rank once per all-reduce, with buffers of the same length on every rank;
  // returns when every rank's buffer holds the sum. Throws parity::Error when a rank has left the
  // group or the ranks' lengths differ (the group is then left, every rank throwing).
  void all_reduce_sum(int rank, std::span<float> data);
  // Rank `rank` leaves the group for `reason` (one line): the all-reduces fail from now on.
  void leave(int rank, const std::string& reason);

 private:
  // Waits until every rank has arrived at this phase (or the group is broken: throws).
  void arrive(std::unique_lock<std::mutex>& lock);

  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::span<float>> buffers_;
  std::vector<float> sum_;
  int arrived_ = 0;
  uint64_t phase_ = 0;
  std::string broken_;  // why the group is broken; "" while it is not
};

}  // namespace parity::device
