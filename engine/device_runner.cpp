#include "engine/device_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "device/fusion.h"
#include "device/kernels.h"
#include "device/runtime/runtime.h"
#include "device/stage_launch.h"
#include "model/error.h"
#include "model/forward.h"

namespace parity {
namespace {

using namespace device;  // the kernels' launchers
using device::DeviceBuffer;
using device::DeviceRuntime;
using device::Event;
using device::PinnedBuffer;

class DeviceRunner final : public StepRunner {
 public:
  DeviceRunner(const Model& m, const device::DeviceOptions& o, bool kernel_times)
      : rt_(m, o), c_(m.config), timed_(kernel_times) {
    for (const auto& [layer, s] : stage_sequence(c_))
      if (layer != kModelLayer && !device::fused_into_producer(s))
        layer_stages_.emplace_back(layer, s);
  }

  std::string name() const override {
    return fmt::format("device {}: {}", rt_.device().index, rt_.device().describe());
  }
  const Config& config() const override { return c_; }
  int max_context() const override { return rt_.max_context(); }
  int kv_blocks() const override { return rt_.kv().blocks().num_blocks(); }
  int kv_block_size() const override { return rt_.kv().layout().block_size; }
  std::vector<TokenId> step(const Batch& batch, std::span<const RowSample> samples,
                            const SamplingParams& sampling) override;
  void release(int seq) override { rt_.release(seq); }
  void reset() override { rt_.clear(); }
  std::string kernel_times() const override;
  std::string launches() const override;

 private:
  // Launches fn's kernels, timed under `label` when kernel times are on.
  template <typename F>
  void timed(const std::string& label, F&& fn);
  void stage_buffers(int count);

