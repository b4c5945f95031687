// The mutation suite: each classic porting bug (tests/mutant_backend.h) turned on in a candidate
// backend must be blamed, by local error under the derived bounds, on exactly its stage and
// layer -- not on the first thing that differs, and not on the stages downstream that inherit
// its error. Each bug is turned on at one layer other than 0 (layer 1, or the sliding layer 2),
// so a verdict that merely named the first stage to differ could not pass; the exceptions are
// the model-scope lm_head and the eps bug on realistic magnitudes (see its case).
//
// Per case: the reference and the mutant candidate run in lockstep with replay over 16 tokens
// (twice the tiny model's sliding window of 8), both traces are written and diffed, and:
//   - the verdict is diverged, the first divergence is the bug's stage, layer and first position;
//   - every dataset whose local error fails is a stage the bug recomputes, at a mutated layer;
//   - a later stage's accumulated error is many times its bound while its local error passes:
//     the victims exist, and the verdict does not blame them.
// Controls: the candidate alone passes, and so does each mutant's host re-implementation with
// the bug switched off, which shows that the re-implementation is not what the suite detects.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "model/lockstep.h"
#include "model/synth.h"
#include "tests/mutant_backend.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/differ.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#endif

namespace parity::test {
namespace {

// 16 positions: past the tiny model's sliding window of 8, so the window bug has keys to show.
const std::vector<int32_t> kTokens = {1,   17, 300,  42, 999, 5,   77, 128,
                                      256, 3,  1000, 64, 9,   511, 22, 700};

// A victim's accumulated error must be many times its bound, and several times the accumulated
// error the candidate has there on its own (float32 drift alone can exceed a local bound far
// downstream). The weakest bug here, the gate clamped from below, moves swiglu by ~1e-4 where
// the gate is under -7: its victims show at ~17x their bound and ~10x the candidate's drift.
constexpr double kVictimOverBound = 10;
constexpr double kVictimOverDrift = 4;

// The device backend in both precisions (hip-bf16: test::make_candidate).
const std::vector<std::string> kCandidates = {"cpu-f32", "hip", "hip-bf16"};


// The tiny model with unit magnitudes (every activation O(1)) or realistic ones (embedding RMS
// 0.03, massive residual channels from layer 1 on), loaded once per process.
const Model& tiny_model(SynthMagnitudes magnitudes) {
  static std::mutex lock;
  static std::map<SynthMagnitudes, std::unique_ptr<Model>> models;
  const std::lock_guard<std::mutex> hold(lock);
  auto& m = models[magnitudes];
  if (!m) {
    std::string dir = tiny_model_dir();
    if (magnitudes != SynthMagnitudes::unit) {
      SynthSpec spec = synth_preset("tiny");
      spec.magnitudes = magnitudes;
      dir = temp_dir("tiny-" + std::string(synth_magnitudes_name(magnitudes)));
      write_synthetic_checkpoint(spec, dir, false);
    }
    m = Model::load(dir);
  }
  return *m;
}

// Runs the reference and `candidate` in lockstep with replay over kTokens, traces both into
// `dir` and diffs them under the default criterion (derived bounds, local error).
DiffResult trace_and_diff(const Model& model, Backend& candidate, const std::string& dir) {
  auto reference = make_backend("reference", model);
  LockstepOptions options;
  options.prompt = kTokens;
  for (size_t i = 0; i < kTokens.size(); ++i) options.traced.insert(int(i));
  options.replay = true;
  const std::string ref_path = dir + "/reference.h5", cand_path = dir + "/candidate.h5";
  trace_lockstep(*reference, candidate, model, options, ref_path, cand_path);
  const TraceReader a(cand_path), b(ref_path);
  return diff_traces(a, b, Criterion::derived());
}

// The tiny model's stages are far too small to split across threads, and on a loaded machine
// OpenMP's barriers then cost a hundred times the work: each case runs on one thread.
class SingleThreaded {
 public:
  SingleThreaded() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(threads_); }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int threads_;
};

// The candidate on its own: its verdict, and per dataset its accumulated (drift) error.
struct Baseline {
  bool diverged = false;
  std::string verdict;
  std::map<std::string, double> accumulated_abs_err;
};

const Baseline& baseline(const std::string& candidate, SynthMagnitudes magnitudes) {
  static std::map<std::pair<std::string, SynthMagnitudes>, Baseline> runs;
  const auto key = std::pair{candidate, magnitudes};
  if (auto it = runs.find(key); it != runs.end()) return it->second;
  const Model& model = tiny_model(magnitudes);
  const auto backend = make_candidate(candidate, model);
  const DiffResult r = trace_and_diff(model, *backend, temp_dir("mutation-baseline"));
  Baseline b;
  b.diverged = r.diverged();
  b.verdict = verdict_line(r);
  for (const DatasetDiff& d : r.datasets)
    if (d.accumulated) b.accumulated_abs_err[d.path] = d.accumulated->values.max_abs_err;
  return runs.emplace(key, std::move(b)).first->second;
}

struct MutationCase {
  Mutation mutation;
  std::optional<int> mutated_layer;  // every layer when empty
  Stage blamed;
  int blamed_layer;
  int first_position;  // the first position the bug changes anything at
  SynthMagnitudes magnitudes = SynthMagnitudes::unit;
  // Whether a stage reads the bug's output downstream (logits feed only the sampled decision).
  bool has_victims = true;
  std::string_view label = {};  // test-name suffix where one mutation has several cases
  // The bug is in every layer but below rounding past the blamed one: no later layer may fail.
  bool invisible_past_blamed_layer = false;
};

// Layer 1 is a full-attention layer, layer 2 a sliding one (even layers slide).
const std::vector<MutationCase> kCases = {
    {Mutation::swiglu_gate_clamped_both_sides, 1, Stage::swiglu, 1, 0},
    {Mutation::swiglu_without_linear_plus_one, 1, Stage::swiglu, 1, 0},
    {Mutation::swiglu_silu_gate, 1, Stage::swiglu, 1, 0},
    {Mutation::swiglu_halves_not_interleaved, 1, Stage::swiglu, 1, 0},
    // With O(1) activations eps 1e-6 against 1e-5 moves RMSNorm by 4.5e-6 / mean(x^2): a few
    // times the float32 bound, and it shows at layer 1.
    {Mutation::rmsnorm_eps_1e6, 1, Stage::attn_norm, 1, 0, SynthMagnitudes::unit, true, "unit"},
    // With real magnitudes the embedding's mean square is 9e-4 and the bug moves layer 0's norm
    // by 0.5%; from layer 1 on the massive channels make the mean square ~800 and eps invisible,
    // so the bug, in every layer as it would be, is found at layer 0 and only there.
    {Mutation::rmsnorm_eps_1e6, std::nullopt, Stage::attn_norm, 0, 0, SynthMagnitudes::realistic,
     true, "realistic", true},
    {Mutation::attn_norm_with_ffn_norm_weights, 1, Stage::attn_norm, 1, 0},
    // At position 0 every angle is 0 and RoPE only scales by the concentration: the pairing and
    // the YaRN bounds show from position 1.
    {Mutation::rope_interleaved_pairs, 1, Stage::q_rope, 1, 1},
    {Mutation::yarn_bounds_truncated, 1, Stage::q_rope, 1, 1},
    {Mutation::rope_without_concentration, 1, Stage::q_rope, 1, 0},
    {Mutation::sink_of_next_head, 1, Stage::scores, 1, 0},
    {Mutation::sink_scaled_by_score_scale, 1, Stage::scores, 1, 0},
    // The window's extra key exists from position `window` on, on sliding layers only.
    {Mutation::sliding_window_one_key_too_many, 2, Stage::scores, 2, 8},
    {Mutation::gqa_head_modulo, 1, Stage::scores, 1, 0},
    {Mutation::softmax_without_sink, 1, Stage::att, 1, 0},
    {Mutation::k_rope_bf16_truncated, 1, Stage::k_rope, 1, 0},
    {Mutation::mxfp4_mlp1_nibbles_swapped, 1, Stage::mlp1, 1, 0},
    // mlp2's stage contract includes b2 before the routing weight: a port that adds b2 after it
    // has an mlp2 without b2, the first value to leave the reference.
    {Mutation::expert_bias_after_routing_weight, 1, Stage::mlp2, 1, 0},
    {Mutation::router_softmax_over_all_experts, 1, Stage::topk_w, 1, 0},
    {Mutation::topk_ascending, 1, Stage::topk_idx, 1, 0},
    {Mutation::o_proj_without_bias, 1, Stage::o_proj, 1, 0},
    {Mutation::resid_attn_without_residual, 1, Stage::resid_attn, 1, 0},
    {Mutation::lm_head_tied_to_embedding, std::nullopt, Stage::logits, kModelLayer, 0,
     SynthMagnitudes::unit, false},
};

std::string case_name(const MutationCase& c) {
  std::string n(mutation_info(c.mutation).name);
  if (!c.label.empty()) n += "_" + std::string(c.label);
  return n;
}

void PrintTo(const MutationCase& c, std::ostream* os) {
  *os << case_name(c);
}

std::string candidate_name(const std::string& c) {
  return candidate_test_name(c);
}

bool recomputed_by(const MutationCase& c, const StageKey& key) {
  const auto stages = mutation_info(c.mutation).stages;
  if (std::find(stages.begin(), stages.end(), key.stage) == stages.end()) return false;
  return key.layer == kModelLayer || !c.mutated_layer || *c.mutated_layer == key.layer;
}

bool after(const StageKey& x, const FirstDivergence& f, const Config& config) {
  const int order = execution_order(config, f.layer, f.stage);
  return std::tie(x.position, x.order) > std::tie(f.position, order);
}

class MutationTest : public ::testing::TestWithParam<std::tuple<std::string, MutationCase>> {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable(std::get<0>(GetParam())); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(MutationTest, BlamesTheBugsStageAndLayerNotItsVictims) {
  const auto& [candidate, c] = GetParam();
  const SingleThreaded one_thread;
  const Model& model = tiny_model(c.magnitudes);
  MutantBackend mutant(make_candidate(candidate, model), model, {c.mutation, c.mutated_layer, true});
  const DiffResult r = trace_and_diff(model, mutant, temp_dir("mutation"));
  std::cout << "[" << case_name(c) << "] " << verdict_line(r) << "\n";

