// The differ: pairs the datasets of a candidate trace (A) and a reference trace (B) by path,
// walks them in execution order, and judges each stage by the error that stage itself made.
//
// Two errors per dataset:
//   local        this stage's own error, one of two ways:
//                  replay     A's replay dataset (the candidate stage run on the reference's
//                             inputs, model/lockstep.h) against B's output
//                  recompute  A's output against B's recompute dataset (the reference's stage
//                             run on A's own inputs, model/recompute.h): how a capture of a port
//                             we cannot run is judged; where B has no recompute dataset (A lacks
//                             an input), the dataset is judged by its accumulated error and the
//                             missing input is named
//   accumulated  A's output dataset (the candidate running free) against B: this stage's error
//                plus everything it inherited. Reported beside the local error with the
//                amplification (accumulated / local, max abs), so the reader sees where drift
//                grows; it decides nothing while a local error exists.
// The criterion is, per element, |a - b| <= bound: by default the derived bound of the stage
// (tracer/bounds.h) from B's values and A's precision policy; or a fixed atol + rtol |b| (a named
// profile, --atol/--rtol). The judged error is the local one when A has replay datasets, else
// the accumulated one (a trace made without replay; then drift can look like divergence, and
// the report says so). The first divergence is the first dataset in execution order whose judged
// error exceeds its criterion: the culprit, not its victims.
//
// A pair where one side is NaN or +-Inf and the two are not equal always fails; two equal
// infinities (masked -inf scores) pass, and a candidate score that masks with a finite value so
// low that its softmax weight underflows (below the row's maximum minus 110) counts as -inf.
// Decisions (topk_idx, sampled) are compared as decisions: a flip is drift when the values
// decided on explain it (the reference's gap between the two choices is within the bound of
// those values for the local decision, within the candidate's measured error of them for the
// accumulated one), otherwise a failure; the same experts in another order is named so.
// Datasets present on one side only, or with different shapes, fail -- except for a capture
// (A traced by a user's own port through the capture API, which records the stages it chooses:
// DiffOptions::capture, or A's run attribute says so): a dataset the reference has and the
// capture lacks is "not captured", listed and counted but neither a pass nor a failure, and the
// first divergence is found among the captured ones. A capture's dataset without a local error
// is judged, under derived bounds, against the tolerance profile of the storage it declares
// (derived bounds bound a stage's own error, not the drift it inherited).
//
// The norms' row scale (tracer/bounds.h): under derived bounds the local error of attn_norm,
// ffn_norm and final_norm is also fitted as one relative error of the whole row, which must stay
// within r's own error plus what the elements' roundings leave in the fit: an eps or a truncation
// that moves every element a little fails here when no single element shows it.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/forward.h"
#include "tracer/bounds.h"
#include "tracer/profiles.h"
#include "tracer/trace_file.h"

