// The harness over a tensor-parallel group (device/hip_group_backend.h): the tiny model split over
// two GPUs and traced in lockstep with the reference passes by local error in both precisions,
// its rows carrying the ranks' layout and its partial sums traced; and a bug planted on one
// rank -- its query heads' rows taken from the other rank's shard, an all-reduce missing or
// doubled, the experts' slots mixed up, its vocabulary shard joined one row off -- is blamed at
// its stage and layer with that rank named. The bugs live in the test (RankBugBackend), as the
// mutation suite's do: after the group runs the stage, rank 1's rows are read, spoiled as the bug
// would and written back, so that every later stage consumes them. Skipped below two GPUs or
// without NCCL.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/lockstep.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/differ.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_group_backend.h"
#include "device/runtime/communicator.h"
#include "device/runtime/device.h"
#endif

namespace parity::test {
namespace {

#ifdef PARITY_HAVE_DEVICE

// 16 positions: past the tiny model's sliding window of 8.
const std::vector<int32_t> kTokens = {1,   17, 300,  42, 999, 5,   77, 128,
                                      256, 3,  1000, 64, 9,   511, 22, 700};

enum class RankBug {
  none,
  q_rows_of_rank_0,      // rank 1's query rows of qkv computed from rank 0's heads -> qkv
  all_reduce_missing,    // rank 1 keeps its own partial sum of o_proj -> o_proj
  all_reduce_doubled,    // rank 1's moe_out is twice the sum -> moe_out
  expert_slots_rotated,  // rank 1 computes slot j with slot j + 1's expert -> mlp1
  vocab_shard_one_off,   // rank 1's vocabulary shard joined one row late -> logits
};

Stage stage_of(RankBug bug) {
  switch (bug) {
    case RankBug::q_rows_of_rank_0:
      return Stage::qkv;
    case RankBug::all_reduce_missing:
      return Stage::o_proj;
    case RankBug::all_reduce_doubled:
      return Stage::moe_out;
    case RankBug::expert_slots_rotated:
      return Stage::mlp1;
    case RankBug::vocab_shard_one_off:
      return Stage::logits;
    case RankBug::none:
      break;
  }
  return Stage::embedding;
}

// The group with one bug on rank 1 at layer `layer` (the logits' at model scope).
class RankBugBackend final : public Backend {
 public:
  RankBugBackend(device::HipGroupBackend& g, RankBug bug, int layer)
      : g_(g), bug_(bug), layer_(layer) {}
  std::string name() const override { return g_.name(); }
  std::string precision() const override { return g_.precision(); }
  PrecisionPolicy precision_policy() const override { return g_.precision_policy(); }
  const Config& config() const override { return g_.config(); }
  void begin_step(const Batch& b) override {
    g_.begin_step(b);
    rows_ = b.rows();
  }
  void run(Stage s, int layer) override {
    g_.run(s, layer);
    if (bug_ == RankBug::none || s != stage_of(bug_) || (layer != layer_ && layer != kModelLayer))
      return;
    for (int r = 0; r < rows_; ++r) plant(s, layer, r);
  }
  StageData read(Stage s, int layer, int row) override { return g_.read(s, layer, row); }
  void write(Stage s, int layer, int row, const StageData& d) override {
    g_.write(s, layer, row, d);
  }
  bool replays(Stage s, int layer) const override { return g_.replays(s, layer); }
  std::optional<KvRows> cache_rows(int seq, int layer, int first, int count) override {
    return g_.cache_rows(seq, layer, first, count);
  }
  std::vector<StageData> partials(Stage s, int layer, int row) override {
    return g_.partials(s, layer, row);
  }
  void reset() override { g_.reset(); }

