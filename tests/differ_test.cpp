// Tests of the differ, the tolerance profiles, the reports and the parity-diff tool: metrics on
// hand-computed cases, non-finite handling, missing datasets, first-divergence order, routing
// flips, refusal of mismatched models, and the tool's exit codes 0/1/2.
#include "tracer/differ.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <pugixml.hpp>
#include <sstream>

#include "model/error.h"
#include "tests/test_util.h"
#include "tracer/bounds.h"
#include "tracer/escape.h"
#include "tracer/profiles.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Config diff_config(int hidden = 8) { return test::small_config(hidden); }

TraceMeta meta_for(const Config& c, const std::string& backend) {
  TraceMeta m;
  m.backend = backend;
  m.precision = backend == "reference" ? "float64" : "float32";
  m.config = c.to_json();
  m.fingerprint = "fingerprint-1";
  m.tokens = {1, 2};
  m.positions = {0, 1};
  m.created = "2024-01-01T00:00:00Z";
  return m;
}

StageData f64(std::vector<double> v, std::vector<size_t> dims = {}) {
  StageData d;
  d.type = StageData::Type::F64;
  d.dims = dims.empty() ? std::vector<size_t>{v.size()} : dims;
  d.f64 = std::move(v);
  return d;
}

StageData f32(const std::vector<double>& v, std::vector<size_t> dims = {}) {
  StageData d;
  d.type = StageData::Type::F32;
  d.dims = dims.empty() ? std::vector<size_t>{v.size()} : dims;
  for (double x : v) d.f32.push_back(float(x));
  return d;
}

StageData i32(std::vector<int32_t> v) {
  StageData d;
  d.type = StageData::Type::I32;
  d.dims = {v.size()};
  d.i32 = std::move(v);
  return d;
}

struct Row {
  int position;
  int layer;
  Stage stage;
  StageData data;
};

void write_trace(const std::string& path, const Config& c, const TraceMeta& meta,
                 const std::vector<Row>& rows) {
  TraceWriter w(path, meta);
  for (const Row& r : rows)
    w.record({r.position, r.layer, r.stage, execution_order(c, r.layer, r.stage)}, r.data);
  w.finish();
}

// The per-element bound atol + rtol |b| of a fixed tolerance.
std::vector<double> abs_rel(const StageData& b, double atol, double rtol) {
  std::vector<double> v(b.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = atol + rtol * std::fabs(b.at(i));
  return v;
}

const DatasetDiff& dataset(const DiffResult& r, const std::string& path) {
  for (const auto& d : r.datasets)
    if (d.path == path) return d;
  throw std::runtime_error("no dataset " + path + " in the diff result");
}

// ---- metrics on hand-computed cases --------------------------------------------------------

TEST(CompareValues, HandComputedMetrics) {
  // a = candidate, b = reference. Differences 0, 0.5, 0, 1; relative 0, 1, 0, 0.1.
  const StageData a = f64({1.0, 1.0, 3.0, 11.0});
  const StageData b = f64({1.0, 0.5, 3.0, 10.0});
  const ValueComparison v = compare_values(a, b, abs_rel(b, 0.1, 0.01), 10);
  EXPECT_EQ(v.elements, 4u);
  EXPECT_DOUBLE_EQ(v.max_abs_err, 1.0);
  EXPECT_EQ(v.max_abs_index, 3u);
  EXPECT_DOUBLE_EQ(v.max_rel_err, 1.0);
  EXPECT_EQ(v.max_rel_index, 1u);
  // Bounds 0.11, 0.105, 0.13, 0.2: elements 1 and 3 fail, using 0.5/0.105 and 1/0.2.
  EXPECT_EQ(v.mismatches, 2u);
  EXPECT_DOUBLE_EQ(v.share, 5.0);
  EXPECT_EQ(v.nonfinite_mismatches, 0u);
  ASSERT_TRUE(v.first_mismatch);
  EXPECT_EQ(v.first_mismatch->index, 1u);
  EXPECT_DOUBLE_EQ(v.first_mismatch->a, 1.0);
  EXPECT_DOUBLE_EQ(v.first_mismatch->b, 0.5);
  ASSERT_EQ(v.listed.size(), 2u);
  EXPECT_EQ(v.listed[1].index, 3u);
  // dot 120.5, |a|^2 132, |b|^2 110.25; sum of squared errors 1.25.
  EXPECT_NEAR(v.cosine, 120.5 / std::sqrt(132.0 * 110.25), 1e-15);
  EXPECT_NEAR(v.nmse, 1.25 / 110.25, 1e-15);
  EXPECT_GT(v.max_ulp, 0u);

  const ValueComparison listed_one = compare_values(a, b, abs_rel(b, 0.1, 0.01), 1);
  EXPECT_EQ(listed_one.mismatches, 2u);
  EXPECT_EQ(listed_one.listed.size(), 1u);
}

TEST(CompareValues, IdenticalAndZeroRows) {
  const ValueComparison same = compare_values(f64({1, -2, 3}), f32({1, -2, 3}), abs_rel(f32({1, -2, 3}), 0, 0), 10);
  EXPECT_EQ(same.mismatches, 0u);
  EXPECT_EQ(same.max_abs_err, 0.0);
  EXPECT_EQ(same.max_ulp, 0u);
  EXPECT_DOUBLE_EQ(same.cosine, 1.0);
  EXPECT_EQ(same.nmse, 0.0);
  EXPECT_EQ(same.share, 0.0);

  const ValueComparison zeros = compare_values(f64({0, 0}), f64({0, 0}), abs_rel(f64({0, 0}), 1e-5, 1e-4), 10);
  EXPECT_DOUBLE_EQ(zeros.cosine, 1.0);
  EXPECT_EQ(zeros.nmse, 0.0);

  // Reference all zero, candidate not: cosine 0, NMSE and relative error infinite.
  const ValueComparison off = compare_values(f64({1e-3, 0}), f64({0, 0}), abs_rel(f64({0, 0}), 1e-2, 0), 10);
  EXPECT_EQ(off.mismatches, 0u);  // within atol
  EXPECT_EQ(off.cosine, 0.0);
  EXPECT_TRUE(std::isinf(off.nmse));
  EXPECT_TRUE(std::isinf(off.max_rel_err));
  EXPECT_EQ(off.max_rel_index, 0u);
}

TEST(CompareValues, UlpDistanceInFloat32) {
  const float one = 1.0f;
  const float next = std::nextafter(one, 2.0f);
  const float next2 = std::nextafter(next, 2.0f);
  EXPECT_EQ(ulp_distance(one, one), 0u);
  EXPECT_EQ(ulp_distance(one, next2), 2u);
  EXPECT_EQ(ulp_distance(next2, one), 2u);
  EXPECT_EQ(ulp_distance(0.0f, -0.0f), 0u);
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(-tiny, tiny), 2u);
  const ValueComparison v = compare_values(f64({1.0, 2.0}), f32({double(next2), 2.0}), abs_rel(f32({double(next2), 2.0}), 1, 0), 10);
  EXPECT_EQ(v.max_ulp, 2u);
  // Non-finite pairs are skipped for ULP.
  const ValueComparison inf = compare_values(f64({-kInf, 1.0}), f64({-kInf, 1.0}), abs_rel(f64({-kInf, 1.0}), 0, 0), 10);
  EXPECT_EQ(inf.max_ulp, 0u);
}