  DeviceRuntime rt_;
  const Config& c_;
  bool timed_ = false;
  std::vector<std::pair<int, Stage>> layer_stages_;  // (layer, stage) of the layers, in order
  // The sampled rows of a step: their row indices, sampling parameters and tokens, staged in
  // pinned memory (one copy up, one copy down).
  int capacity_ = 0;
  PinnedBuffer pinned_;
  DeviceBuffer dev_;
  struct Timing {
    int64_t calls = 0;
    double ms = 0;
  };
  std::map<std::string, Timing> times_;
  std::vector<std::pair<std::string, std::array<Event, 2>>> pending_;
};

template <typename F>
void DeviceRunner::timed(const std::string& label, F&& fn) {
  if (!timed_) {
    fn();
    return;
  }
  std::array<Event, 2> ev{Event(Event::Timing::on), Event(Event::Timing::on)};
  ev[0].record(rt_.stream());
  fn();
  ev[1].record(rt_.stream());
  pending_.emplace_back(label, std::move(ev));
}

// Layout of the staging buffers for `count` samples: rows (int32), params, tokens (int32).
struct SampleStaging {
  size_t rows = 0, params = 0, tokens = 0, bytes = 0;
  explicit SampleStaging(int count) {
    const auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    rows = 0;
    params = align(size_t(count) * sizeof(int32_t));
    tokens = params + align(size_t(count) * sizeof(device::SampleParams));
    bytes = tokens + align(size_t(count) * sizeof(int32_t));
  }
};

void DeviceRunner::stage_buffers(int count) {
  if (count <= capacity_) return;
  capacity_ = std::max(count, 2 * capacity_);
  const SampleStaging s(capacity_);
  pinned_.allocate(s.bytes);
  dev_.allocate(s.bytes);
}

std::vector<TokenId> DeviceRunner::step(const Batch& batch, std::span<const RowSample> samples,
                                        const SamplingParams& sampling) {
  rt_.make_current();
  rt_.begin_step(batch);
  // The embedding and the layers: one captured graph per step shape (the runtime's step graphs),
  // or, with kernel times on, stage by stage between the timing events.
  if (timed_) {
    timed("embedding",
          [&] { launch_stage(rt_, Stage::embedding, kModelLayer, StageCall::untraced); });
    for (const auto& [layer, s] : layer_stages_)
      timed(std::string(parity::name(s)),
            [&] { launch_stage(rt_, s, layer, StageCall::untraced); });
  } else {
    rt_.run_step([&] {
      launch_stage(rt_, Stage::embedding, kModelLayer, StageCall::untraced);
      for (const auto& [layer, s] : layer_stages_) launch_stage(rt_, s, layer, StageCall::untraced);
    });
  }
  const int n = int(samples.size());
  if (n == 0) {
    rt_.make_current();
    // Wait even with nothing to read back: the engine times each step to split its time
    // between prefill and decode rows, and a step is long next to this wait.
    HIP_CHECK(hipStreamSynchronize(rt_.stream()));
    rt_.check_collectives();
    return {};
  }
  stage_buffers(n);
  const SampleStaging at(capacity_);
  auto* rows = reinterpret_cast<int32_t*>(pinned_.as<char>() + at.rows);
  auto* params = reinterpret_cast<device::SampleParams*>(pinned_.as<char>() + at.params);
  auto* tokens = reinterpret_cast<int32_t*>(pinned_.as<char>() + at.tokens);
  for (int i = 0; i < n; ++i) {
    const RowSample& s = samples[size_t(i)];
    PARITY_CHECK(s.row >= 0 && s.row < batch.rows(), "sample row {} of {}", s.row, batch.rows());
    rows[i] = s.row;
    params[i] = device::SampleParams{sampling.temperature, sampling.top_k, sampling.top_p,
                                     sampling.seed, s.request, s.step};
  }
  const hipStream_t st = rt_.stream();
  HIP_CHECK(hipMemcpyAsync(dev_.as<char>(), pinned_.as<char>(), at.tokens, hipMemcpyHostToDevice,
                           st));
  int32_t* dev_tokens = dev_.as<int32_t>(at.tokens);
  const device::SampledRows sampled{dev_.as<const int32_t>(at.rows), n,
                                    sampling.greedy() ? nullptr
                                                      : dev_.as<const device::SampleParams>(at.params),
                                    dev_tokens};
  for (Stage s : {Stage::final_norm, Stage::logits, Stage::sampled})
    timed(std::string(parity::name(s)), [&] { launch_sampled_stage(rt_, s, sampled); });
  HIP_CHECK(hipMemcpyAsync(tokens, dev_tokens, size_t(n) * sizeof(int32_t), hipMemcpyDeviceToHost,
                           st));
  HIP_CHECK(hipStreamSynchronize(st));  // the step's one wait: its tokens
  rt_.check_collectives();
  if (timed_) {
    for (auto& [label, ev] : pending_) {
      Timing& t = times_[label];
      ++t.calls;
      t.ms += Event::elapsed_ms(ev[0], ev[1]);
    }
    pending_.clear();
  }
  return std::vector<TokenId>(tokens, tokens + n);
}

std::string DeviceRunner::launches() const {
  const device::StepGraphs::Counts& n = rt_.graphs().counts();
  const int64_t steps = n.direct + n.captured + n.replayed;
  if (steps == 0) return {};  // none yet, or kernel times on (stage by stage)
  return fmt::format(
      "{} steps: {} replayed from a captured graph, {} captured, {} launched kernel by kernel",
      steps, n.replayed, n.captured, n.direct);
}

std::string DeviceRunner::kernel_times() const {
  if (times_.empty()) return {};
  std::vector<std::pair<std::string, Timing>> v(times_.begin(), times_.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (const auto& [label, t] : v) total += t.ms;
  std::string out = fmt::format("{:<14} {:>10} {:>12} {:>12} {:>7}\n", "kernels of", "calls",
                                "total ms", "mean us", "share");
  for (const auto& [label, t] : v)
    out += fmt::format("{:<14} {:>10} {:>12.3f} {:>12.2f} {:>6.1f}%\n", label, t.calls, t.ms,
                       t.ms * 1e3 / double(t.calls), 100 * t.ms / total);
  out += fmt::format("{:<14} {:>10} {:>12.3f}\n", "all", "", total);
  return out;
}

}  // namespace

std::unique_ptr<StepRunner> make_device_runner(const Model& m, const device::DeviceOptions& o,
                                               bool kernel_times) {
  return std::make_unique<DeviceRunner>(m, o, kernel_times);
}

}  // namespace parity
