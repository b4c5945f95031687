// Recompute (model/recompute.h) and the precision policies it judges by (model/precision.h): the
// reference recomputing its own rows reproduces them exactly; a candidate's missing inputs are
// named; a correct float32 candidate judged the other way (the reference recomputing each of its
// stages from its own inputs) never diverges, over hundreds of positions and at realistic
// magnitudes; a common error of a norm's whole row that no element shows is found by the row
// scale; rounding to a storage format is round-to-nearest-even with the format's range.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/lockstep.h"
#include "model/precision.h"
#include "model/recompute.h"
#include "model/synth.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/bounds.h"
#include "tracer/differ.h"
#include "tracer/report.h"

namespace parity {
namespace {

// ---- rounding to a storage format -----------------------------------------------------------

TEST(Precision, RoundToStorageIsNearestEvenInTheFormat) {
  // bfloat16: 8 significant bits. 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1.
  EXPECT_EQ(round_to_storage(1 + 0x1p-8, kUnitBfloat16), 1.0);
  EXPECT_EQ(round_to_storage(1 + 3 * 0x1p-8, kUnitBfloat16), 1 + 0x1p-6);  // tie, up to even
  EXPECT_EQ(round_to_storage(1 + 0x1p-8 + 0x1p-20, kUnitBfloat16), 1 + 0x1p-7);
  EXPECT_EQ(round_to_storage(-1.0 - 0x1p-8 - 0x1p-20, kUnitBfloat16), -1.0 - 0x1p-7);
  // float16: 11 bits, normals from 2^-14, subnormals spaced 2^-24, largest 65504.
  EXPECT_EQ(round_to_storage(1 + 0x1p-11, kUnitFloat16), 1.0);
  EXPECT_EQ(round_to_storage(0x1p-24 * 2.6, kUnitFloat16), 0x1p-24 * 3);
  EXPECT_EQ(round_to_storage(65504.0, kUnitFloat16), 65504.0);
  EXPECT_EQ(round_to_storage(70000.0, kUnitFloat16), 70000.0) << "not representable: left as is";
  // float32 and bfloat16 subnormals.
  EXPECT_EQ(round_to_storage(0x1p-149 * 1.4, kUnitFloat32), 0x1p-149);
  EXPECT_EQ(round_to_storage(0x1p-133 * 1.6, kUnitBfloat16), 0x1p-132);
  EXPECT_EQ(round_to_storage(1 + 0x1p-30, kUnitFloat32), 1.0);
  // Values of the format are fixed points; float64 and other units leave values alone.
  for (double x : {0.0, -0.0, 1.5, -3.25, 1e-30, 0x1p100})
    EXPECT_EQ(round_to_storage(round_to_storage(x, kUnitBfloat16), kUnitBfloat16),
              round_to_storage(x, kUnitBfloat16));
  EXPECT_EQ(round_to_storage(1 + 0x1p-40, kUnitFloat64), 1 + 0x1p-40);
  EXPECT_EQ(round_to_storage(1 + 0x1p-40, 1e-3), 1 + 0x1p-40);
  EXPECT_TRUE(std::isnan(round_to_storage(std::nan(""), kUnitBfloat16)));
  EXPECT_EQ(round_to_storage(-std::numeric_limits<double>::infinity(), kUnitBfloat16),
            -std::numeric_limits<double>::infinity());
}

TEST(Precision, PresetsRoundTripThroughJsonAndOldPoliciesStillRead) {
  for (std::string_view name : PrecisionPolicy::preset_names()) {
    const PrecisionPolicy p = PrecisionPolicy::preset(name);
    EXPECT_EQ(p.name, name);
    const PrecisionPolicy back = PrecisionPolicy::from_json(p.to_json(), "test");
    EXPECT_EQ(back.to_json(), p.to_json()) << name;
    for (const auto& si : kStages) EXPECT_EQ(back.at(si.stage), p.at(si.stage)) << name << " " << si.name;
  }
  // transformers in bfloat16: its RMSNorm in float32, the experts' bias after a rounding, the
  // routed sum accumulated in bfloat16; everything else of the dtype.
  const PrecisionPolicy t = PrecisionPolicy::preset("transformers-bf16");
  EXPECT_EQ(t.at(Stage::attn_norm).intermediate, kUnitFloat32);
  EXPECT_EQ(t.at(Stage::q_rope).intermediate, kUnitBfloat16);
  EXPECT_EQ(t.at(Stage::mlp1).bias, kUnitBfloat16);
  EXPECT_EQ(t.at(Stage::moe_out).accumulation, kUnitBfloat16);
  EXPECT_EQ(t.coarsest_storage(), kUnitBfloat16);
  // A policy of format version 2 before per-stage policies: intermediates as the accumulation.
  const nlohmann::json old = {{"storage_unit_roundoff", 0x1p-8},
                              {"accumulation_unit_roundoff", 0x1p-24},
                              {"function_ulps", 4},
                              {"storage_min_normal", 0x1p-126}};
  const PrecisionPolicy o = PrecisionPolicy::from_json(old, "old");
  EXPECT_EQ(o.at(Stage::scores).intermediate, 0x1p-24);
  EXPECT_EQ(o.at(Stage::scores).operand, 0);
  EXPECT_EQ(o.at(Stage::scores), PrecisionPolicy::preset("bfloat16").at(Stage::scores));
}

TEST(Precision, BadPoliciesAreRefusedNamingTheSource) {
  nlohmann::json j = PrecisionPolicy::preset("float32").to_json();
  j["stages"] = {{"atn_norm", {{"storage_unit_roundoff", 0.5}}}};
  test::expect_message(
      [&] {
        try {
          PrecisionPolicy::from_json(j, "cap.h5 (precision_policy)");
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      "cap.h5", {"atn_norm", "not a stage"});
  j.erase("stages");
  j["intermediate_unit_roundoff"] = -1;
  EXPECT_THROW(PrecisionPolicy::from_json(j, "x"), Error);
  j["intermediate_unit_roundoff"] = 0x1p-8;
  j["surprise"] = 1;
  EXPECT_THROW(PrecisionPolicy::from_json(j, "x"), Error);
  EXPECT_THROW(PrecisionPolicy::preset("bfloat17"), Error);
}

// ---- recompute --------------------------------------------------------------------------------

std::vector<int32_t> tokens_for(int n, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((3 + 7919ll * i) % vocab));
  return t;
}

// The reference's own free rows, as the candidate of a recompute (no replay).
std::string reference_as_candidate(const Model& m, const std::vector<int32_t>& tokens,
                                   const std::string& dir) {
  auto ref = make_reference_backend(m);
  auto twin = make_reference_backend(m);
  LockstepOptions o;
  o.prompt = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) o.traced.insert(int(i));
  o.replay = false;
  trace_lockstep(*ref, *twin, m, o, dir + "/twin-reference.h5", dir + "/candidate.h5");
  return dir + "/candidate.h5";
}

TEST(Recompute, TheReferenceRecomputingItsOwnRowsReproducesThem) {
  const auto m = Model::load(test::tiny_model_dir());
  const std::string dir = test::temp_dir("recompute-self");
  const std::string cand = reference_as_candidate(*m, tokens_for(10, m->config.vocab_size), dir);
  const TraceReader c(cand);
  auto ref = make_reference_backend(*m);
  const RecomputeResult rr = trace_recompute(*ref, *m, c, PrecisionPolicy::float64(), 4,
                                             dir + "/reference.h5", nlohmann::json::object());
  EXPECT_EQ(rr.not_in_storage, 0u);
  EXPECT_GT(rr.input_values, 0u);
  const TraceReader b(dir + "/reference.h5");
  size_t compared = 0;
  for (const auto& e : c.entries()) {
    const std::string rp = trace_dataset_path(e.key.position, e.key.layer, e.key.stage, Series::recompute);
    ASSERT_TRUE(b.has(rp)) << rp;
    const StageData x = c.read(e.path), y = b.read(rp), z = b.read(e.path);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x.at(i), y.at(i)) << rp << " [" << i << "]";
      ASSERT_EQ(x.at(i), z.at(i)) << e.path << " [" << i << "]";
    }
    ++compared;
  }
  EXPECT_EQ(compared, 10u * size_t(stages_per_position(m->config)));
  // Judged: every local error is zero.
  const DiffResult r = diff_traces(c, b, Criterion::derived());
  EXPECT_EQ(r.local_source, LocalSource::recompute);
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
  for (const auto& d : r.datasets)
    if (d.local && !d.is_decision()) {
      EXPECT_EQ(d.local->values.max_abs_err, 0.0) << d.path;
    }
}

