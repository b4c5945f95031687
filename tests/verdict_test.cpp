// The verdict on correct candidates: cpu-f32 is a correct float32 port, so the harness must
// never call it diverged -- on tiny models of several seeds over more than a thousand positions
// (RoPE angles of float32 lose accuracy as the position grows), up to the model's whole context,
// and on the transformers-initialised models with large norm weights, biases and sinks. The
// largest share of the bound used is printed, so the CI log shows the headroom.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "model/checkpoint.h"
#include "model/lockstep.h"
#include "model/synth.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/differ.h"
#include "tracer/report.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

// Runs the reference and cpu-f32 in lockstep with replay over `tokens`, traces `traced`, and
// diffs under the default derived bounds.
DiffResult trace_and_diff(const Model& m, const std::vector<int32_t>& tokens,
                          const std::set<int>& traced, const std::string& tag) {
  const std::string dir = test::temp_dir(tag);
  auto ref = make_reference_backend(m);
  auto cand = make_cpu_f32_backend(m);
  LockstepOptions o;
  o.prompt = tokens;
  o.traced = traced;
  o.step_rows = 128;
  trace_lockstep(*ref, *cand, m, o, dir + "/reference.h5", dir + "/candidate.h5");
  return diff_traces(TraceReader(dir + "/candidate.h5"), TraceReader(dir + "/reference.h5"),
                     Criterion::derived());
}

// The largest local share of the bound over the datasets, and where.
std::string headroom(const DiffResult& r) {
  double worst = 0;
  std::string where = "-";
  for (const auto& d : r.datasets)
    if (d.local && !d.is_decision() && !bound_is_rounding(d.key.stage) &&
        d.local->values.share > worst) {
      worst = d.local->values.share;
      where = d.path;
    }
  return fmt::format("largest local share {:.3g} at {}", worst, where);
}

std::vector<int32_t> tokens_for(int n, int vocab, uint64_t salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((salt * 2654435761ull + 7919ull * uint64_t(i)) % uint64_t(vocab)));
  return t;
}

class TinySeeds : public ::testing::TestWithParam<uint64_t> {};

TEST_P(TinySeeds, CpuF32NeverDivergesOverAThousandPositions) {
  SynthSpec spec = synth_preset("tiny");
  spec.seed = GetParam();
  const std::string dir = test::temp_dir("tiny-seed");
  write_synthetic_checkpoint(spec, dir, false);
  auto m = Model::load(dir);
  const int n = 1100;
  const std::set<int> traced = {0, 1, 7, 8, 9, 100, 127, 128, 129, 511, 512, 1000, 1023, n - 1};
  const DiffResult r = trace_and_diff(*m, tokens_for(n, m->config.vocab_size, GetParam()), traced,
                                      "seed-trace");
  std::cout << "seed " << GetParam() << ": " << headroom(r) << "\n";
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
  EXPECT_EQ(r.judged, Judge::local);
  EXPECT_EQ(r.datasets.size(), traced.size() * size_t(stages_per_position(m->config)));
}

INSTANTIATE_TEST_SUITE_P(Verdict, TinySeeds, ::testing::Range<uint64_t>(1, 11));

// Real checkpoints' magnitudes: small embeddings, norm weights of several units, large biases
// and sinks, three residual channels in the hundreds.
TEST(Verdict, CpuF32NeverDivergesOnRealisticMagnitudes) {
  for (uint64_t seed : {0, 11}) {
    SynthSpec spec = synth_preset("tiny");
    spec.seed = seed;
    spec.magnitudes = SynthMagnitudes::realistic;
    const std::string dir = test::temp_dir("tiny-real");
    write_synthetic_checkpoint(spec, dir, false);
    auto m = Model::load(dir);
    const int n = 1100;
    const DiffResult r = trace_and_diff(*m, tokens_for(n, m->config.vocab_size, seed + 5),
                                        {0, 1, 8, 9, 127, 128, 512, 1024, n - 1}, "real-trace");
    std::cout << "realistic tiny, seed " << seed << ": " << headroom(r) << "\n";
    EXPECT_FALSE(r.diverged()) << verdict_line(r);
  }
}

TEST(Verdict, CpuF32NeverDivergesAtTheEndOfTheContext) {
  auto m = Model::load(test::tiny_model_dir());
  const int n = m->config.max_position_embeddings;  // 4096 for the tiny preset
  const DiffResult r = trace_and_diff(*m, tokens_for(n, m->config.vocab_size, 99),
                                      {2047, 2048, n - 1}, "context-end");
  std::cout << "tiny, positions 2047, 2048, " << n - 1 << ": " << headroom(r) << "\n";
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
}

class HfModels : public ::testing::TestWithParam<std::string> {};

TEST_P(HfModels, CpuF32NeverDivergesOnTransformersInitialisedModels) {
  const fs::path dir = fs::path(PARITY_SOURCE_DIR) / "golden" / GetParam();
  ASSERT_TRUE(fs::exists(dir / "config.json")) << dir;
  auto m = Model::load(dir.string());
  const int n = 200;
  std::set<int> traced;
  for (int p = 0; p < n; p += 7) traced.insert(p);
  traced.insert(n - 1);
  const DiffResult r =
      trace_and_diff(*m, tokens_for(n, m->config.vocab_size, 7), traced, "hf-trace");
  std::cout << GetParam() << ": " << headroom(r) << "\n";
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
}

INSTANTIATE_TEST_SUITE_P(Verdict, HfModels, ::testing::Values("hf-tiny", "hf-large"),
                         [](const auto& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace parity
