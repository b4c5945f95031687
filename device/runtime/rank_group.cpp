#include "device/runtime/rank_group.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "model/error.h"

namespace parity::device {

// One thread per rank, each running fn(rank) of the job posted last; run() returns when every
// rank has ended. On the first failure `on_failure` runs while the other ranks may still wait in
// a collective, then the first failure (in time) is rethrown.
class RankGroup::Pool {
 public:
  explicit Pool(int ranks) : errors_(size_t(ranks)) {
    for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~Pool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void run(const std::function<void(int)>& fn, const std::function<void()>& on_failure) {
    std::unique_lock lock(m_);
    job_ = &fn;
    ++generation_;
    pending_ = int(threads_.size());
    failed_ = false;
    first_failed_ = -1;
    for (auto& e : errors_) e = nullptr;
    cv_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0 || failed_; });
    if (pending_ != 0) {  // a rank failed while others still run
      lock.unlock();
      on_failure();
      lock.lock();
      done_.wait(lock, [&] { return pending_ == 0; });
    }
    job_ = nullptr;
    if (first_failed_ >= 0) std::rethrow_exception(errors_[size_t(first_failed_)]);
  }

 private:
  void loop(int rank) {
    uint64_t seen = 0;
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*job)(rank);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      errors_[size_t(rank)] = error;
      if (error && !failed_) {  // the cause; the others' errors may only follow from it
        failed_ = true;
        first_failed_ = rank;
      }
      --pending_;
      done_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool failed_ = false, stop_ = false;
  int first_failed_ = -1;  // the rank whose failure came first
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

RankGroup::RankGroup(std::span<const int> devices, bool peer_all_reduce)
    : comms_(nccl_group(devices)),
      peers_(peer_all_reduce ? PeerGroup::open(devices) : nullptr),
      pool_(std::make_unique<Pool>(int(devices.size()))) {}

RankGroup::~RankGroup() = default;

void RankGroup::run(const std::function<void(int)>& fn) {
  if (!broken_.empty()) fail("tensor parallel: the group stopped after an error: {}", broken_);
  try {
    pool_->run(fn, [&] {
      if (peers_) peers_->abort();
      for (auto& comm : comms_) comm->abort();
    });
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
}

}  // namespace parity::device
