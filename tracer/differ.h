// The differ: pairs the datasets of a candidate trace (a) and a reference trace (b) by path,
// walks them in execution order, computes error metrics per dataset, compares index stages
// (topk_idx) as routing decisions, and names the first divergence.
//
// Criterion, per element: |a - b| > atol + rtol * |b|. A pair where one side is NaN or +-Inf
// and the two are not equal always fails; two equal infinities (masked -inf scores) pass.
// Metrics (max abs/rel error, ULP, cosine, NMSE, tolerance used) are taken over the pairs where
// both sides are finite. Datasets present on one side only, or with different shapes, fail.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/forward.h"
#include "tracer/profiles.h"
#include "tracer/trace_file.h"

namespace parity {

enum class DatasetStatus { Pass, Fail, MissingInA, MissingInB, ShapeMismatch };
// "pass", "fail", "missing_in_a", "missing_in_b", "shape_mismatch"
std::string_view status_name(DatasetStatus s);

// One mismatching element. rel_err is |a - b| / |b| (+inf when b is 0 and a is not; NaN when
// either side is not finite).
struct ElementMismatch {
  size_t index = 0;  // flat (row-major) index
  double a = 0, b = 0;
  double abs_err = 0, rel_err = 0;
};

// A topk_idx dataset compared as decisions.
struct RoutingFlip {
  size_t slots = 0;               // slots whose expert differs
  bool same_set = true;           // the same experts were selected, possibly in another order
  std::optional<double> margin;   // reference router logits: k-th largest minus (k+1)-th
};

// Metrics of one pair of rows of equal size, a = candidate, b = reference.
struct ValueComparison {
  size_t elements = 0;
  size_t mismatches = 0;
  size_t nonfinite_mismatches = 0;  // one side NaN/Inf and the two not equal
  double max_abs_err = 0;
  size_t max_abs_index = 0;
  double max_rel_err = 0;
  size_t max_rel_index = 0;
  uint64_t max_ulp = 0;  // float32 units in the last place, over pairs finite in float32
  double cosine = 1;     // over the finite pairs; 1 when both are all zero
  double nmse = 0;       // sum (a-b)^2 / sum b^2; +inf when b is all zero and a is not
  double tolerance_used = 0;  // max |a-b| / (atol + rtol |b|); +inf with a non-finite mismatch
  std::optional<ElementMismatch> first_mismatch;
  std::vector<ElementMismatch> listed;  // the first `max_listed` mismatches, in index order
};
ValueComparison compare_values(const StageData& a, const StageData& b, AbsRel tol,
                               size_t max_listed);

// Distance between float(x) and float(y) in float32 ULPs (0 for +0 and -0). Both must be finite
// in float32.
uint64_t ulp_distance(float x, float y);

struct DatasetDiff {
  std::string path;
  StageKey key;  // from the reference when both sides have the dataset
  DatasetStatus status = DatasetStatus::Pass;
  std::vector<size_t> dims_a, dims_b;
  AbsRel tolerance;
  ValueComparison values;             // for status Pass/Fail
  std::optional<RoutingFlip> routing;  // topk_idx only
  // Expert stages (mlp1, swiglu, mlp2): the reference's expert id per row (slot of topk_idx);
  // empty when the reference has no topk_idx for this position and layer.
  std::vector<int32_t> slot_experts;

  bool failed() const { return status != DatasetStatus::Pass; }
  bool is_decision() const { return info(key.stage).kind == ValueKind::Index; }
  // Comparable badness for heatmaps: tolerance used, +inf for missing, shape or routing failures.
  double severity() const;
};

struct FirstDivergence {
  std::string path;
  int position = 0;
  int layer = kModelLayer;
  Stage stage = Stage::embedding;
  DatasetStatus status = DatasetStatus::Fail;
  std::optional<int32_t> expert;           // expert stages: reference expert id of the row
  std::optional<ElementMismatch> element;  // absent for missing or shape-mismatched datasets
};

struct TraceSide {
  std::string file;
  std::string backend;
  std::string precision;
};

struct DiffResult {
  TraceSide a, b;  // a = candidate, b = reference
  Tolerance tolerance;
  int num_layers = 0;                 // from the traces' config
  std::vector<DatasetDiff> datasets;  // in (position, order) order
  std::optional<FirstDivergence> first_divergence;

  bool diverged() const { return first_divergence.has_value(); }
  size_t failed_datasets() const;
};

struct DiffOptions {
  size_t max_listed = 10;  // mismatching elements kept per dataset for the text report
};

// Throws parity::Error naming both files when the traces are of different models (config or
// checkpoint fingerprint differ) or of different tokens at the same position.
DiffResult diff_traces(const TraceReader& a, const TraceReader& b, const Tolerance& tol,
                       const DiffOptions& options = {});

}  // namespace parity