TEST(CompareValues, NanAgainstANumberAlwaysFails) {
  const ValueComparison v = compare_values(f64({1.0, kNaN}), f64({1.0, 2.0}), abs_rel(f64({1.0, 2.0}), 1e9, 1e9), 10);
  EXPECT_EQ(v.mismatches, 1u);
  EXPECT_EQ(v.nonfinite_mismatches, 1u);
  EXPECT_TRUE(std::isinf(v.share));
  ASSERT_TRUE(v.first_mismatch);
  EXPECT_EQ(v.first_mismatch->index, 1u);
  EXPECT_TRUE(std::isnan(v.first_mismatch->a));
  // Metrics over the finite pairs only.
  EXPECT_EQ(v.max_abs_err, 0.0);
  EXPECT_DOUBLE_EQ(v.cosine, 1.0);

  EXPECT_EQ(compare_values(f64({kNaN}), f64({kNaN}), abs_rel(f64({kNaN}), 1, 1), 10).mismatches, 1u);
  EXPECT_EQ(compare_values(f64({kInf}), f64({1.0}), abs_rel(f64({1.0}), 1e9, 1e9), 10).nonfinite_mismatches, 1u);
  EXPECT_EQ(compare_values(f64({kInf}), f64({-kInf}), abs_rel(f64({-kInf}), 1e9, 1e9), 10).mismatches, 1u);
}

TEST(CompareValues, MaskedMinusInfinityOnBothSidesPasses) {
  const ValueComparison v =
      compare_values(f32({0.5, -kInf, 0.25}), f64({0.5, -kInf, 0.25}), abs_rel(f64({0.5, -kInf, 0.25}), 1e-5, 1e-4), 10);
  EXPECT_EQ(v.mismatches, 0u);
  EXPECT_EQ(v.nonfinite_mismatches, 0u);
  EXPECT_EQ(v.share, 0.0);
  EXPECT_EQ(compare_values(f32({-kInf}), f64({-1e30}), abs_rel(f64({-1e30}), 1e-5, 1e-4), 10).mismatches, 1u);
}

// ---- profiles ------------------------------------------------------------------------------

TEST(Profiles, NamedProfilesComeFromTheTable) {
  for (const auto& p : kToleranceProfiles) {
    const Tolerance t = tolerance_profile(p.name);
    EXPECT_EQ(t.name, p.name);
    EXPECT_EQ(t.base, p.base);
  }
  EXPECT_EQ(tolerance_profile("fp32").base, (AbsRel{1e-5, 1e-4}));
  EXPECT_EQ(tolerance_profile("bf16").base, (AbsRel{1e-2, 1.6e-2}));
  EXPECT_EQ(tolerance_profile("mxfp4").base, (AbsRel{5e-2, 5e-2}));
  expect_error([] { (void)tolerance_profile("fp8"); }, {"fp8", "fp32, bf16, mxfp4"});
  expect_error([] { (void)Tolerance::absolute_relative(-1, 0); }, {"atol"});
  expect_error([] { (void)Tolerance::absolute_relative(0, kNaN); }, {"rtol"});
}

TEST(Profiles, PerStageOverrides) {
  Tolerance t = tolerance_profile("fp32");
  const auto [stage, tol] = parse_stage_tolerance("logits=1e-3,2e-3");
  EXPECT_EQ(stage, Stage::logits);
  t.set_override(stage, tol);
  EXPECT_EQ(t.for_stage(Stage::logits), (AbsRel{1e-3, 2e-3}));
  EXPECT_EQ(t.for_stage(Stage::qkv), (AbsRel{1e-5, 1e-4}));
  EXPECT_EQ(t.to_json()["overrides"]["logits"]["rtol"].get<double>(), 2e-3);
  expect_error([] { (void)parse_stage_tolerance("nosuchstage=1,1"); }, {"nosuchstage"});
  expect_error([] { (void)parse_stage_tolerance("logits=1"); }, {"STAGE=ATOL,RTOL"});
  expect_error([] { (void)parse_stage_tolerance("logits=x,1"); }, {"\"x\""});
}

// ---- traces --------------------------------------------------------------------------------

class DiffTraces : public ::testing::Test {
 protected:
  Config c = diff_config();
  TempDir dir;
  std::string a_path = dir.file("candidate.h5");
  std::string b_path = dir.file("reference.h5");

  DiffResult diff(const std::vector<Row>& a_rows, const std::vector<Row>& b_rows,
                  const Tolerance& tol = tolerance_profile("fp32")) {
    write_trace(a_path, c, meta_for(c, "cpu-f32"), a_rows);
    write_trace(b_path, c, meta_for(c, "reference"), b_rows);
    const TraceReader a(a_path), b(b_path);
    return diff_traces(a, b, Criterion::fixed(tol));
  }
};

TEST_F(DiffTraces, WithinTolerancePasses) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  const DiffResult r = diff({{0, kModelLayer, Stage::embedding, f32(v)}},
                            {{0, kModelLayer, Stage::embedding, f64(v)}});
  EXPECT_FALSE(r.diverged());
  ASSERT_EQ(r.datasets.size(), 1u);
  EXPECT_EQ(r.datasets[0].status, DatasetStatus::Pass);
  EXPECT_EQ(r.a.backend, "cpu-f32");
  EXPECT_EQ(r.b.backend, "reference");
  EXPECT_EQ(r.num_layers, 2);
  EXPECT_NE(verdict_line(r).find("PASS"), std::string::npos);
}

