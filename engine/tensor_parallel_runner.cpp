#include "engine/tensor_parallel_runner.h"

#include <fmt/format.h>

#include <functional>
#include <vector>

#include "device/runtime/rank_group.h"
#include "engine/device_runner.h"
#include "model/error.h"

namespace parity {
namespace {

class TensorParallelRunner final : public StepRunner {
 public:
  TensorParallelRunner(const Model& m, const device::DeviceOptions& o, std::span<const int> devices,
                       bool kernel_times)
      : c_(m.config), group_(devices, o.tensor_parallel.all_reduce == device::AllReduce::peer) {
    const int n = int(devices.size());
    ranks_.resize(size_t(n));
    on_ranks([&](int r) {
      device::DeviceOptions ro = o;
      ro.device = devices[size_t(r)];
      ro.tensor_parallel.degree = n;
      ro.tensor_parallel.rank = r;
      ro.tensor_parallel.experts_split = device::ExpertSplit::by_intermediate;
      ro.tensor_parallel.comm = group_.comm(r);
      ro.tensor_parallel.peers = group_.peers(r);
      if (r != 0) ro.log = nullptr;
      ranks_[size_t(r)] = make_device_runner(m, ro, kernel_times);
    });
    for (const auto& rank : ranks_)
      if (rank->kv_blocks() != ranks_[0]->kv_blocks())
        fail("tensor parallel: rank 0 holds {} KV blocks, another rank {}: give --kv-memory",
             ranks_[0]->kv_blocks(), rank->kv_blocks());
  }

  std::string name() const override {
    std::string out = fmt::format("tensor parallel over {} GPUs ({} all-reduce)", ranks_.size(),
                                  group_.peers(0) != nullptr ? "peer-store" : "NCCL");
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
  // fn(r) on every rank's thread at once (device::RankGroup: a failed rank aborts the group).
  void on_ranks(const std::function<void(int)>& fn) { group_.run(fn); }

  const Config& c_;
  device::RankGroup group_;  // outlives the runners, which use its communicators
  std::vector<std::unique_ptr<StepRunner>> ranks_;
};

}  // namespace

std::unique_ptr<StepRunner> make_tensor_parallel_runner(const Model& m,
                                                        const device::DeviceOptions& o,
                                                        std::span<const int> devices,
                                                        bool kernel_times) {
  return std::make_unique<TensorParallelRunner>(m, o, devices, kernel_times);
}

}  // namespace parity