  ASSERT_TRUE(r.diverged()) << "the bug went unnoticed";
  const FirstDivergence& f = *r.first_divergence;
  EXPECT_EQ(name(f.stage), name(c.blamed));
  EXPECT_EQ(f.layer, c.blamed_layer);
  EXPECT_EQ(f.position, c.first_position);
  EXPECT_EQ(f.status, DatasetStatus::Fail);
  EXPECT_EQ(f.judged, Judge::local);

  for (const DatasetDiff& d : r.datasets) {
    EXPECT_TRUE(!d.failed() || recomputed_by(c, d.key))
        << d.path << " fails by its local error (" << status_name(d.status)
        << "), but the bug does not recompute it";
    if (c.invisible_past_blamed_layer) {
      EXPECT_FALSE(d.failed() && d.key.layer > c.blamed_layer)
          << d.path << ": the bug was expected below rounding past layer " << c.blamed_layer;
    }
  }

  // Victims: later stages whose local error passes while their accumulated error is the bug's.
  // The most convincing one is shown: evidence >= 1 means both ratios clear their thresholds.
  const Baseline& alone = baseline(candidate, c.magnitudes);
  const DatasetDiff* victim = nullptr;
  double victim_evidence = 0;
  for (const DatasetDiff& d : r.datasets) {
    if (d.failed() || d.is_decision() || !d.accumulated || !after(d.key, f, model.config)) continue;
    const auto drift = alone.accumulated_abs_err.find(d.path);
    if (drift == alone.accumulated_abs_err.end()) continue;
    const double over_drift = d.accumulated->values.max_abs_err / drift->second;
    const double evidence =
        std::min(d.accumulated->values.share / kVictimOverBound, over_drift / kVictimOverDrift);
    if (evidence > victim_evidence) {
      victim = &d;
      victim_evidence = evidence;
    }
  }
  // In bf16 the candidate's own accumulated drift is that of BF16 operands: downstream of four of
  // the bugs (the gate clamped on both sides, eps 1e-6, the YaRN bounds and k_rope truncated) no
  // stage carries more than 1.0-3.2 times it (2026-11-27, docs/measurements.md), so an
  // accumulated comparison would not see them there. Local error still blames each at its stage
  // (asserted above); the victims are shown, not required.
  if (c.has_victims && candidate == "hip-bf16") {
    if (victim != nullptr)
      std::cout << "  strongest victim " << victim->path << ": accumulated error "
                << victim->accumulated->values.share << "x its bound and "
                << victim->accumulated->values.max_abs_err /
                       alone.accumulated_abs_err.at(victim->path)
                << "x the candidate's own (bf16 drift; not asserted)\n";
  } else if (c.has_victims) {
    ASSERT_NE(victim, nullptr) << "no later stage carries any error";
    std::cout << "  victim " << victim->path << ": accumulated error "
              << victim->accumulated->values.max_abs_err << " = "
              << victim->accumulated->values.share << "x its bound and "
              << victim->accumulated->values.max_abs_err /
                     alone.accumulated_abs_err.at(victim->path)
              << "x the candidate's own, local error " << victim->local->values.share
              << "x its bound: passes\n";
    EXPECT_GE(victim_evidence, 1) << "no later stage carries the bug's error";
  } else {
    EXPECT_LT(victim_evidence, 1) << victim->path << " carries an error the bug cannot reach";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, MutationTest,
    ::testing::Combine(::testing::ValuesIn(kCandidates), ::testing::ValuesIn(kCases)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, MutationCase>>& i) {
      return candidate_name(std::get<0>(i.param)) + "_" + case_name(std::get<1>(i.param));
    });

// No false alarms: the candidate alone, and each mutant's host re-implementation without its
// bug, stay inside every bound.
struct ControlCase {
  std::optional<Mutation> mutation;  // recomputed without its bug; none: the candidate alone
  SynthMagnitudes magnitudes = SynthMagnitudes::unit;
};

std::vector<ControlCase> control_cases() {
  std::vector<ControlCase> cases = {{std::nullopt, SynthMagnitudes::unit},
                                    {std::nullopt, SynthMagnitudes::realistic}};
  for (const MutationInfo& m : all_mutations())
    cases.push_back({m.mutation, SynthMagnitudes::unit});
  cases.push_back({Mutation::rmsnorm_eps_1e6, SynthMagnitudes::realistic});
  return cases;
}

std::string control_name(const ControlCase& c) {
  const std::string what = c.mutation
                               ? std::string(mutation_info(*c.mutation).name) + "_without_bug"
                               : std::string("no_mutant");
  return what + "_" + std::string(synth_magnitudes_name(c.magnitudes));
}

void PrintTo(const ControlCase& c, std::ostream* os) {
  *os << control_name(c);
}

class MutationControlTest : public ::testing::TestWithParam<std::tuple<std::string, ControlCase>> {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable(std::get<0>(GetParam())); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(MutationControlTest, PassesWithoutTheBug) {
  const auto& [candidate, c] = GetParam();
  const SingleThreaded one_thread;
  if (!c.mutation) {
    const Baseline& alone = baseline(candidate, c.magnitudes);
    std::cout << "[" << control_name(c) << "] " << alone.verdict << "\n";
    EXPECT_FALSE(alone.diverged) << alone.verdict;
    return;
  }
  const Model& model = tiny_model(c.magnitudes);
  MutantBackend recomputed(make_candidate(candidate, model), model,
                           {*c.mutation, std::nullopt, false});
  const DiffResult r = trace_and_diff(model, recomputed, temp_dir("mutation-control"));
  std::cout << "[" << control_name(c) << "] " << verdict_line(r) << "\n";
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, MutationControlTest,
    ::testing::Combine(::testing::ValuesIn(kCandidates), ::testing::ValuesIn(control_cases())),
    [](const ::testing::TestParamInfo<std::tuple<std::string, ControlCase>>& i) {
      return candidate_name(std::get<0>(i.param)) + "_" + control_name(std::get<1>(i.param));
    });

// A candidate whose kernel for attn_out does not read att (as the hip backend's bf16 attention
// computes it from q, k and v): its replay rows, recomputed from the reference's att by another
// kernel, say nothing of it. Here the free rows' attn_out at layer 1 carries a bug (scaled by
// 1 + 2^-10) that its replay rows do not: declared not replayable, the reference recomputes its
// own rows from its own att and KV cache and the verdict blames attn_out there; declared
// replayable, replay alone passes it (the hole the declaration closes); without the bug the
// recompute passes.
class FreeRowsAttnOutBug final : public ForwardingBackend {
 public:
  FreeRowsAttnOutBug(std::unique_ptr<Backend> inner, bool replays, bool bug)
      : ForwardingBackend(std::move(inner)), replays_(replays), bug_(bug) {}
  void begin_step(const Batch& b) override {
    inner().begin_step(b);
    seqs_ = b.seqs;
  }
  void run(Stage s, int layer) override {
    inner().run(s, layer);
    if (!bug_ || s != Stage::attn_out || layer != 1) return;
    for (size_t r = 0; r < seqs_.size(); ++r) {
      if (seqs_[r] != 0) continue;  // the replay rows stay right
      StageData d = inner().read(s, layer, int(r));
      for (float& x : d.f32) x *= 1 + 0x1p-10f;
      inner().write(s, layer, int(r), d);
    }
  }
  bool replays(Stage s, int layer) const override {
    return (replays_ || s != Stage::attn_out) && ForwardingBackend::replays(s, layer);
  }