TEST_F(DiffTraces, MissingDatasetsAreExplicitFailures) {
  const StageData e = f64(std::vector<double>(8, 1.0));
  const DiffResult r = diff({{0, kModelLayer, Stage::embedding, e}, {0, 0, Stage::attn_norm, e}},
                            {{0, kModelLayer, Stage::embedding, e}, {0, 1, Stage::attn_norm, e}});
  EXPECT_TRUE(r.diverged());
  EXPECT_EQ(dataset(r, "/pos_0/layer_0/attn_norm").status, DatasetStatus::MissingInB);
  EXPECT_EQ(dataset(r, "/pos_0/layer_1/attn_norm").status, DatasetStatus::MissingInA);
  EXPECT_EQ(r.failed_datasets(), 2u);
  ASSERT_TRUE(r.first_divergence);
  EXPECT_EQ(r.first_divergence->path, "/pos_0/layer_0/attn_norm");
  EXPECT_EQ(r.first_divergence->status, DatasetStatus::MissingInB);
  EXPECT_FALSE(r.first_divergence->element);
  const nlohmann::json j = report_json(r);
  EXPECT_EQ(j["first_divergence"]["status"], "missing_in_b");
  EXPECT_TRUE(j["first_divergence"]["index"].is_null());
  EXPECT_NE(report_text(r).find("missing in A"), std::string::npos);
}

// A row whose shape is not its stage's never reaches the differ: the writer refuses it at the
// source, naming the dataset and both shapes (the reader does the same for a file written by
// another tool; trace_test covers that side).
TEST_F(DiffTraces, ShapeMismatchIsRefusedWhereItIsWritten) {
  try {
    diff({{0, kModelLayer, Stage::embedding, f64({1, 2, 3, 4}, {2, 2})}},
         {{0, kModelLayer, Stage::embedding, f64({1, 2, 3, 4})}});
    FAIL() << "a [2, 2] embedding row was accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/pos_0/model/embedding"), std::string::npos) << what;
    EXPECT_NE(what.find("dims [2, 2]"), std::string::npos) << what;
    EXPECT_NE(what.find("is [8]"), std::string::npos) << what;
  }
}

TEST_F(DiffTraces, FirstDivergenceFollowsExecutionOrderNotWriteOrder) {
  const StageData ref = f64(std::vector<double>(8, 1.0));
  const StageData bad = f64({1, 1, 1, 2, 1, 1, 1, 1});
  // The later stage (layer 1 qkv... here resid_ffn of layer 1, and position 1) is written first.
  const DiffResult r = diff(
      {{1, kModelLayer, Stage::embedding, bad},
       {0, 1, Stage::resid_ffn, bad},
       {0, 0, Stage::o_proj, bad},
       {0, kModelLayer, Stage::embedding, ref}},
      {{0, kModelLayer, Stage::embedding, ref},
       {0, 0, Stage::o_proj, ref},
       {0, 1, Stage::resid_ffn, ref},
       {1, kModelLayer, Stage::embedding, ref}});
  ASSERT_TRUE(r.first_divergence);
  const FirstDivergence& f = *r.first_divergence;
  EXPECT_EQ(f.path, "/pos_0/layer_0/o_proj");
  EXPECT_EQ(f.position, 0);
  EXPECT_EQ(f.layer, 0);
  EXPECT_EQ(f.stage, Stage::o_proj);
  EXPECT_FALSE(f.expert);
  ASSERT_TRUE(f.element);
  EXPECT_EQ(f.element->index, 3u);
  EXPECT_DOUBLE_EQ(f.element->a, 2.0);
  EXPECT_DOUBLE_EQ(f.element->b, 1.0);
  EXPECT_DOUBLE_EQ(f.element->abs_err, 1.0);
  EXPECT_DOUBLE_EQ(f.element->rel_err, 1.0);
  EXPECT_EQ(r.failed_datasets(), 3u);
  // Datasets are listed in (position, order).
  for (size_t i = 1; i < r.datasets.size(); ++i)
    EXPECT_LE(std::tie(r.datasets[i - 1].key.position, r.datasets[i - 1].key.order),
              std::tie(r.datasets[i].key.position, r.datasets[i].key.order));
}