namespace parity {

// Unjudged: a dataset with neither error -- its inputs were not captured (no local error) and the
// reference skipped the prefix (no accumulated error); listed, counted, neither pass nor fail.
enum class DatasetStatus { Pass, Fail, MissingInA, MissingInB, ShapeMismatch, NotCaptured, Unjudged };
// "pass", "fail", "missing_in_a", "missing_in_b", "shape_mismatch", "not_captured", "unjudged"
std::string_view status_name(DatasetStatus s);

enum class Judge { local, accumulated };
std::string_view judge_name(Judge j);  // "local", "accumulated"

// How the differ decides.
struct Criterion {
  enum class Kind { derived, fixed };
  Kind kind = Kind::derived;
  BoundOptions bound;                // Kind::derived
  Tolerance tolerance;               // Kind::fixed: a profile or explicit --atol/--rtol
  std::optional<Judge> judge;        // default: local when A has replay datasets
  std::optional<PrecisionPolicy> policy;  // default: A's, else float32
  static Criterion derived(BoundOptions options = {});
  static Criterion fixed(Tolerance t);
  std::string describe() const;
  nlohmann::json to_json() const;
};

// One mismatching element. rel_err is |a - b| / |b| (+inf when b is 0 and a is not; NaN when
// either side is not finite); bound is what |a - b| was held to.
struct ElementMismatch {
  size_t index = 0;  // flat (row-major) index
  double a = 0, b = 0;
  double abs_err = 0, rel_err = 0;
  double bound = 0;
};

// Metrics of one pair of rows of equal size, a = candidate, b = reference.
struct ValueComparison {
  size_t elements = 0;
  size_t compared = 0;              // elements not excluded (rows of rerouted expert slots)
  size_t mismatches = 0;
  size_t nonfinite_mismatches = 0;  // one side NaN/Inf and the two not equal
  double max_abs_err = 0;
  size_t max_abs_index = 0;
  double max_rel_err = 0;
  size_t max_rel_index = 0;
  uint64_t max_ulp = 0;  // float32 units in the last place, over pairs finite in float32
  double cosine = 1;     // over the finite pairs; 1 when both are all zero
  double nmse = 0;       // sum (a-b)^2 / sum b^2; +inf when b is all zero and a is not
  double share = 0;      // max |a-b| / bound: the share of the criterion used; +inf on NaN/Inf
  size_t share_index = 0;
  double max_bound = 0;  // the largest per-element bound
  std::optional<ElementMismatch> worst;  // the element of the largest share
  std::optional<ElementMismatch> first_mismatch;
  std::vector<ElementMismatch> listed;  // the first `max_listed` mismatches, in index order
};
// `bound` holds one value per element; elements whose `include` is 0 are skipped (empty: all).
ValueComparison compare_values(const StageData& a, const StageData& b,
                               std::span<const double> bound, size_t max_listed,
                               std::span<const uint8_t> include = {});

// Distance between float(x) and float(y) in float32 ULPs (0 for +0 and -0). Both must be finite
// in float32.
uint64_t ulp_distance(float x, float y);

// The fit of a row's local error as one relative error of the row (the norms' row scale).
struct ScaleCheck {
  double estimate = 0;  // delta = sum e_i y_i / sum y_i^2
  double bound = 0;     // what a correct norm allows
  double share() const;  // |estimate| / bound
  bool failed() const { return share() > 1; }
};

// A decision stage (topk_idx, sampled) compared as decisions.
struct DecisionDiff {
  size_t slots = 0;               // slots whose choice differs
  bool same_set = true;           // topk_idx: the same experts, possibly in another order
  bool explained = true;          // every differing choice is within what the values allow
  std::optional<double> margin;   // reference: k-th minus (k+1)-th value (router logits, logits)
  // The worst differing slot: the reference's gap between the two choices and what explains it.
  double gap = 0, allowance = 0;
  bool drift() const { return slots > 0 && explained; }
};

// One side (local or accumulated) of one dataset against the reference.
struct SideDiff {
  ValueComparison values;
  std::optional<DecisionDiff> decision;
  std::optional<ScaleCheck> scale;  // norms under derived bounds, local side
  bool failed = false;
  double share() const;  // the larger of the values' and the row scale's
};

struct DatasetDiff {
  std::string path;
  StageKey key;  // from the reference when both sides have the dataset
  DatasetStatus status = DatasetStatus::Pass;
  std::string missing_path;  // the dataset that is missing, for Missing* statuses
  std::vector<size_t> dims_a, dims_b;
  Judge judged = Judge::local;
  std::optional<SideDiff> local;        // A has its replay dataset, or B its recompute dataset
  std::optional<SideDiff> accumulated;  // A has its output dataset
  // Why a dataset judged by its accumulated error has no local one: "qkv of layer 0 at position 3
  // not captured". Empty otherwise.
  std::string local_unavailable;
  // Judged by the accumulated error against DiffResult::fallback (a capture's dataset without a
  // local error, under derived bounds).
  bool fallback_tolerance = false;
  // Its local error is A's output minus B's recompute of it from A's own inputs: under
  // LocalSource::recompute, and in a replay trace for a stage A could not replay
  // (Backend::replays).
  bool recomputed = false;
  // Expert stages (mlp1, swiglu, mlp2): the reference's expert id per row (slot of topk_idx);
  // empty when the reference has no topk_idx for this position and layer.
  std::vector<int32_t> slot_experts;
  size_t rerouted_slots = 0;  // accumulated: rows whose expert differs from the reference's
  double amplification = 0;   // accumulated max abs err / local max abs err; NaN if undefined
  // A's row made by a tensor-parallel group (its "shards" attributes): the group's ranks; the
  // rank behind the failure -- the one the gathering of the ranks' rows named (which fails the
  // dataset whatever the values), or the one that computed the failing element -- or -1; and
  // what the gathering found, or which range holds the element.
  int ranks = 0;
  int rank = -1;
  std::string rank_note;

