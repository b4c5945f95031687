#include "device/runtime/host_group.h"

#include <algorithm>

#include "model/error.h"

namespace parity::device {

HostGroup::HostGroup(int size) : size_(size), buffers_(size_t(size > 0 ? size : 0)) {
  PARITY_CHECK(size >= 1, "host group of {} ranks: needs at least 1", size);
}

void HostGroup::arrive(std::unique_lock<std::mutex>& lock) {
  if (!broken_.empty()) {
    cv_.notify_all();  // the ranks waiting at this phase learn it too
    fail("{}", broken_);
  }
  const uint64_t phase = phase_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++phase_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return phase_ != phase || !broken_.empty(); });
  if (phase_ == phase) fail("{}", broken_);  // broken before every rank arrived
}

void HostGroup::all_reduce_sum(int rank, std::span<float> data) {
  PARITY_CHECK(rank >= 0 && rank < size_, "host group: rank {} of a group of {}", rank, size_);
  std::unique_lock<std::mutex> lock(mutex_);
  buffers_[size_t(rank)] = data;
  arrive(lock);  // every rank's buffer is known
  if (rank == 0) {
    const size_t n = buffers_[0].size();
    for (int r = 1; r < size_; ++r)
      if (buffers_[size_t(r)].size() != n && broken_.empty())
        broken_ = fmt::format("host group: rank {} all-reduces {} floats, rank 0 {}", r,
                              buffers_[size_t(r)].size(), n);
    if (broken_.empty()) {
      sum_.resize(n);
      for (size_t i = 0; i < n; ++i) {
        double s = 0;
        for (int r = 0; r < size_; ++r) s += double(buffers_[size_t(r)][i]);
        sum_[i] = float(s);
      }
    }
  }
  arrive(lock);  // rank 0 has summed (or broken the group)
  std::copy(sum_.begin(), sum_.end(), data.begin());
  arrive(lock);  // every rank has its copy before the next all-reduce overwrites the sum
}

void HostGroup::leave(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_.empty())
    broken_ = fmt::format("host group: rank {} left the group: {}", rank, reason);
  cv_.notify_all();
}

}  // namespace parity::device