 private:
  // Rank r's own row of the stage, spoiled by `spoil`, written back.
  void on_rank(int r, Stage s, int layer, int row, const std::function<void(StageData&)>& spoil) {
    g_.with_rank(r, [&](Backend& b) {
      StageData d = b.read(s, layer, row);
      spoil(d);
      b.write(s, layer, row, d);
    });
  }
  void plant(Stage s, int layer, int row) {
    const Config& c = g_.config();
    switch (bug_) {
      case RankBug::q_rows_of_rank_0: {  // [q | k | v] of each rank's heads; the q part first
        std::vector<float> q0;
        const size_t q_rows = size_t(c.q_dim() / g_.degree());
        g_.with_rank(0, [&](Backend& b) {
          const StageData d = b.read(s, layer, row);
          q0.assign(d.f32.begin(), d.f32.begin() + long(q_rows));
        });
        on_rank(1, s, layer, row,
                [&](StageData& d) { std::copy(q0.begin(), q0.end(), d.f32.begin()); });
        break;
      }
      case RankBug::all_reduce_missing: {
        const std::vector<StageData> parts = g_.partials(s, layer, row);
        ASSERT_EQ(parts.size(), 2u);
        on_rank(1, s, layer, row, [&](StageData& d) { d.f32 = parts[1].f32; });
        break;
      }
      case RankBug::all_reduce_doubled:
        on_rank(1, s, layer, row, [](StageData& d) {
          for (float& x : d.f32) x *= 2;
        });
        break;
      case RankBug::expert_slots_rotated:  // [k, 2 I / degree]
        on_rank(1, s, layer, row, [&](StageData& d) {
          const size_t width = d.f32.size() / size_t(c.num_experts_per_tok);
          std::rotate(d.f32.begin(), d.f32.begin() + long(width), d.f32.end());
        });
        break;
      case RankBug::vocab_shard_one_off:  // every rank joins the shard one row late
        for (int r = 0; r < g_.degree(); ++r)
          on_rank(r, s, layer, row, [&](StageData& d) {
            const size_t begin = size_t(c.vocab_size) - size_t(c.vocab_size) / 2;
            std::copy_backward(d.f32.begin() + long(begin), d.f32.end() - 1, d.f32.end());
          });
        break;
      case RankBug::none:
        break;
    }
  }

  device::HipGroupBackend& g_;
  RankBug bug_;
  int layer_;
  int rows_ = 0;
};

class TraceGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = candidate_unavailable("hip"); !why.empty()) GTEST_SKIP() << why;
    if (!device::collectives_built()) GTEST_SKIP() << "this build has no NCCL (RCCL on AMD)";
    if (device_count() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << device_count();
  }
  static const Model& model() {
    static const std::unique_ptr<Model> m = Model::load(tiny_model_dir());
    return *m;
  }
  static std::unique_ptr<device::HipGroupBackend> group(device::Precision p) {
    device::DeviceOptions o = device::device_options_from_environment();
    o.precision = p;
    const std::vector<int> devices = {0, 1};
    return std::make_unique<device::HipGroupBackend>(model(), o, devices);
  }
  static DiffResult trace_and_diff(Backend& candidate, const std::string& dir) {
    auto reference = make_backend("reference", model());
    LockstepOptions options;
    options.prompt = kTokens;
    for (size_t i = 0; i < kTokens.size(); ++i) options.traced.insert(int(i));
    const std::string ref_path = dir + "/reference.h5", cand_path = dir + "/candidate.h5";
    trace_lockstep(*reference, candidate, model(), options, ref_path, cand_path);
    const TraceReader a(cand_path), b(ref_path);
    return diff_traces(a, b, Criterion::derived());
  }
};