// Rows of a trace with some removed.
class Without final : public CandidateRows {
 public:
  Without(const TraceReader& t, std::vector<std::tuple<int, int, Stage>> gone) : t_(t), gone_(std::move(gone)) {}
  bool has(int p, int l, Stage s) const override {
    return std::find(gone_.begin(), gone_.end(), std::tuple{p, l, s}) == gone_.end() &&
           t_.has(trace_dataset_path(p, l, s));
  }
  StageData read(int p, int l, Stage s) const override { return t_.read(trace_dataset_path(p, l, s)); }

 private:
  const TraceReader& t_;
  std::vector<std::tuple<int, int, Stage>> gone_;
};

TEST(Recompute, AMissingInputIsNamedAndTheCacheRowsOfEveryEarlierPositionCount) {
  const auto m = Model::load(test::tiny_model_dir());
  const std::string dir = test::temp_dir("recompute-missing");
  const TraceReader c(reference_as_candidate(*m, tokens_for(6, m->config.vocab_size), dir));
  const Without rows(c, {{2, 0, Stage::k_rope}, {4, 1, Stage::qkv}, {3, kModelLayer, Stage::final_norm}});
  const RecomputeCoverage cov(rows, m->config, 5);
  EXPECT_FALSE(cov.missing(0, 0, Stage::scores));
  EXPECT_FALSE(cov.missing(1, 0, Stage::attn_out));
  // scores at position 2 appends position 2's own k_rope row: that input is missing.
  ASSERT_TRUE(cov.missing(2, 0, Stage::scores));
  EXPECT_EQ(cov.missing(2, 0, Stage::scores)->describe(), "k_rope of layer 0 at position 2");
  // Later positions attend over it: their scores and attn_out lack it too; other layers do not.
  EXPECT_EQ(cov.missing(5, 0, Stage::attn_out)->describe(), "k_rope of layer 0 at position 2");
  EXPECT_FALSE(cov.missing(5, 1, Stage::scores));
  EXPECT_EQ(cov.missing(4, 1, Stage::q_rope)->describe(), "qkv of layer 1 at position 4");
  EXPECT_FALSE(cov.missing(4, 1, Stage::attn_norm));
  EXPECT_EQ(cov.missing(3, kModelLayer, Stage::logits)->describe(), "final_norm at position 3");
  EXPECT_FALSE(cov.missing(3, kModelLayer, Stage::embedding)) << "the token is always known";
}