 private:
  bool replays_, bug_;
  std::vector<int32_t> seqs_;
};

TEST(FusedStages, AStageReplayCannotReachIsJudgedByTheReferencesRecomputeOfItsOwnRows) {
  const SingleThreaded one_thread;
  const Model& model = tiny_model(SynthMagnitudes::unit);
  {
    FreeRowsAttnOutBug c(make_candidate("cpu-f32", model), false, true);
    const DiffResult r = trace_and_diff(model, c, temp_dir("fused-recompute"));
    std::cout << "[not replayable, bug] " << verdict_line(r) << "\n";
    ASSERT_TRUE(r.diverged()) << "the free rows' bug went unnoticed";
    EXPECT_EQ(name(r.first_divergence->stage), "attn_out");
    EXPECT_EQ(r.first_divergence->layer, 1);
    EXPECT_EQ(r.first_divergence->judged, Judge::local);
    for (const DatasetDiff& d : r.datasets) {
      EXPECT_TRUE(!d.failed() || (d.key.stage == Stage::attn_out && d.key.layer == 1))
          << d.path << " fails by its local error";
      // attn_out by the reference's recompute, every other stage by replay.
      EXPECT_EQ(d.recomputed, d.key.stage == Stage::attn_out) << d.path;
    }
  }
  {
    FreeRowsAttnOutBug c(make_candidate("cpu-f32", model), true, true);
    const DiffResult r = trace_and_diff(model, c, temp_dir("fused-replay"));
    std::cout << "[replayable, bug] " << verdict_line(r) << "\n";
    EXPECT_FALSE(r.diverged()) << "replay saw the free rows: " << verdict_line(r);
  }
  {
    FreeRowsAttnOutBug c(make_candidate("cpu-f32", model), false, false);
    const DiffResult r = trace_and_diff(model, c, temp_dir("fused-clean"));
    std::cout << "[not replayable, no bug] " << verdict_line(r) << "\n";
    EXPECT_FALSE(r.diverged()) << verdict_line(r);
  }
}

}  // namespace
}  // namespace parity::test
