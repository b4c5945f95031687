// The graph: stage calls in list order, execution order keys, injection parsing and effect.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/checkpoint.h"
#include "model/forward.h"
#include "model/error.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"

namespace parity {
namespace {

// Records every stage call and every row read; produces zero-filled rows of the right size.
class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(Config c) : c_(std::move(c)) {}
  std::string name() const override { return "recording"; }
  std::string precision() const override { return "none"; }
  PrecisionPolicy precision_policy() const override { return PrecisionPolicy::float64(); }
  const Config& config() const override { return c_; }
  void begin_step(const Batch& b) override { batch_ = b; }
  void run(Stage s, int layer) override { calls.emplace_back(layer, s); }
  StageData read(Stage s, int, int row) override {
    StageData d;
    d.dims = stage_dims(c_, s, batch_.positions[size_t(row)]);
    size_t n = 1;
    for (auto x : d.dims) n *= x;
    if (info(s).kind == ValueKind::Index) {
      d.type = StageData::Type::I32;
      d.i32.assign(n, 0);
    } else {
      d.type = StageData::Type::F64;
      d.f64.assign(n, 1.0);
    }
    return d;
  }
  void write(Stage s, int layer, int, const StageData& d) override { writes.push_back({s, layer, d}); }
  void reset() override {}
  struct Write {
    Stage s;
    int layer;
    StageData d;
  };
  std::vector<std::pair<int, Stage>> calls;
  std::vector<Write> writes;

 private:
  Config c_;
  Batch batch_;
};

Config small_config() { return Model::load(test::tiny_model_dir())->config; }

TEST(Forward, CallsEveryStageInListOrder) {
  RecordingBackend b(small_config());
  forward(b, Batch::single(1, 0));
  EXPECT_EQ(b.calls, stage_sequence(b.config()));
  ASSERT_EQ(int(b.calls.size()), stages_per_position(b.config()));
  for (size_t i = 0; i < b.calls.size(); ++i)
    EXPECT_EQ(execution_order(b.config(), b.calls[i].first, b.calls[i].second), int(i));
}

TEST(Forward, ObserverSeesEveryStageWithItsKey) {
  struct Keys : Observer {
    std::vector<StageKey> keys;
    bool wants(int, int, Stage) const override { return true; }
    void record(const StageKey& k, const StageData&) override { keys.push_back(k); }
  } obs;
  RecordingBackend b(small_config());
  forward(b, Batch{{1, 2}, {0, 1}, {0, 0}}, &obs);
  ASSERT_EQ(int(obs.keys.size()), 2 * stages_per_position(b.config()));
  EXPECT_EQ(obs.keys.front().stage, Stage::embedding);
  EXPECT_EQ(obs.keys.back().stage, Stage::sampled);
  EXPECT_EQ(obs.keys.back().position, 1);
}

TEST(Forward, InjectionWritesOnlyTheNamedStageAndLayer) {
  RecordingBackend b(small_config());
  const Injection inj = Injection::parse("swiglu:2", b.config());
  forward(b, Batch::single(1, 0), nullptr, &inj);
  ASSERT_EQ(b.writes.size(), 1u);
  EXPECT_EQ(b.writes[0].s, Stage::swiglu);
  EXPECT_EQ(b.writes[0].layer, 2);
  EXPECT_EQ(b.writes[0].d.f64[0], 1.0 + 0.5 + 0.5);
}

TEST(Forward, InjectionParseErrors) {
  const Config c = small_config();
  EXPECT_THROW(Injection::parse("bogus:1", c), Error);
  EXPECT_THROW(Injection::parse("qkv", c), Error);  // per-layer stage needs a layer
  EXPECT_THROW(Injection::parse("qkv:x", c), Error);
  EXPECT_THROW(Injection::parse("qkv:4", c), Error);  // tiny has 4 layers
  EXPECT_THROW(Injection::parse("qkv:1:explode", c), Error);
  EXPECT_EQ(Injection::parse("logits", c).layer, kModelLayer);
  EXPECT_EQ(Injection::parse("logits:nan", c).mode, Injection::Mode::NaN);
}

TEST(Forward, TopkInjectionRoutesToAnUnselectedExpert) {
  const Config c = small_config();
  StageData d;
  d.type = StageData::Type::I32;
  d.i32 = {0, 1, 2, 3};
  apply_injection(Injection::parse("topk_idx:0", c), c, d);
  EXPECT_EQ(d.i32[0], 4);
}

// Reference logits at every position, collected through the observer.
std::vector<double> logits(Backend& b, const Batch& batch) {
  struct Collect : Observer {
    std::vector<double> v;
    bool wants(int, int, Stage s) const override { return s == Stage::logits; }
    void record(const StageKey&, const StageData& d) override { v.insert(v.end(), d.f64.begin(), d.f64.end()); }
  } c;
  forward(b, batch, &c);
  return c.v;
}

TEST(Reference, BitwiseIdenticalForAnyThreadCount) {
  auto m = Model::load(test::tiny_model_dir());
  Batch batch;
  for (int i = 0; i < 12; ++i) {
    batch.tokens.push_back((1 + 7919 * i) % m->config.vocab_size);
    batch.positions.push_back(i);
    batch.seqs.push_back(0);
  }
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> runs;
  for (int threads : {1, 2, 3, 7}) {
    omp_set_num_threads(threads);
    auto b = make_reference_backend(*m);
    runs.push_back(logits(*b, batch));
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[0].data(), runs[0].size() * sizeof(double)), 0) << "run " << i;
  }
}