TEST_F(DiffTraces, RoutingFlipReportsTheReferenceMargin) {
  // Reference router: top-2 are experts 1 (2.0) and 3 (1.9); the 3rd largest is 1.0.
  const StageData router = f64({0.5, 2.0, 1.0, 1.9});
  const DiffResult r = diff(
      {{0, 1, Stage::router, f32({0.5, 2.0, 1.0, 1.9})}, {0, 1, Stage::topk_idx, i32({1, 2})}},
      {{0, 1, Stage::router, router}, {0, 1, Stage::topk_idx, i32({1, 3})}});
  // No replay datasets: judged by the accumulated decision, which the candidate's router
  // logits (equal to the reference's here) do not explain.
  const DatasetDiff d = dataset(r, "/pos_0/layer_1/topk_idx");
  EXPECT_EQ(d.judged, Judge::accumulated);
  EXPECT_EQ(d.status, DatasetStatus::Fail);
  ASSERT_TRUE(d.accumulated && d.accumulated->decision);
  const DecisionDiff& dd = *d.accumulated->decision;
  EXPECT_EQ(d.accumulated->values.mismatches, 1u);
  EXPECT_EQ(dd.slots, 1u);
  EXPECT_FALSE(dd.same_set);
  EXPECT_FALSE(dd.explained);
  ASSERT_TRUE(dd.margin);
  EXPECT_NEAR(*dd.margin, 0.9, 1e-12);
  EXPECT_NEAR(dd.gap, 0.9, 1e-7);  // expert 2 (1.0) chosen over expert 3 (1.9)
  ASSERT_TRUE(r.first_divergence);
  EXPECT_EQ(r.first_divergence->stage, Stage::topk_idx);
  ASSERT_TRUE(r.first_divergence->element);
  EXPECT_EQ(r.first_divergence->element->index, 1u);
  EXPECT_EQ(r.first_divergence->element->a, 2.0);
  EXPECT_EQ(r.first_divergence->element->b, 3.0);

  const nlohmann::json j = report_json(r);
  const auto& jd = j["datasets"][1];
  EXPECT_EQ(jd["stage"], "topk_idx");
  EXPECT_EQ(jd["accumulated"]["flip"], true);
  EXPECT_EQ(jd["accumulated"]["drift"], false);
  EXPECT_NEAR(jd["accumulated"]["margin"].get<double>(), 0.9, 1e-12);
  EXPECT_FALSE(jd["accumulated"].contains("max_abs_err"));  // decisions: mismatches only
  EXPECT_EQ(jd["accumulated"]["mismatches"], 1);
  EXPECT_TRUE(j["first_divergence"]["abs_err"].is_null());
  EXPECT_NE(verdict_line(r).find("routing flip"), std::string::npos) << verdict_line(r);

  // The same experts in another order is still a flip, reported as such.
  const DiffResult reordered = diff({{0, 1, Stage::router, f32({0.5, 2.0, 1.0, 1.9})}, {0, 1, Stage::topk_idx, i32({3, 1})}},
                                    {{0, 1, Stage::router, router}, {0, 1, Stage::topk_idx, i32({1, 3})}});
  const DatasetDiff d2 = dataset(reordered, "/pos_0/layer_1/topk_idx");
  ASSERT_TRUE(d2.accumulated && d2.accumulated->decision);
  EXPECT_EQ(d2.accumulated->decision->slots, 2u);
  EXPECT_TRUE(d2.accumulated->decision->same_set);
  EXPECT_NE(verdict_line(reordered).find("same experts, another order"), std::string::npos)
      << verdict_line(reordered);
}

TEST_F(DiffTraces, ExpertStagesNameTheReferenceExpert) {
  const size_t I2 = 2 * size_t(c.intermediate_size);
  std::vector<double> ref(2 * I2, 0.5), cand = ref;
  cand[I2 + 2] = 9.0;  // slot 1, column 2
  const DiffResult r = diff(
      {{0, 0, Stage::topk_idx, i32({2, 0})}, {0, 0, Stage::mlp1, f32(cand, {2, I2})}},
      {{0, 0, Stage::topk_idx, i32({2, 0})}, {0, 0, Stage::mlp1, f64(ref, {2, I2})}});
  ASSERT_TRUE(r.first_divergence);
  EXPECT_EQ(r.first_divergence->stage, Stage::mlp1);
  ASSERT_TRUE(r.first_divergence->expert);
  EXPECT_EQ(*r.first_divergence->expert, 0);
  EXPECT_EQ(r.first_divergence->element->index, I2 + 2);
  EXPECT_EQ(dataset(r, "/pos_0/layer_0/mlp1").slot_experts, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(report_json(r)["first_divergence"]["expert"], 0);
  EXPECT_NE(verdict_line(r).find("(expert 0)"), std::string::npos) << verdict_line(r);
  EXPECT_NE(report_text(r).find("[ 1 2 ]"), std::string::npos);
}

TEST_F(DiffTraces, PerStageOverrideLoosensOneStage) {
  const StageData ref = f64(std::vector<double>(8, 1.0));
  const StageData off = f64(std::vector<double>(8, 1.001));
  const std::vector<Row> a = {{0, kModelLayer, Stage::embedding, off}, {0, 0, Stage::attn_norm, off}};
  const std::vector<Row> b = {{0, kModelLayer, Stage::embedding, ref}, {0, 0, Stage::attn_norm, ref}};
  Tolerance tol = tolerance_profile("fp32");
  tol.set_override(Stage::embedding, {1e-2, 0});
  const DiffResult r = diff(a, b, tol);
  EXPECT_EQ(dataset(r, "/pos_0/model/embedding").status, DatasetStatus::Pass);
  EXPECT_EQ(dataset(r, "/pos_0/layer_0/attn_norm").status, DatasetStatus::Fail);
  EXPECT_EQ(r.first_divergence->stage, Stage::attn_norm);
  EXPECT_FALSE(diff(a, b, tolerance_profile("bf16")).diverged());
}

// A tensor-parallel group's rows (RowShards): a failing element of a split stage is blamed on
// the rank that computed it; what the gathering of the ranks' rows found fails the dataset even
// when its values are within the bound, naming the rank.
StageData with_shards(StageData d, RowShards s) {
  d.shards = std::move(s);
  return d;
}

TEST_F(DiffTraces, AGroupsDivergenceNamesTheRankThatComputedTheElement) {
  const std::vector<double> ref = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  std::vector<double> cand = ref;
  cand[6] += 0.5;  // in rank 1's range
  RowShards split{"ranges", 2, {{0, 0, 4}, {1, 4, 8}}, "", -1};
  const DiffResult r = diff({{0, kModelLayer, Stage::embedding, with_shards(f32(cand), split)}},
                            {{0, kModelLayer, Stage::embedding, f64(ref)}});
  ASSERT_TRUE(r.first_divergence);
  EXPECT_EQ(r.first_divergence->rank, 1);
  EXPECT_EQ(r.first_divergence->ranks, 2);
  EXPECT_NE(verdict_line(r).find("rank 1 of 2"), std::string::npos) << verdict_line(r);
  EXPECT_EQ(report_json(r)["first_divergence"]["rank"], 1);
  // Within the bound, the same row passes and names no rank.
  const DiffResult ok = diff({{0, kModelLayer, Stage::embedding, with_shards(f32(ref), split)}},
                             {{0, kModelLayer, Stage::embedding, f64(ref)}});
  EXPECT_FALSE(ok.diverged()) << verdict_line(ok);
}

TEST_F(DiffTraces, WhatTheGatheringFoundFailsTheDatasetAndNamesItsRank) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  RowShards reduced{"reduced",
                    2,
                    {},
                    "o_proj: rank 1's all-reduced element 3 is 0.4, the ranks' "
                    "partial sums add to 0.8",
                    1};
  const DiffResult r = diff(
      {{0, 0, Stage::attn_norm, with_shards(f32(v), reduced)}, {0, 1, Stage::attn_norm, f32(v)}},
      {{0, 0, Stage::attn_norm, f64(v)}, {0, 1, Stage::attn_norm, f64(v)}});
  ASSERT_TRUE(r.first_divergence);
  EXPECT_EQ(r.first_divergence->path, "/pos_0/layer_0/attn_norm");
  EXPECT_EQ(r.first_divergence->rank, 1);
  EXPECT_EQ(r.failed_datasets(), 1u);
  EXPECT_NE(verdict_line(r).find("tensor parallel: o_proj: rank 1's all-reduced"),
            std::string::npos)
      << verdict_line(r);
}