  bool failed() const {
    return status != DatasetStatus::Pass && status != DatasetStatus::NotCaptured &&
           status != DatasetStatus::Unjudged;
  }
  bool compared() const { return status == DatasetStatus::Pass || status == DatasetStatus::Fail; }
  bool is_decision() const { return parity::is_decision(key.stage); }
  // The side that decides; null when A lacks it (then the status says what is missing).
  const SideDiff* judged_side() const {
    const std::optional<SideDiff>& s = judged == Judge::local ? local : accumulated;
    return s ? &*s : nullptr;
  }
  // Comparable badness for heatmaps: the judged share, +inf for missing, shape or failed
  // decisions.
  double severity() const;
  double accumulated_severity() const;
};

struct FirstDivergence {
  std::string path;
  int position = 0;
  int layer = kModelLayer;
  Stage stage = Stage::embedding;
  DatasetStatus status = DatasetStatus::Fail;
  Judge judged = Judge::local;
  std::optional<int32_t> expert;           // expert stages: reference expert id of the row
  std::optional<ElementMismatch> element;  // absent for missing or shape-mismatched datasets
  double share = 0;                        // judged error / bound at the worst element
  std::optional<ScaleCheck> scale;         // a norm's row scale, when it failed
  std::optional<double> accumulated_abs_err;  // at the same element, when A has it
  double amplification = 0;
  int ranks = 0, rank = -1;  // a tensor-parallel group's rank behind it (DatasetDiff::rank)
  std::string rank_note;
};

struct TraceSide {
  std::string file;
  std::string backend;
  std::string precision;
};

// Where the local errors come from.
enum class LocalSource { none, replay, recompute };
std::string_view local_source_name(LocalSource s);  // "none", "replay", "recompute"

struct DiffResult {
  TraceSide a, b;  // a = candidate, b = reference
  Criterion criterion;
  Judge judged = Judge::local;
  bool a_has_replay = false;
  LocalSource local_source = LocalSource::none;
  // B holds only recomputed rows (the reference skipped the prefix: parity-trace
  // --skip-reference-prefix): there is no accumulated error to report.
  bool accumulated_unavailable = false;
  // The criterion of a capture's datasets without a local error, under derived bounds: the
  // tolerance profile of the storage the capture declares.
  std::optional<Tolerance> fallback;
  // One line each: what the reader should know before trusting the verdict (a capture whose
  // values contradict the precision it declares).
  std::vector<std::string> warnings;
  PrecisionPolicy policy;             // the candidate's, as the bounds used it
  int num_layers = 0;                 // from the traces' config
  std::vector<DatasetDiff> datasets;  // in (position, order) order
  std::optional<FirstDivergence> first_divergence;
  // Where the accumulated error first exceeds the criterion (drift), whatever decides.
  std::optional<std::string> first_drift_path;
  size_t drift_decisions = 0;  // decision flips explained by the values (not failures)
  // What DiffOptions::selection left out: its description and how many datasets it skipped.
  std::string selection;  // empty: everything was compared
  size_t not_selected = 0;
  bool capture = false;     // A is a capture (DiffOptions::capture, or A's run attribute)
  size_t not_captured = 0;  // datasets of B that the capture lacks
  size_t unjudged = 0;      // datasets with neither a local nor an accumulated error

  bool diverged() const { return first_divergence.has_value(); }
  size_t failed_datasets() const;
  // "scores (4 of 4), mlp1 (4 of 4)": the stages with datasets not captured, and how many of
  // each stage's datasets.
  std::string not_captured_stages() const;
};

// Which datasets to compare, as parity-diff's --stage/--layer/--position, object paths and
// --exclude give them (h5diff's objects and --exclude-path). A dataset is compared when it
// matches every non-empty set and at least one path when paths are given, and no exclude path.
// A path selects the object and everything under it ("/pos_3", "/pos_3/layer_1",
// "/pos_3/layer_1/qkv"); a trailing "/" is ignored. The first divergence is the first among
// the selected datasets.
struct DiffSelection {
  std::set<Stage> stages;
  std::set<int> layers;  // kModelLayer (-1) selects the model-scope stages
  std::set<int> positions;
  std::vector<std::string> paths, excluded;

  bool empty() const;
  bool selects(const std::string& path, const StageKey& key) const;
  std::string describe() const;  // "stage qkv, o_proj; layer 1; excluding /pos_0"
};

struct DiffOptions {
  size_t max_listed = 10;  // mismatching elements kept per dataset for the text report
  DiffSelection selection;
  // A is a capture of a user's port: B's datasets that A lacks are not captured, not missing.
  // Also when A's run attribute holds "capture" (what the capture writers record).
  bool capture = false;
  // A and B may come from different runs (their run_id differs): the same model, checkpoint and
  // tokens traced on two machines or two days. Two traces of one directory are still refused:
  // there, different runs are a trace left by an interrupted run beside a new one.
  bool across_runs = false;
};

// Whether a trace was written by a port through the capture API (its run attribute says so).
bool is_capture(const TraceMeta& meta);

// Throws parity::Error naming both files when the traces are of different runs (unless
// options.across_runs), of different models (config or checkpoint fingerprint differ) or of
// different tokens at the same position, or when a derived bound needs reference data B lacks.
DiffResult diff_traces(const TraceReader& a, const TraceReader& b, const Criterion& criterion,
                       const DiffOptions& options = {});

}  // namespace parity
