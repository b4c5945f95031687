#include "engine/tensor_parallel_runner.h"

#include <fmt/format.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "device/runtime/communicator.h"
#include "engine/device_runner.h"
#include "model/error.h"

namespace parity {
namespace {

// One thread per rank, each running fn(rank) of the job posted last; run() returns when every
// rank has ended. A rank that throws leaves the others waiting in a collective for it: on the
// first failure `on_failure` runs (the runner aborts the group's communicators, which ends their
// collectives with an error), then the first failure is rethrown.
class RankPool {
 public:
  explicit RankPool(int ranks) : errors_(size_t(ranks)) {
    for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankPool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  RankPool(const RankPool&) = delete;
  RankPool& operator=(const RankPool&) = delete;

  void run(const std::function<void(int)>& fn, const std::function<void()>& on_failure) {
    std::unique_lock lock(m_);
    job_ = &fn;
    ++generation_;
    pending_ = int(threads_.size());
    failed_ = false;
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
    for (const auto& e : errors_)
      if (e) std::rethrow_exception(e);
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
      if (error) failed_ = true;
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
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

class TensorParallelRunner final : public StepRunner {
 public:
  TensorParallelRunner(const Model& m, const device::DeviceOptions& o, std::span<const int> devices,
                       bool kernel_times)
      : c_(m.config),
        comms_(device::nccl_group(devices)),
        pool_(std::make_unique<RankPool>(int(devices.size()))) {
    const int n = int(devices.size());
    ranks_.resize(size_t(n));
    on_ranks([&](int r) {
      device::DeviceOptions ro = o;
      ro.device = devices[size_t(r)];
      ro.tensor_parallel.degree = n;
      ro.tensor_parallel.rank = r;
      ro.tensor_parallel.experts_split = device::ExpertSplit::by_intermediate;
      ro.tensor_parallel.comm = comms_[size_t(r)].get();
      if (r != 0) ro.log = nullptr;
      ranks_[size_t(r)] = make_device_runner(m, ro, kernel_times);
    });
    for (const auto& rank : ranks_)
      if (rank->kv_blocks() != ranks_[0]->kv_blocks())
        fail("tensor parallel: rank 0 holds {} KV blocks, another rank {}: give --kv-memory",
             ranks_[0]->kv_blocks(), rank->kv_blocks());
  }
  ~TensorParallelRunner() override {
    pool_.reset();  // the rank threads end before their runners go
    ranks_.clear();
  }

  std::string name() const override {
    std::string out = fmt::format("tensor parallel over {} GPUs", ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r)
      out += fmt::format("{} rank {} on {}", r == 0 ? ":" : ",", r, ranks_[r]->name());
    return out;
  }
  const Config& config() const override { return c_; }
  int max_context() const override { return ranks_[0]->max_context(); }
  int kv_blocks() const override { return ranks_[0]->kv_blocks(); }
  int kv_block_size() const override { return ranks_[0]->kv_block_size(); }

  std::vector<TokenId> step(const Batch& batch, std::span<const RowSample> samples,
                            const SamplingParams& sampling) override {
    std::vector<std::vector<TokenId>> tokens(ranks_.size());
    on_ranks([&](int r) { tokens[size_t(r)] = ranks_[size_t(r)]->step(batch, samples, sampling); });
    for (size_t r = 1; r < ranks_.size(); ++r)
      PARITY_CHECK(tokens[r] == tokens[0],
                   "tensor parallel: rank {} sampled other tokens than rank 0", r);
    return tokens[0];
  }
  // Host bookkeeping of each rank's KV blocks (no step is in flight between steps).
  void release(int seq) override {
    for (auto& rank : ranks_) rank->release(seq);
  }
  void reset() override {
    for (auto& rank : ranks_) rank->reset();
  }
  std::string kernel_times() const override { return ranks_[0]->kernel_times(); }
  std::string launches() const override { return ranks_[0]->launches(); }

 private:
  // fn(r) on every rank's thread at once; a rank's exception after all have ended. A failed
  // rank aborts the group (the others' collectives end instead of waiting for it), which then
  // runs nothing more.
  void on_ranks(const std::function<void(int)>& fn) {
    if (!broken_.empty()) fail("tensor parallel: the group stopped after an error: {}", broken_);
    try {
      pool_->run(fn, [&] {
        for (auto& comm : comms_) comm->abort();
      });
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw;
    }
  }

  const Config& c_;
  std::vector<std::unique_ptr<device::Communicator>> comms_;
  std::vector<std::unique_ptr<StepRunner>> ranks_;
  std::unique_ptr<RankPool> pool_;
  std::string broken_;  // the error that stopped the group
};

}  // namespace

std::unique_ptr<StepRunner> make_tensor_parallel_runner(const Model& m,
                                                        const device::DeviceOptions& o,
                                                        std::span<const int> devices,
                                                        bool kernel_times) {
  return std::make_unique<TensorParallelRunner>(m, o, devices, kernel_times);
}

}  // namespace parity