TEST(Reference, BatchedPrefillEqualsTokenByTokenDecode) {
  auto m = Model::load(test::tiny_model_dir());
  Batch all;
  for (int i = 0; i < 10; ++i) {
    all.tokens.push_back(i * 31 + 2);
    all.positions.push_back(i);
    all.seqs.push_back(0);
  }
  auto a = make_reference_backend(*m);
  const auto batched = logits(*a, all);
  auto b = make_reference_backend(*m);
  std::vector<double> stepped;
  for (int i = 0; i < 10; ++i) {
    auto l = logits(*b, Batch::single(all.tokens[size_t(i)], i));
    stepped.insert(stepped.end(), l.begin(), l.end());
  }
  EXPECT_EQ(batched, stepped);
}

TEST(Reference, SequencesKeepSeparateCaches) {
  auto m = Model::load(test::tiny_model_dir());
  auto b = make_reference_backend(*m);
  // Two sequences interleaved in one batch give each the logits it gets alone.
  const auto mixed = logits(*b, Batch{{5, 9, 6, 10}, {0, 0, 1, 1}, {1, 2, 1, 2}});
  auto solo = make_reference_backend(*m);
  // the observer only records sequence 0, so run sequence 1's tokens as sequence 0 alone
  const auto alone = logits(*solo, Batch{{5, 6}, {0, 1}, {0, 0}});
  auto b2 = make_reference_backend(*m);
  const auto mixed0 = logits(*b2, Batch{{5, 9, 6, 10}, {0, 0, 1, 1}, {0, 2, 0, 2}});
  EXPECT_TRUE(mixed.empty());
  EXPECT_EQ(mixed0, alone);
}

TEST(Reference, RejectsOutOfRangeTokenAndGappedPositions) {
  auto m = Model::load(test::tiny_model_dir());
  auto b = make_reference_backend(*m);
  EXPECT_THROW(forward(*b, Batch::single(m->config.vocab_size, 0)), Error);
  EXPECT_THROW(forward(*b, Batch::single(1, 3)), Error);  // cache is empty: position 3 has a gap
  EXPECT_THROW(forward(*b, Batch::single(1, m->config.max_position_embeddings)), Error);
}

}  // namespace
}  // namespace parity