TEST_F(TraceGroup, TwoRanksPassByLocalErrorInBothPrecisions) {
  for (const auto p : {device::Precision::fp32, device::Precision::bf16}) {
    auto g = group(p);
    const std::string dir = temp_dir("trace-group");
    const DiffResult r = trace_and_diff(*g, dir);
    EXPECT_FALSE(r.diverged()) << device::precision_name(p) << ": " << verdict_line(r);
    const TraceReader a(dir + "/candidate.h5");
    const auto qkv = a.shards(trace_dataset_path(3, 1, Stage::qkv));
    ASSERT_TRUE(qkv);
    EXPECT_EQ(qkv->kind, "ranges");
    EXPECT_EQ(qkv->ranks, 2);
    EXPECT_EQ(a.shards(trace_dataset_path(3, 1, Stage::o_proj))->kind, "reduced");
    EXPECT_EQ(a.shards(trace_dataset_path(3, 1, Stage::mlp2))->kind, "partial");
    EXPECT_EQ(a.shards(trace_dataset_path(3, kModelLayer, Stage::logits))->kind, "ranges");
    // Each rank's partial sums before the all-reduce, as datasets of their own.
    const hid_t f = H5Fopen((dir + "/candidate.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* path :
         {"/partials", "/partials/rank_1", "/partials/rank_1/pos_15",
          "/partials/rank_1/pos_15/layer_1", "/partials/rank_1/pos_15/layer_1/moe_out",
          "/partials/rank_0/pos_0/layer_0/o_proj"})
      EXPECT_GT(H5Lexists(f, path, H5P_DEFAULT), 0) << path;
    H5Fclose(f);
  }
}

struct BugCase {
  RankBug bug;
  const char* name;
  int layer;  // where it is planted (and blamed; the logits' at model scope)
};

TEST_F(TraceGroup, PartialsAfterAReadAreTheOnesItFetched) {
  // A tracer reads a row and then asks for its partial sums: they come from what the read
  // fetched, the same bits as fetched afresh before the read; a write forgets them (mlp2's then
  // the written row on rank 0 and zeros), for o_proj, mlp2 and moe_out of every layer.
  auto g = group(device::Precision::bf16);
  const Config& c = g->config();
  g->begin_step(Batch::single(kTokens[0], 0));
  int checked = 0;
  walk_graph(c, [&](int layer, Stage s) {
    g->run(s, layer);
    if (s != Stage::o_proj && s != Stage::mlp2 && s != Stage::moe_out) return;
    const std::vector<StageData> fresh = g->partials(s, layer, 0);
    ASSERT_EQ(fresh.size(), 2u) << name(s) << " layer " << layer;
    const StageData row = g->read(s, layer, 0);
    ASSERT_TRUE(row.shards.has_value());
    EXPECT_TRUE(row.shards->problem.empty()) << row.shards->problem;
    const std::vector<StageData> kept = g->partials(s, layer, 0);
    g->write(s, layer, 0, row);
    const std::vector<StageData> after_write = g->partials(s, layer, 0);
    ASSERT_EQ(kept.size(), 2u);
    ASSERT_EQ(after_write.size(), 2u);
    for (size_t r = 0; r < 2; ++r)
      EXPECT_EQ(kept[r].f32, fresh[r].f32) << name(s) << " layer " << layer << " rank " << r;
    if (s == Stage::mlp2) {  // a written partial sum: the row on rank 0, zeros on rank 1
      EXPECT_EQ(after_write[0].f32, row.f32) << "layer " << layer;
      EXPECT_EQ(after_write[1].f32, std::vector<float>(row.f32.size(), 0.0f)) << "layer " << layer;
    } else {  // the partial sums that entered the all-reduce, which a write does not change
      for (size_t r = 0; r < 2; ++r)
        EXPECT_EQ(after_write[r].f32, fresh[r].f32) << name(s) << " layer " << layer;
    }
    ++checked;
  });
  EXPECT_EQ(checked, 3 * c.num_hidden_layers);
}

TEST_F(TraceGroup, ABugOnOneRankIsBlamedAtItsStageWithTheRankNamed) {
  const BugCase cases[] = {
      {RankBug::q_rows_of_rank_0, "q rows of rank 0", 1},
      {RankBug::all_reduce_missing, "all-reduce missing", 1},
      {RankBug::all_reduce_doubled, "all-reduce doubled", 1},
      {RankBug::expert_slots_rotated, "expert slots rotated", 1},
      {RankBug::vocab_shard_one_off, "vocabulary shard one row off", kModelLayer},
  };
  for (const auto p : {device::Precision::fp32, device::Precision::bf16})
    for (const BugCase& bc : cases) {
      auto g = group(p);
      RankBugBackend mutant(*g, bc.bug, bc.layer);
      const DiffResult r = trace_and_diff(mutant, temp_dir("trace-group-bug"));
      const std::string what = std::string(bc.name) + ", " +
                               std::string(device::precision_name(p)) + ": " + verdict_line(r);
      ASSERT_TRUE(r.first_divergence) << what;
      EXPECT_EQ(r.first_divergence->stage, stage_of(bc.bug)) << what;
      EXPECT_EQ(r.first_divergence->layer, bc.layer) << what;
      EXPECT_EQ(r.first_divergence->position, 0) << what;
      EXPECT_EQ(r.first_divergence->rank, 1) << what;
      EXPECT_NE(verdict_line(r).find("rank 1 of 2"), std::string::npos) << what;
      std::cout << "[ blamed ] " << what.substr(0, 400) << "\n";
    }
}

TEST_F(TraceGroup, TheToolTracesAGroupAndRefusesWhatItCannotSplit) {
  const std::string out = temp_dir("trace-group-tool");
  const auto ok = run_tool("parity-trace", "--model " + tiny_model_dir() +
                                               " --candidate hip --tensor-parallel 2 --tokens "
                                               "1,17,300,42 --out " +
                                               out);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("PASS"), std::string::npos) << ok.output;
  const int gpus = device_count();
  const auto many = run_tool("parity-trace", "--model " + tiny_model_dir() + " --tensor-parallel " +
                                                 std::to_string(gpus + 1) +
                                                 " --candidate hip --tokens 1 --out " + out + "-x");
  EXPECT_EQ(many.exit_code, 2) << many.output;
  EXPECT_NE(many.output.find("GPUs, but this host has"), std::string::npos) << many.output;
}

#endif

TEST(TraceGroupTool, RefusesAGroupOfAHostBackendOrOfNoGpus) {
  const std::string out = temp_dir("trace-group-refusal");
  for (const char* args : {"--candidate cpu-f32 --tensor-parallel 2", "--tensor-parallel 0"}) {
    const auto r = run_tool(
        "parity-trace", "--model " + tiny_model_dir() + " " + args + " --tokens 1 --out " + out);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("--tensor-parallel"), std::string::npos) << args << ": " << r.output;
  }
}

}  // namespace
}  // namespace parity::test
