// The `hip` backend over a tensor-parallel group (device/hip_backend.h make_hip_group_backend):
// one HipBackend per rank, each holding its part of the model (device/runtime/shard_plan.h) on
// its own GPU, every call run on all ranks at once (device/runtime/rank_group.h), so that the
// ranks' all-reduces and the logits' join meet as they do in the production engine. The graph
// sees the model's full rows:
//   read   gathers the ranks' rows of the stage into the reference's shape
//          (device/runtime/shard_layout.h gather_shards) and tells the row how (RowShards: which
//          rank computed which elements; what the gathering found wrong: copies of a replicated
//          stage that differ between ranks, an all-reduced row that is not the sum of the ranks'
//          partial sums). Such a row comes back as the rank's that the gathering named, so that
//          its values show the fault too.
//   write  scatters a full row: each rank its part (ranges), the whole row (replicated, the
//          all-reduced stages, the logits every rank joined), or, for a partial sum (mlp2 split by
//          intermediate columns), the row on rank 0 and zeros on the others, whose all-reduce then
//          gives the written row.
//   partials  each rank's partial sum of o_proj and moe_out as it entered the all-reduce, and
//          its row of mlp2 (a partial sum, which moe_out adds up on each rank): those read() of
//          the same row fetched, when nothing ran or was written since (a tracer asks for both).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "device/hip_stage_backend.h"
#include "device/runtime/rank_group.h"
#include "device/runtime/shard_layout.h"
#include "model/error.h"

namespace parity::device {

class HipGroupBackend final : public Backend {
 public:
  // Rank i on GPU devices[i] (make_hip_group_backend).
  HipGroupBackend(const Model& m, const DeviceOptions& o, std::span<const int> devices);
  ~HipGroupBackend() override;

  std::string name() const override { return "hip"; }
  std::string precision() const override;
  PrecisionPolicy precision_policy() const override { return ranks_[0]->precision_policy(); }
  nlohmann::json facts() const override;
  const Config& config() const override { return c_; }

  void begin_step(const Batch& b) override {
    fetched_.reset();
    on_ranks([&](int r) { ranks_[size_t(r)]->begin_step(b); });
    batch_ = b;
  }
  void run(Stage s, int layer) override {
    fetched_.reset();
    on_ranks([&](int r) { ranks_[size_t(r)]->run(s, layer); });
  }
  bool run_step() override {
    fetched_.reset();
    on_ranks([&](int r) { ranks_[size_t(r)]->run_step(); });
    return true;
  }
  StageData read(Stage s, int layer, int row) override;
  void write(Stage s, int layer, int row, const StageData& data) override;
  std::vector<StageData> partials(Stage s, int layer, int row) override;
  void reset() override {
    fetched_.reset();
    on_ranks([&](int r) { ranks_[size_t(r)]->reset(); });
  }
  std::optional<KvRows> cache_rows(int seq, int layer, int first, int count) override;
  bool replays(Stage s, int layer) const override { return ranks_[0]->replays(s, layer); }

  int degree() const { return int(ranks_.size()); }
  // fn(rank r's backend: its own rows, in rank_config's shapes) on rank r's thread, its device
  // current: a test plants a bug on one rank through it, as the mutation suite does on a backend.
  void with_rank(int r, const std::function<void(Backend&)>& fn);

 private:
  void on_ranks(const std::function<void(int)>& fn) { group_.run(fn); }
  int position(int row) const {
    if (row < 0 || row >= batch_.rows())
      fail("hip group: row {} of a step of {}", row, batch_.rows());
    return batch_.positions[size_t(row)];
  }
  // Each rank's layout of stage s's row (the experts' stages read the row's choices on rank 0,
  // on its thread: its device current).
  std::vector<StageShard> layouts(Stage s, int layer, int row) {
    std::vector<int32_t> topk;
    if (info(s).scope == Scope::Expert)
      on_ranks([&](int r) {
        if (r == 0) topk = ranks_[0]->read(Stage::topk_idx, layer, row).i32;
      });
    std::vector<StageShard> out;
    for (const ShardPlan& p : plans_) out.push_back(stage_shard(s, c_, p, topk, position(row)));
    return out;
  }

  // What the last read() fetched from the ranks for a row: each rank's row and, for an
  // all-reduced stage, its partial sum; partials() of that row takes them instead of copying
  // them from the devices again. Forgotten by every call that runs or writes anything.
  struct Fetched {
    Stage s;
    int layer = 0, row = 0;
    std::vector<StageData> rows;
    std::vector<std::optional<StageData>> parts;
  };
  std::optional<Fetched> fetched_;

  const Config& c_;
  RankGroup group_;  // outlives the ranks, which use its communicators
  std::vector<std::unique_ptr<HipBackend>> ranks_;
  std::vector<ShardPlan> plans_;
  Batch batch_;
};

}  // namespace parity::device
