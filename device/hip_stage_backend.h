// The `hip` backend's class (device/hip_backend.h makes it): one device runtime driven stage by
// stage. The tensor-parallel group backend (device/hip_group_backend.cpp) drives one per rank and
// reads what the single-device backend has no use for: the runtime, and a rank's partial sums.
#pragma once
#include <array>
#include <bitset>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/runtime/runtime.h"
#include "device/stage_launch.h"
#include "model/backend.h"
#include "model/forward.h"

namespace parity::device {

class HipBackend final : public Backend {
 public:
  // Under tensor parallel (options.tensor_parallel) the backend is one rank: its rows are the
  // rank's (rank_config's shapes), as its runtime computes them.
  HipBackend(const Model& m, const DeviceOptions& options) : rt_(m, options), c_(rt_.config()) {}

  std::string name() const override { return "hip"; }
  // The text and policy of the runtime's precision (DeviceOptions::precision).
  std::string precision() const override;
  PrecisionPolicy precision_policy() const override;
  nlohmann::json facts() const override { return rt_.facts(); }
  const Config& config() const override { return c_; }

  void begin_step(const Batch& b) override;
  void run(Stage s, int layer) override;
  bool run_step() override;
  StageData read(Stage s, int layer, int row) override;
  void write(Stage s, int layer, int row, const StageData& data) override;
  void reset() override { rt_.clear(); }
  std::optional<KvRows> cache_rows(int seq, int layer, int first, int count) override;
  // attn_out of the bf16 attention comes from q, k and v, not from att (Backend::replays).
  bool replays(Stage s, int layer) const override;

  DeviceRuntime& runtime() { return rt_; }
  // Under tensor parallel: this rank's partial sum of `row` of o_proj or moe_out as it entered
  // the all-reduce (DeviceRuntime::reduced_parts), when (s, layer) was the stage last run that
  // all-reduced; nullopt otherwise.
  std::optional<StageData> own_partial(Stage s, int layer, int row);

 private:
  float* out(Stage s) const { return rt_.arena().out(s); }
  int32_t* index_out(Stage s) const { return rt_.arena().index_out(s); }
  float* row_ptr(Stage s, int row) const {
    if (info(s).shape == Shape::keys)
      return (s == Stage::scores ? rt_.arena().scores() : rt_.arena().att()) +
             rt_.step().host().rows[size_t(row)].scores_offset;
    return out(s) + size_t(row) * stage_row_floats(c_, s);
  }
  void check_row(const char* what, Stage s, int layer, int row) const;

  DeviceRuntime rt_;
  const Config& c_;
  const std::vector<std::pair<int, Stage>> sequence_ = stage_sequence(c_);  // (layer, stage)

  // The current step, as the graph sees it.
  Batch batch_;
  std::bitset<kNumStages> ran_;          // stages run in this step
  std::bitset<kNumStages> overwritten_;  // written by write() since they last ran
  std::array<StaleRows, kNumStages> written_rows_{};  // which rows: [first, end)
  std::array<int, kNumStages> ran_layer_{};
  std::optional<std::pair<Stage, int>> reduced_;  // the stage (and layer) last all-reduced
};

}  // namespace parity::device