TEST_F(DiffTraces, AGroupsRowsAndPartialSumsSurviveTheTrace) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  RowShards split{"ranges", 2, {{1, 0, 3}, {0, 3, 8}}, "ranks differ", 0};
  TraceWriter w(a_path, meta_for(c, "hip"));
  const StageKey key{0, 1, Stage::o_proj, execution_order(c, 1, Stage::o_proj)};
  w.record(key, with_shards(f32(v), split));
  w.record_partial(key, 0, f32(std::vector<double>(8, 0.25)));
  w.record_partial(key, 1, f32(v));
  EXPECT_THROW(w.record_partial(key, 1, f32(v)), Error);      // recorded twice
  EXPECT_THROW(w.record_partial(key, 2, f32({1.0})), Error);  // not a row of the stage
  w.finish();
  const TraceReader a(a_path);
  const std::string path = trace_dataset_path(0, 1, Stage::o_proj);
  ASSERT_TRUE(a.shards(path));
  EXPECT_EQ(*a.shards(path), split);
  EXPECT_EQ(a.read(path).shards, split);
  EXPECT_EQ(a.entries().size(), 1u);  // /partials are beside the rows, not rows
  EXPECT_EQ(a.partial_ranks(), 2);
  EXPECT_EQ(a.read(trace_partial_path(1, 0, 1, Stage::o_proj)).f32, f32(v).f32);
  EXPECT_FALSE(a.has(trace_partial_path(2, 0, 1, Stage::o_proj)));
}

// moe_out of a group whose mlp2 rows are gathered partial sums: the bound counts the products
// the ranks summed (their magnitudes, which cancel in the gathered row) and the row's rounding.
class FixedBoundSource final : public BoundSource {
 public:
  std::map<Stage, StageData> rows;
  std::vector<StageData> parts;
  const StageData& output(Stage s, int) override { return rows.at(s); }
  const StageData* magnitude(Stage, int) override { return nullptr; }
  std::vector<const StageData*> partials(Stage s, int) override {
    std::vector<const StageData*> out;
    if (s == Stage::mlp2)
      for (const StageData& p : parts) out.push_back(&p);
    return out;
  }
};

TEST(DerivedBounds, AGroupsMoeOutIsHeldToTheProductsItsRanksSummed) {
  Config c = diff_config();
  const size_t k = size_t(c.num_experts_per_tok), H = size_t(c.hidden_size);
  FixedBoundSource src;
  src.rows[Stage::topk_w] = f64(std::vector<double>(k, 1.0 / double(k)));
  src.rows[Stage::mlp2] = f64(std::vector<double>(k * H, 1e-3), {k, H});
  src.rows[Stage::moe_out] = f64(std::vector<double>(H, 1e-3));
  const BoundOptions o;
  const PrecisionPolicy p = PrecisionPolicy::float32(4);
  const std::vector<double> one = derive_bound(c, Stage::moe_out, 0, 0, src, p, o);
  // Two ranks whose parts (+-1 around the sum) nearly cancel.
  src.parts = {f64(std::vector<double>(k * H, 1.0 + 5e-4), {k, H}),
               f64(std::vector<double>(k * H, -1.0 + 5e-4), {k, H})};
  const std::vector<double> two = derive_bound(c, Stage::moe_out, 0, 0, src, p, o);
  ASSERT_EQ(one.size(), H);
  ASSERT_EQ(two.size(), H);
  EXPECT_GT(two[0], 1000 * one[0]);  // |parts| ~ 2000 |sum|
  EXPECT_LT(two[0], 2e-5);           // and no more than the parts' own roundings
}

// attn_out of one key under BF16 operands on both sides (the bf16 attention, judged by the
// reference's recompute of its own inputs): p and v each rounded up by a whole unit roundoff
// make the output err by (1 + u)^2 - 1 = 2u + u^2 of it, u = 2^-8; the bound holds that, the
// square included (2^-16, more than every float32 rounding of the one-term sum).
class MagnitudeBoundSource final : public BoundSource {
 public:
  std::map<Stage, StageData> rows, magnitudes;
  const StageData& output(Stage s, int) override { return rows.at(s); }
  const StageData* magnitude(Stage s, int) override {
    const auto it = magnitudes.find(s);
    return it == magnitudes.end() ? nullptr : &it->second;
  }
};

TEST(DerivedBounds, AProductOfTwoBf16OperandsIsHeldToBothRoundingsAndTheirSquare) {
  const Config c = diff_config();
  const size_t nH = size_t(c.num_attention_heads), d = size_t(c.head_dim);
  MagnitudeBoundSource src;
  const double p = 0.75, v = 1.5, y = p * v;  // position 0: one key, then the sink's column
  std::vector<double> att;
  for (size_t h = 0; h < nH; ++h) att.insert(att.end(), {p, 1 - p});
  src.rows[Stage::att] = f64(att, {nH, 2});
  src.rows[Stage::attn_out] = f64(std::vector<double>(nH * d, y));
  src.magnitudes[Stage::attn_out] = f64(std::vector<double>(nH * d, y));
  BoundOptions o;
  o.own_inputs = true;
  const std::vector<double> b =
      derive_bound(c, Stage::attn_out, 0, 0, src, PrecisionPolicy::preset("bf16-operands"), o);
  ASSERT_EQ(b.size(), nH * d);
  const double u = 0x1p-8, worst = (p * (1 + u)) * (v * (1 + u)) - y;
  for (double x : b) EXPECT_GE(x, worst);
  // The float32 path's own inputs are exact: only its sum's and its store's roundings.
  const std::vector<double> f32_bound =
      derive_bound(c, Stage::attn_out, 0, 0, src, PrecisionPolicy::float32(4), o);
  EXPECT_LT(f32_bound[0], 1e-6 * y);
}