// cpu-f32 (a correct float32 port) judged as a capture: each stage recomputed by the reference
// from cpu-f32's own inputs, under the float32 preset. It must never diverge.
DiffResult cpu_f32_by_recompute(const Model& m, int positions, const std::string& tag) {
  const std::string dir = test::temp_dir(tag);
  auto ref = make_reference_backend(m);
  auto cand = make_cpu_f32_backend(m);
  LockstepOptions o;
  o.prompt = tokens_for(positions, m.config.vocab_size);
  for (int i = 0; i < positions; ++i) o.traced.insert(i);
  o.replay = false;
  o.step_rows = 128;
  trace_lockstep(*ref, *cand, m, o, dir + "/lockstep-reference.h5", dir + "/candidate.h5");
  const TraceReader c(dir + "/candidate.h5");
  trace_recompute(*ref, m, c, PrecisionPolicy::preset("float32"), 128, dir + "/reference.h5",
                  nlohmann::json::object());
  return diff_traces(c, TraceReader(dir + "/reference.h5"), Criterion::derived());
}

double largest_local_share(const DiffResult& r) {
  double worst = 0;
  for (const auto& d : r.datasets)
    if (d.local && !d.is_decision() && !bound_is_rounding(d.key.stage))
      worst = std::max(worst, d.local->share());
  return worst;
}

TEST(Recompute, CorrectFloat32PortNeverDivergesByRecomputedLocalError) {
  const auto m = Model::load(test::tiny_model_dir());
  const DiffResult r = cpu_f32_by_recompute(*m, 96, "recompute-cpu-f32");
  std::cout << "cpu-f32 by recompute, tiny, 96 positions: largest local share "
            << largest_local_share(r) << "\n";
  EXPECT_EQ(r.local_source, LocalSource::recompute);
  EXPECT_EQ(r.judged, Judge::local);
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
  for (const auto& d : r.datasets) ASSERT_TRUE(d.local.has_value()) << d.path;
}

TEST(Recompute, CorrectFloat32PortNeverDivergesAtRealisticMagnitudes) {
  SynthSpec spec = synth_preset("tiny");
  spec.magnitudes = SynthMagnitudes::realistic;
  const std::string dir = test::temp_dir("tiny-realistic");
  write_synthetic_checkpoint(spec, dir, false);
  const auto m = Model::load(dir);
  const DiffResult r = cpu_f32_by_recompute(*m, 32, "recompute-cpu-f32-real");
  std::cout << "cpu-f32 by recompute, tiny realistic, 32 positions: largest local share "
            << largest_local_share(r) << "\n";
  EXPECT_FALSE(r.diverged()) << verdict_line(r);
}

// ---- the norms' row scale --------------------------------------------------------------------

// A norm's rows as a BoundSource: its input x and output y.
class NormSource final : public BoundSource {
 public:
  NormSource(StageData x, StageData y) : x_(std::move(x)), y_(std::move(y)) {}
  const StageData& output(Stage s, int) override { return s == Stage::ffn_norm ? y_ : x_; }
  const StageData* magnitude(Stage, int) override { return nullptr; }