TEST_F(DiffTraces, AGroupsAttributesOrPartialsThatAreNotAGroupsAreRefusedNamingTheFile) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  const StageKey key{0, 1, Stage::o_proj, execution_order(c, 1, Stage::o_proj)};
  // A problem naming a rank outside the group.
  {
    TraceWriter w(a_path, meta_for(c, "hip"));
    w.record(key, with_shards(f32(v), RowShards{"reduced", 2, {}, "o_proj: differ", 5}));
    w.finish();
  }
  expect_error([&] { TraceReader a(a_path); }, {a_path, "shard_problem_rank=5"});
  const auto write_with_partial = [&] {  // a row and rank 0's partial sum of it
    fs::remove(a_path);
    TraceWriter w(a_path, meta_for(c, "hip"));
    w.record(key, f32(v));
    w.record_partial(key, 0, f32(v));
    w.finish();
  };
  // A partial-sums group that is not named rank_<rank>.
  for (const char* bad : {"/partials/rank_x", "/partials/ranks_0", "/partials/rank_99999"}) {
    write_with_partial();
    const hid_t f = H5Fopen(a_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Lmove(f, "/partials/rank_0", f, bad, H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(f);
    expect_error([&] { TraceReader a(a_path); }, {a_path, "rank_<rank>"});
  }
  // A partial sum whose shape is not its stage's.
  write_with_partial();
  {
    const hid_t f = H5Fopen(a_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const std::string p = trace_partial_path(0, 0, 1, Stage::o_proj);
    ASSERT_GE(H5Ldelete(f, p.c_str(), H5P_DEFAULT), 0);
    const hsize_t dims[1] = {3};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t ds =
        H5Dcreate2(f, p.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
  }
  expect_error([&] { TraceReader a(a_path); }, {a_path, "partials/rank_0"});
}

TEST(RowShardsText, RoundTripsAndRefusesWhatIsNotAGroupsRow) {
  const RowShards s{"ranges", 3, {{0, 0, 2}, {2, 2, 5}, {1, 5, 9}}, "", -1};
  std::string why;
  EXPECT_EQ(RowShards::parse(s.text(), 9, why), s) << why;
  EXPECT_EQ(s.rank_of(4), 2);
  EXPECT_EQ(s.rank_of(9), -1);
  for (const char* bad :
       {"", "ranges", "sliced 2", "ranges 0", "ranges 2 0:0-4 2:4-8", "ranges 2 0:0-4 1:3-8",
        "ranges 2 0:0-9", "ranges 2 0:4-4", "replicated 2 0:0-4", "ranges 2  0:0-4",
        "ranges 2 0:-1-4", "ranges 2 0:0x1-4", "ranges 99999 0:0-4"})
    EXPECT_FALSE(RowShards::parse(bad, 8, why)) << bad;
}

TEST_F(DiffTraces, AShardsAttributeThatIsNotAGroupsRowIsRefusedNamingTheFile) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  write_trace(a_path, c, meta_for(c, "hip"),
              {{0, kModelLayer, Stage::embedding,
                with_shards(f32(v), RowShards{"ranges", 2, {{0, 0, 4}, {1, 4, 12}}, "", -1})}});
  expect_error([&] { TraceReader a(a_path); }, {a_path, "shards", "range 2"});
}

TEST_F(DiffTraces, RefusesTracesOfDifferentModels) {
  const std::vector<Row> rows = {{0, kModelLayer, Stage::embedding, f64(std::vector<double>(8, 1.0))}};
  write_trace(a_path, c, meta_for(c, "cpu-f32"), rows);
  const Config other = diff_config(16);
  write_trace(b_path, other, meta_for(other, "reference"),
              {{0, kModelLayer, Stage::embedding, f64(std::vector<double>(16, 1.0))}});
  expect_error([&] { (void)diff_traces(TraceReader(a_path), TraceReader(b_path), Criterion::fixed(tolerance_profile("fp32"))); },
               {a_path, b_path, "different models", "hidden_size"});

  TraceMeta other_checkpoint = meta_for(c, "reference");
  other_checkpoint.fingerprint = "fingerprint-2";
  write_trace(b_path, c, other_checkpoint, rows);
  expect_error([&] { (void)diff_traces(TraceReader(a_path), TraceReader(b_path), Criterion::fixed(tolerance_profile("fp32"))); },
               {a_path, b_path, "fingerprint-1", "fingerprint-2"});

  TraceMeta other_tokens = meta_for(c, "reference");
  other_tokens.tokens = {1, 3};
  write_trace(b_path, c, other_tokens, rows);
  expect_error([&] { (void)diff_traces(TraceReader(a_path), TraceReader(b_path), Criterion::fixed(tolerance_profile("fp32"))); },
               {a_path, b_path, "different tokens", "position 1"});
}

// ---- reports -------------------------------------------------------------------------------

TEST_F(DiffTraces, ReportsInEveryFormat) {
  const StageData ref = f64({0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0});
  StageData cand = ref;
  cand.f64[3] = 2.5;
  cand.f64[7] = kNaN;
  const DiffResult r = diff({{0, 1, Stage::qkv, cand}, {0, kModelLayer, Stage::logits, ref}},
                            {{0, 1, Stage::qkv, ref}, {0, kModelLayer, Stage::logits, ref}});

  const std::string text = report_text(r, {.count = 10, .quiet = false});
  EXPECT_NE(text.find("dataset: /pos_0/layer_1/qkv  (stage qkv, layer 1, position 0)"), std::string::npos) << text;
  EXPECT_NE(text.find("position"), std::string::npos);
  EXPECT_NE(text.find("difference"), std::string::npos);
  EXPECT_NE(text.find("relative"), std::string::npos);
  EXPECT_NE(text.find("[ 3 ]"), std::string::npos);
  EXPECT_NE(text.find("2 differences found"), std::string::npos);
  EXPECT_NE(text.find("DIVERGED"), std::string::npos);
  EXPECT_EQ(text.find("dataset: /pos_0/model/logits"), std::string::npos) << "passing datasets get no header";
  const std::string one = report_text(r, {.count = 1, .quiet = false});
  EXPECT_NE(one.find("1 of 2 listed"), std::string::npos) << one;
  const std::string quiet = report_text(r, {.count = 10, .quiet = true});
  EXPECT_EQ(std::count(quiet.begin(), quiet.end(), '\n'), 1);
  EXPECT_EQ(quiet, verdict_line(r) + "\n");

  const nlohmann::json j = nlohmann::json::parse(report_json(r).dump());
  EXPECT_EQ(j["verdict"], "diverged");
  EXPECT_EQ(j["a"]["file"], a_path);
  EXPECT_EQ(j["b"]["backend"], "reference");
  EXPECT_EQ(j["criterion"]["profile"], "fp32");
  EXPECT_EQ(j["judged"], "accumulated");
  const auto& f = j["first_divergence"];
  EXPECT_EQ(f["position"], 0);
  EXPECT_EQ(f["layer"], 1);
  EXPECT_EQ(f["stage"], "qkv");
  EXPECT_TRUE(f["expert"].is_null());
  // The element named is the worst one: the NaN (its share of the bound is infinite).
  EXPECT_EQ(f["index"], 7);
  EXPECT_TRUE(f["candidate"].is_null());
  EXPECT_EQ(f["reference"], 4.0);
  EXPECT_TRUE(f["abs_err"].is_null());
  ASSERT_EQ(j["datasets"].size(), 2u);
  const auto& q = j["datasets"][0];
  for (const char* field : {"path", "position", "layer", "stage", "status", "judged", "local",
                            "accumulated", "amplification"})
    EXPECT_TRUE(q.contains(field)) << field;
  EXPECT_TRUE(q["local"].is_null()) << "no replay datasets in A";
  const auto& qa = q["accumulated"];
  for (const char* field : {"elements", "mismatches", "max_abs_err", "max_abs_index",
                            "max_rel_err", "max_rel_index", "max_ulp", "cosine", "nmse", "share",
                            "nonfinite_mismatches", "max_bound"})
    EXPECT_TRUE(qa.contains(field)) << field;
  EXPECT_EQ(q["status"], "fail");
  EXPECT_EQ(qa["mismatches"], 2);
  EXPECT_EQ(qa["nonfinite_mismatches"], 1);
  EXPECT_TRUE(qa["share"].is_null()) << "non-finite numbers are written as null";
  EXPECT_EQ(qa["max_abs_err"], 0.5);
  EXPECT_TRUE(j["datasets"][1]["layer"].is_null());
  EXPECT_EQ(j["datasets"][1]["status"], "pass");

  const std::string junit = report_junit(r);
  pugi::xml_document doc;
  ASSERT_TRUE(doc.load_string(junit.c_str())) << junit;
  const pugi::xml_node suites = doc.child("testsuites");
  ASSERT_TRUE(suites) << junit;
  EXPECT_FALSE(suites.attribute("skipped")) << "the JUnit schema has no skipped on testsuites";
  EXPECT_EQ(suites.attribute("failures").as_int(), 1);
  const pugi::xml_node suite = suites.child("testsuite");
  size_t testcases = 0, failing = 0;
  for (pugi::xml_node tc : suite.children("testcase")) {
    ++testcases;
    const std::string name = tc.attribute("name").as_string();
    if (pugi::xml_node f = tc.child("failure")) {
      ++failing;
      EXPECT_EQ(name, "qkv");
      // The culprit's testcase carries the first divergence.
      EXPECT_NE(std::string(f.attribute("message").as_string()).find("first divergence at position 0, layer 1, stage qkv"),
                std::string::npos) << junit;
      EXPECT_NE(std::string(f.text().as_string()).find("/pos_0/layer_1/qkv"), std::string::npos);
    }
    if (name == "logits") {
      EXPECT_FALSE(tc.first_child()) << "a passing stage is an empty testcase";
    }
    if (name == "mlp1") {
      EXPECT_NE(std::string(tc.child("skipped").attribute("message").as_string()).find("no mlp1 datasets"),
                std::string::npos);
    }
  }
  EXPECT_EQ(testcases, size_t(kNumStages));
  EXPECT_EQ(failing, 1u);
  pugi::xml_document err;
  ASSERT_TRUE(err.load_string(junit_error("parity-trace", "parity-trace: error: x.h5: no such file").c_str()));
  EXPECT_EQ(err.child("testsuites").attribute("errors").as_int(), 1);
  EXPECT_EQ(std::string(err.child("testsuites").child("testsuite").child("testcase").child("error")
                            .attribute("message").as_string()),
            "parity-trace: error: x.h5: no such file");

  const std::string html = report_html(r);
  EXPECT_NE(html.find("<table class=\"heat\">"), std::string::npos);
  EXPECT_NE(html.find("<th>L1</th>"), std::string::npos);
  EXPECT_NE(html.find("worst first"), std::string::npos) << "the first divergence cell is outlined";
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);

  EXPECT_EQ(parse_report_format("junit"), ReportFormat::Junit);
  expect_error([] { (void)parse_report_format("pdf"); }, {"pdf"});
}

// Whether `s` is valid UTF-8 with no control character but newline and tab (what a terminal or
// an XML parser can take).
bool clean_text(std::string_view s) {
  return printable_text(s) == s;
}

// Untrusted bytes for the reports: control characters (C0, DEL, C1) and invalid UTF-8 as \xNN,
// everything else kept; markup gets entities besides; JSON is valid UTF-8 whatever it holds.
TEST(Escape, EveryFormatGetsValidPrintableText) {
  EXPECT_EQ(printable_text("plain text, tabs\tand\nnewlines"), "plain text, tabs\tand\nnewlines");
  EXPECT_EQ(printable_text("caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80");
  EXPECT_EQ(printable_text("esc\x1b[2Jbel\x07" "del\x7f"), "esc\\x1b[2Jbel\\x07del\\x7f");
  EXPECT_EQ(printable_text("csi\xc2\x9b" "1m"), "csi\\xc2\\x9b1m");
  EXPECT_EQ(printable_text(std::string_view("nul\0!", 5)), "nul\\x00!");
  EXPECT_EQ(printable_text("bad\xff\xfe"), "bad\\xff\\xfe");
  EXPECT_EQ(printable_text("cut\xe2\x80"), "cut\\xe2\\x80");
  EXPECT_EQ(printable_text("overlong\xc0\xaf surrogate\xed\xa0\x80"),
            "overlong\\xc0\\xaf surrogate\\xed\\xa0\\x80");
  EXPECT_EQ(printable_text(printable_text("\x1b\xff")), printable_text("\x1b\xff")) << "idempotent";
  EXPECT_EQ(markup_text("<a href=\"x\">&'\x1b\xff"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;\\x1b\\xff");
  const nlohmann::json j = {{"backend", "port\xff\x1b"}};
  const std::string text = json_text(j);
  EXPECT_TRUE(nlohmann::json::accept(text)) << text;
  EXPECT_NE(text.find("\\u001b"), std::string::npos) << text;
}

// A trace's attributes (ESC, BEL, invalid UTF-8, markup) reach no report raw: the text report
// escapes them, the HTML and JUnit reports entity-escape them and are valid UTF-8 without
// control characters, and the JSON report is written (its dump used to throw
// [json.exception.type_error.316]) and parses.
TEST_F(DiffTraces, BytesFromTheTracesAreEscapedInEveryReport) {
  const std::vector<double> v = {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  std::vector<double> w = v;
  w[2] = 0.9;
  TraceMeta a = meta_for(c, "port\x1b[31m\x07<b>&\xff\xfe");
  a.precision = "f32\xc3\x28 \x1b]0;title\x07";
  write_trace(a_path, c, a, {{0, kModelLayer, Stage::embedding, f32(w)}});
  write_trace(b_path, c, meta_for(c, "reference"), {{0, kModelLayer, Stage::embedding, f64(v)}});
  const DiffResult r = diff_traces(TraceReader(a_path), TraceReader(b_path),
                                   Criterion::fixed(tolerance_profile("fp32")));
  ASSERT_TRUE(r.diverged());
  const std::string text = render_report(r, ReportFormat::Text);
  EXPECT_TRUE(clean_text(text)) << text;
  EXPECT_NE(text.find("port\\x1b[31m\\x07<b>&\\xff\\xfe"), std::string::npos) << text;
  EXPECT_TRUE(clean_text(verdict_line(r)));
  for (ReportFormat f : {ReportFormat::Html, ReportFormat::Junit}) {
    const std::string doc = render_report(r, f);
    EXPECT_TRUE(clean_text(doc)) << doc;
    EXPECT_EQ(doc.find("\\x07<b>"), std::string::npos) << doc;
    EXPECT_NE(doc.find("port\\x1b[31m\\x07&lt;b"), std::string::npos) << doc;
  }
  pugi::xml_document xml;
  EXPECT_TRUE(xml.load_string(render_report(r, ReportFormat::Junit).c_str()));
  std::string json;
  ASSERT_NO_THROW(json = render_report(r, ReportFormat::Json));
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["a"]["backend"].get<std::string>().find("\x1b"), 4u);
}

// ---- the parity-diff tool ------------------------------------------------------------------

struct ToolRun {
  int exit_code = -1;
  std::string output;
};

ToolRun run_parity_diff(const std::string& args, const std::string& scratch) {
  const std::string out = scratch + ".out";
  const std::string cmd = fmt::format("'{}' {} > '{}' 2>&1", PARITY_BIN_DIR "/parity-diff", args, out);
  const int status = std::system(cmd.c_str());
  ToolRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

TEST(ParityDiffTool, ExitCodes) {
  ASSERT_TRUE(fs::exists(PARITY_BIN_DIR "/parity-diff")) << "parity-diff is not built";
  const Config c = diff_config();
  TempDir dir;
  const std::string ref = dir.file("ref.h5"), same = dir.file("same.h5"), bad = dir.file("bad.h5"),
                    other = dir.file("other.h5"), text = dir.file("text.h5"),
                    scratch = dir.file("run");
  const std::vector<double> v = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  std::vector<double> w = v;
  w[5] = 0.9;
  write_trace(ref, c, meta_for(c, "reference"), {{0, kModelLayer, Stage::embedding, f64(v)}});
  write_trace(same, c, meta_for(c, "cpu-f32"), {{0, kModelLayer, Stage::embedding, f32(v)}});
  write_trace(bad, c, meta_for(c, "cpu-f32"), {{0, kModelLayer, Stage::embedding, f32(w)}});
  const Config c16 = diff_config(16);
  write_trace(other, c16, meta_for(c16, "cpu-f32"),
              {{0, kModelLayer, Stage::embedding, f32(std::vector<double>(16, 0.5))}});
  std::ofstream(text) << "not a trace\n";

  ToolRun r = run_parity_diff(fmt::format("'{}' '{}'", same, ref), scratch);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}' --atol 1e-5 --rtol 1e-4", bad, ref), scratch);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dataset: /pos_0/model/embedding"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 differences found"), std::string::npos) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}' --atol 1 --rtol 0 -q", bad, ref), scratch);
  EXPECT_EQ(r.exit_code, 0) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}' -q", bad, ref), scratch);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;

  const std::string json_out = dir.file("report.json");
  r = run_parity_diff(fmt::format("'{}' '{}' --profile bf16 --report json -o '{}'", bad, ref, json_out), scratch);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::ifstream jin(json_out);
  const nlohmann::json j = nlohmann::json::parse(jin);
  EXPECT_EQ(j["verdict"], "diverged");
  EXPECT_EQ(j["criterion"]["profile"], "bf16");
  EXPECT_EQ(j["first_divergence"]["index"], 5);

  for (const std::string fmt_name : {"junit", "html", "text"}) {
    r = run_parity_diff(fmt::format("'{}' '{}' --report {} -n 3", bad, ref, fmt_name), scratch);
    EXPECT_EQ(r.exit_code, 1) << fmt_name << ": " << r.output;
  }

  r = run_parity_diff(fmt::format("'{}' '{}'", text, ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(text), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("parity-diff: error:"), std::string::npos) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}'", other, ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("different models"), std::string::npos) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}'", dir.file("absent.h5"), ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;

  r = run_parity_diff(fmt::format("'{}' '{}' --profile fp8", same, ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_parity_diff(fmt::format("'{}' '{}' --atol 1e-5", same, ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_parity_diff(fmt::format("'{}' '{}' --report pdf", same, ref), scratch);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_parity_diff("--help", scratch);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace parity