 private:
  StageData x_, y_;
};

TEST(Bounds, TheRowScaleFindsACommonErrorNoElementShows) {
  Config c = test::small_config(256);
  const size_t H = size_t(c.hidden_size);
  StageData x, y;
  x.type = y.type = StageData::Type::F64;
  x.dims = y.dims = {H};
  double ms = 0;
  for (size_t i = 0; i < H; ++i) {
    x.f64.push_back(std::sin(double(i) * 1.7) * 0.8 + 0.1);
    ms += x.f64.back() * x.f64.back();
  }
  ms /= double(H);
  for (size_t i = 0; i < H; ++i) y.f64.push_back(x.f64[i] / std::sqrt(ms + c.rms_norm_eps));
  NormSource src(x, y);
  const PrecisionPolicy p = PrecisionPolicy::preset("bfloat16");
  BoundOptions o;
  o.own_inputs = true;
  const auto per_element = derive_bound(c, Stage::ffn_norm, 0, 0, src, p, o);
  const auto rb = row_scale_bound(c, Stage::ffn_norm, 0, src, p, o);
  ASSERT_TRUE(rb);
  // A port declared bfloat16 whose values are in fact float32: correct, and one whose whole row is
  // 0.2 % too large (an eps gone wrong), half a bfloat16 rounding: below every element's bound.
  for (double common : {0.0, 2e-3}) {
    StageData cand = y;
    for (double& v : cand.f64) v = round_to_storage(v * (1 + common), kUnitFloat32);
    size_t over = 0;
    double ey = 0, yy = 0, var = 0;
    for (size_t i = 0; i < H; ++i) {
      over += std::fabs(cand.f64[i] - y.f64[i]) > per_element[i];
      ey += (cand.f64[i] - y.f64[i]) * y.f64[i];
      yy += y.f64[i] * y.f64[i];
      var += y.f64[i] * y.f64[i] * rb->element[i] * rb->element[i] / 3;
    }
    const double delta = ey / yy, allowed = rb->shared + 1.5 * o.lambda * std::sqrt(var) / yy;
    EXPECT_EQ(over, 0u) << "no element exceeds its bound (common " << common << ")";
    if (common == 0) {
      EXPECT_LT(std::fabs(delta), allowed);
    } else {
      EXPECT_GT(std::fabs(delta), allowed) << delta << " vs " << allowed;
    }
  }
}

}  // namespace
}  // namespace parity

// ---- long positions at the cost of one -----------------------------------------------------

namespace parity {
namespace {

nlohmann::json report_of(const std::string& out) {
  std::ifstream in(out + "/report.json");
  return nlohmann::json::parse(in);
}

TEST(SkipReferencePrefix, APositionFarIntoTheContextIsJudgedByItsLocalErrorAlone) {
  const std::string dir = test::temp_dir("skip-prefix");
  const std::string common = "--model " + test::tiny_model_dir() +
                             " --token 5 --pos 2000 --candidate cpu-f32 --skip-reference-prefix ";
  const auto r = test::run_tool("parity-trace", common + "--out " + dir + "/ok");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("reference: skipped the prefix"), std::string::npos) << r.output;
  const auto j = report_of(dir + "/ok");
  EXPECT_EQ(j["local_source"], "recompute");
  EXPECT_TRUE(j["accumulated_unavailable"].get<bool>());
  EXPECT_EQ(j["datasets"].size(), size_t(stages_per_position(Model::load(test::tiny_model_dir())->config)));
  for (const auto& d : j["datasets"]) {
    EXPECT_EQ(d["position"], 2000);
    EXPECT_EQ(d["judged"], "local") << d["path"];
    EXPECT_TRUE(d["accumulated"].is_null()) << d["path"];
  }
  // A fault is blamed at its stage: the candidate's cache carries it too, and the reference
  // recomputes from that cache, so the stages reading it are not blamed.
  for (const std::string stage : {"k_rope", "scores", "mlp1"}) {
    const std::string out = dir + "/" + stage;
    const auto f = test::run_tool("parity-trace", common + "--inject " + stage + ":2 --out " + out);
    ASSERT_EQ(f.exit_code, 1) << f.output;
    const auto fj = report_of(out);
    EXPECT_EQ(fj["first_divergence"]["stage"], stage) << f.output;
    EXPECT_EQ(fj["first_divergence"]["layer"], 2) << f.output;
  }
  // What it cannot be asked.
  const auto bad = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                       " --tokens 1,2,3 --skip-reference-prefix --out " +
                                                       dir + "/bad");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--skip-reference-prefix needs --token T --pos P"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace parity
