// The differ: per-dataset local and accumulated errors between a candidate and a reference
// trace, judged against derived bounds or a fixed tolerance; decisions for topk_idx and
// sampled; the first divergence in execution order.
#include "tracer/differ.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <filesystem>
#include <fmt/ranges.h>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "model/error.h"
#include "model/recompute.h"
#include "model/untrusted.h"
#include "tracer/escape.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A candidate score this far below its row's maximum has a softmax weight below e^-110,
// which underflows to 0 in float32 and bfloat16: as masked as -inf.
constexpr double kMaskedGap = 110;

// Maps a float's bits onto integers that are ordered like the floats (+0 and -0 both to 0).
int64_t ordered_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return (u & 0x80000000u) != 0 ? -int64_t(u & 0x7fffffffu) : int64_t(u);
}

void note_mismatch(ValueComparison& v, const ElementMismatch& m, size_t max_listed) {
  ++v.mismatches;
  if (!v.first_mismatch) v.first_mismatch = m;
  if (v.listed.size() < max_listed) v.listed.push_back(m);
}

std::string json_value_text(const nlohmann::json& j) {
  if (j.is_null()) return "(absent)";
  std::string s = json_text(j);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

bool in_one_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  const fs::path da = fs::absolute(a, ec).parent_path(), db = fs::absolute(b, ec).parent_path();
  return fs::equivalent(da, db, ec);
}

// Refuses to compare traces of different runs (unless across_runs), models, checkpoints or
// token sequences.
void check_same_model(const TraceReader& a, const TraceReader& b, bool across_runs) {
  const TraceMeta &ma = a.meta(), &mb = b.meta();
  // First: a run killed before it wrote its candidate leaves its new reference beside the
  // previous run's candidate, and those may well agree on everything below. Two runs kept apart
  // (two machines, two days) are compared when asked for.
  if (!ma.run_id.empty() && !mb.run_id.empty() && ma.run_id != mb.run_id) {
    if (in_one_directory(a.path(), b.path()))
      fail("{} and {} come from different runs (run_id {} vs {}) but lie in one directory: one "
           "was left by an earlier or interrupted run; trace again (to compare two runs on "
           "purpose, keep each run's traces in a directory of its own and give --across-runs)",
           a.path(), b.path(), ma.run_id, mb.run_id);
    if (!across_runs)
      fail("{} and {} come from different runs (run_id {} vs {}): to compare two runs of the "
           "same model, checkpoint and tokens (two machines, two days), give --across-runs; "
           "else trace again",
           a.path(), b.path(), ma.run_id, mb.run_id);
  }
  // Traces written by other writers (a capture from Python records the checkpoint's config.json
  // as it is) may spell the same config otherwise: what decides is the config they mean.
  const nlohmann::json ca = a.config().to_json(), cb = b.config().to_json();
  if (ca != cb) {
    std::string what = "config differs";
    if (ca.is_object() && cb.is_object()) {
      std::set<std::string> keys;
      for (const auto& [k, v] : ca.items()) keys.insert(k);
      for (const auto& [k, v] : cb.items()) keys.insert(k);
      for (const auto& k : keys) {
        const auto va = ca.contains(k) ? ca[k] : nlohmann::json();
        const auto vb = cb.contains(k) ? cb[k] : nlohmann::json();
        if (va != vb) {
          what = fmt::format("config field {}: {} vs {}", k, json_value_text(va), json_value_text(vb));
          break;
        }
      }
    }
    fail("{} and {} are traces of different models ({}); diff traces of the same checkpoint",
         a.path(), b.path(), what);
  }
  if (!ma.fingerprint.empty() && !mb.fingerprint.empty() && ma.fingerprint != mb.fingerprint)
    fail("{} and {} are traces of different checkpoints (fingerprint {} vs {}); diff traces of "
         "the same checkpoint",
         a.path(), b.path(), ma.fingerprint, mb.fingerprint);
  auto tokens_by_position = [](const TraceMeta& m) {
    std::map<int32_t, int32_t> t;
    const bool explicit_positions = m.positions.size() == m.tokens.size();
    for (size_t i = 0; i < m.tokens.size(); ++i)
      t[explicit_positions ? m.positions[i] : int32_t(i)] = m.tokens[i];
    return t;
  };
  const auto ta = tokens_by_position(ma), tb = tokens_by_position(mb);
  for (const auto& [pos, token] : ta) {
    const auto it = tb.find(pos);
    if (it != tb.end() && it->second != token)
      fail("{} and {} were traced on different tokens (position {}: token {} vs {})", a.path(),
           b.path(), pos, token, it->second);
  }
}

int layers_in(const TraceReader& a, const TraceReader& b) {
  const auto& c = b.meta().config;
  if (c.is_object() && c.contains("num_hidden_layers") && c["num_hidden_layers"].is_number_integer())
    return c["num_hidden_layers"].get<int>();
  int layers = 0;
  for (const auto* t : {&a, &b})
    for (const auto& e : t->entries()) layers = std::max(layers, e.key.layer + 1);
  return layers;
}

// B's rows of one position, read once, as the bounds and the decisions read them.
class TraceBoundSource final : public BoundSource {
 public:
  explicit TraceBoundSource(const TraceReader& b) : b_(b) {}
  void at_position(int position) {
    if (position == position_) return;
    position_ = position;
    outputs_.clear();
    magnitudes_.clear();
  }
  const StageData& output(Stage s, int layer) override {
    auto it = outputs_.find({s, layer});
    if (it != outputs_.end()) return it->second;
    const std::string path = trace_dataset_path(position_, layer, s);
    if (!b_.has(path)) throw MissingBoundInput{{s, layer}, Series::output};
    return outputs_.emplace(std::pair{s, layer}, b_.read(path)).first->second;
  }
  const StageData* magnitude(Stage s, int layer) override {
    auto it = magnitudes_.find({s, layer});
    if (it != magnitudes_.end()) return &it->second;
    const std::string path = trace_dataset_path(position_, layer, s, Series::magnitude);
    if (!b_.has(path)) return nullptr;
    return &magnitudes_.emplace(std::pair{s, layer}, b_.read(path)).first->second;
  }

 private:
  const TraceReader& b_;
  int position_ = -1;
  std::map<std::pair<Stage, int>, StageData> outputs_, magnitudes_;
};

// The values a decision stage decides on: the router logits (topk_idx), the logits (sampled).
StageRef decided_on(Stage s, int layer) {
  return s == Stage::topk_idx ? StageRef{Stage::router, layer} : StageRef{Stage::logits, kModelLayer};
}

// Gap between the k-th and (k+1)-th largest of g.
std::optional<double> margin_of(const StageData& g, size_t k) {
  if (k == 0 || g.size() <= k) return std::nullopt;
  std::vector<double> v(g.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = g.at(i);
  std::partial_sort(v.begin(), v.begin() + std::ptrdiff_t(k + 1), v.end(), std::greater<>());
  return v[k - 1] - v[k];
}

// Decisions a (candidate) against b (reference), over the values g the reference decided on:
// a differing choice is explained when the reference's gap between the two choices is within
// allowance[a] + allowance[b].
DecisionDiff compare_decision(const StageData& a, const StageData& b, const StageData& g,
                              std::span<const double> allowance) {
  DecisionDiff d;
  d.margin = margin_of(g, b.size());
  std::vector<double> sa(a.size()), sb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    sa[i] = a.at(i);
    sb[i] = b.at(i);
    if (sa[i] == sb[i]) continue;
    ++d.slots;
    const double ca = sa[i], cb = sb[i];
    const bool valid = ca >= 0 && ca < double(g.size()) && cb >= 0 && cb < double(g.size());
    const double gap = valid ? std::fabs(g.at(size_t(ca)) - g.at(size_t(cb))) : kInf;
    const double allow = valid ? allowance[size_t(ca)] + allowance[size_t(cb)] : 0.0;
    if (!(gap <= allow)) d.explained = false;
    if (d.slots == 1 || gap - allow > d.gap - d.allowance) {
      d.gap = gap;
      d.allowance = allow;
    }
  }
  std::sort(sa.begin(), sa.end());
  std::sort(sb.begin(), sb.end());
  d.same_set = sa == sb;
  return d;
}

ValueComparison list_decisions(const StageData& a, const StageData& b, size_t max_listed) {
  ValueComparison v;
  v.elements = v.compared = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a.at(i), y = b.at(i);
    if (x != y) note_mismatch(v, {i, x, y, kNaN, kNaN, 0}, max_listed);
  }
  v.share = v.mismatches > 0 ? kInf : 0;
  return v;
}

// Candidate scores that mask with a finite value whose softmax weight underflows count as -inf.
void normalize_masked(StageData& cand, const StageData& ref) {
  if (ref.dims.size() != 2) return;
  const size_t cols = ref.dims[1];
  for (size_t r = 0; r < ref.dims[0]; ++r) {
    double m = -kInf;
    for (size_t j = 0; j < cols; ++j) {
      const double v = ref.at(r * cols + j);
      if (std::isfinite(v)) m = std::max(m, v);
    }
    for (size_t j = 0; j < cols; ++j) {
      const size_t i = r * cols + j;
      const double x = cand.at(i);
      if (ref.at(i) == -kInf && std::isfinite(x) && x < m - kMaskedGap) cand.set(i, -kInf);
    }
  }
}


}  // namespace

std::string_view status_name(DatasetStatus s) {
  switch (s) {
    case DatasetStatus::Pass: return "pass";
    case DatasetStatus::Fail: return "fail";
    case DatasetStatus::MissingInA: return "missing_in_a";
    case DatasetStatus::MissingInB: return "missing_in_b";
    case DatasetStatus::ShapeMismatch: return "shape_mismatch";
    case DatasetStatus::NotCaptured: return "not_captured";
    case DatasetStatus::Unjudged: return "unjudged";
  }
  return "unknown";
}

std::string_view judge_name(Judge j) { return j == Judge::local ? "local" : "accumulated"; }

Criterion Criterion::derived(BoundOptions options) {
  Criterion c;
  c.kind = Kind::derived;
  c.bound = options;
  return c;
}

Criterion Criterion::fixed(Tolerance t) {
  Criterion c;
  c.kind = Kind::fixed;
  c.tolerance = std::move(t);
  return c;
}

std::string Criterion::describe() const {
  if (kind == Kind::fixed) return tolerance.describe();
  std::string s = fmt::format("derived bounds (lambda {:g}", bound.lambda);
  if (bound.safety != 1) s += fmt::format(", safety x{:g}", bound.safety);
  return s + ")";
}

nlohmann::json Criterion::to_json() const {
  if (kind == Kind::fixed) {
    nlohmann::json j = tolerance.to_json();
    j["kind"] = "fixed";
    return j;
  }
  return {{"kind", "derived"},
          {"lambda", bound.lambda},
          {"angle_ulps", bound.angle_ulps},
          {"safety", bound.safety}};
}

uint64_t ulp_distance(float x, float y) {
  const int64_t d = ordered_bits(x) - ordered_bits(y);
  return uint64_t(d < 0 ? -d : d);
}

ValueComparison compare_values(const StageData& a, const StageData& b,
                               std::span<const double> bound, size_t max_listed,
                               std::span<const uint8_t> include) {
  if (a.size() != b.size() || bound.size() != b.size())
    fail("compare_values: {} values against {} with {} bounds (the caller must pair equal shapes)",
         a.size(), b.size(), bound.size());
  ValueComparison v;
  v.elements = a.size();
  double dot = 0, norm_a = 0, norm_b = 0, err2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!include.empty() && include[i] == 0) continue;
    ++v.compared;
    const double x = a.at(i), y = b.at(i), bnd = bound[i];
    v.max_bound = std::max(v.max_bound, bnd);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (x == y) continue;  // equal infinities, e.g. masked -inf scores on both sides
      ++v.nonfinite_mismatches;
      if (v.share != kInf) {
        v.share_index = i;
        v.worst = ElementMismatch{i, x, y, std::fabs(x - y), kNaN, bnd};
      }
      v.share = kInf;
      note_mismatch(v, {i, x, y, std::fabs(x - y), kNaN, bnd}, max_listed);
      continue;
    }
    const double diff = std::fabs(x - y);
    const double rel = y != 0 ? diff / std::fabs(y) : (diff == 0 ? 0 : kInf);
    if (diff > v.max_abs_err) {
      v.max_abs_err = diff;
      v.max_abs_index = i;
    }
    if (rel > v.max_rel_err) {
      v.max_rel_err = rel;
      v.max_rel_index = i;
    }
    // A bound that is not a number holds nothing: the element fails (never a silent pass).
    const double share = std::isnan(bnd) ? kInf : bnd > 0 ? diff / bnd : (diff == 0 ? 0 : kInf);
    if (share > v.share) {
      v.share = share;
      v.share_index = i;
      v.worst = ElementMismatch{i, x, y, diff, rel, bnd};
    }
    const float fx = float(x), fy = float(y);
    if (std::isfinite(fx) && std::isfinite(fy)) v.max_ulp = std::max(v.max_ulp, ulp_distance(fx, fy));
    dot += x * y;
    norm_a += x * x;
    norm_b += y * y;
    err2 += (x - y) * (x - y);
    if (!(diff <= bnd)) note_mismatch(v, {i, x, y, diff, rel, bnd}, max_listed);
  }
  if (norm_a == 0 && norm_b == 0)
    v.cosine = 1;
  else if (norm_a == 0 || norm_b == 0)
    v.cosine = 0;
  else
    v.cosine = dot / (std::sqrt(norm_a) * std::sqrt(norm_b));
  v.nmse = norm_b > 0 ? err2 / norm_b : (err2 == 0 ? 0 : kInf);
  return v;
}

namespace {
double side_severity(const SideDiff& s, bool decision) {
  if (decision) {
    if (!s.decision || s.decision->slots == 0) return 0;
    return s.decision->explained ? 0.5 : kInf;
  }
  return s.share();
}
}  // namespace

double DatasetDiff::severity() const {
  if (status == DatasetStatus::NotCaptured || status == DatasetStatus::Unjudged) return 0;
  if (status == DatasetStatus::MissingInA || status == DatasetStatus::MissingInB ||
      status == DatasetStatus::ShapeMismatch)
    return kInf;
  const SideDiff* s = judged_side();
  return s == nullptr ? kInf : side_severity(*s, is_decision());
}

double DatasetDiff::accumulated_severity() const {
  if (status == DatasetStatus::NotCaptured || status == DatasetStatus::Unjudged) return 0;
  if (!accumulated) return kInf;
  return side_severity(*accumulated, is_decision());
}

size_t DiffResult::failed_datasets() const {
  return size_t(std::count_if(datasets.begin(), datasets.end(),
                              [](const DatasetDiff& d) { return d.failed(); }));
}

std::string DiffResult::not_captured_stages() const {
  std::map<Stage, std::pair<size_t, size_t>> by_stage;  // not captured, all
  for (const auto& d : datasets) {
    auto& [missing, all] = by_stage[d.key.stage];
    ++all;
    missing += d.status == DatasetStatus::NotCaptured;
  }
  std::vector<std::string> parts;
  for (const auto& [stage, counts] : by_stage)
    if (counts.first > 0)
      parts.push_back(fmt::format("{} ({} of {})", name(stage), counts.first, counts.second));
  return fmt::format("{}", fmt::join(parts, ", "));
}

namespace {
// "/pos_3/" -> "/pos_3"; a path is the object itself or anything under it.
bool under(const std::string& path, std::string_view object) {
  while (object.size() > 1 && object.back() == '/') object.remove_suffix(1);
  if (object == "/") return true;
  return path.size() >= object.size() && path.compare(0, object.size(), object) == 0 &&
         (path.size() == object.size() || path[object.size()] == '/');
}
}  // namespace

bool DiffSelection::empty() const {
  return stages.empty() && layers.empty() && positions.empty() && paths.empty() && excluded.empty();
}

bool DiffSelection::selects(const std::string& path, const StageKey& key) const {
  if (!stages.empty() && !stages.contains(key.stage)) return false;
  if (!layers.empty() && !layers.contains(key.layer)) return false;
  if (!positions.empty() && !positions.contains(key.position)) return false;
  if (!paths.empty() && std::none_of(paths.begin(), paths.end(), [&](const std::string& p) { return under(path, p); }))
    return false;
  return std::none_of(excluded.begin(), excluded.end(), [&](const std::string& p) { return under(path, p); });
}

std::string DiffSelection::describe() const {
  std::vector<std::string> parts;
  if (!stages.empty()) {
    std::vector<std::string> names;
    for (Stage s : stages) names.emplace_back(info(s).name);
    parts.push_back("stage " + fmt::format("{}", fmt::join(names, ", ")));
  }
  const auto numbers = [](const std::set<int>& v) { return fmt::format("{}", fmt::join(v, ", ")); };
  if (!layers.empty()) parts.push_back("layer " + numbers(layers));
  if (!positions.empty()) parts.push_back("position " + numbers(positions));
  if (!paths.empty()) parts.push_back(fmt::format("{}", fmt::join(paths, ", ")));
  if (!excluded.empty()) parts.push_back(fmt::format("excluding {}", fmt::join(excluded, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

bool is_capture(const TraceMeta& meta) {
  return meta.run.is_object() && meta.run.contains("capture");
}

std::string_view local_source_name(LocalSource s) {
  switch (s) {
    case LocalSource::none: return "none";
    case LocalSource::replay: return "replay";
    case LocalSource::recompute: return "recompute";
  }
  return "none";
}

double ScaleCheck::share() const {
  const double e = std::fabs(estimate);
  return bound > 0 ? e / bound : (e == 0 ? 0 : kInf);
}

double SideDiff::share() const {
  return scale ? std::max(values.share, scale->share()) : values.share;
}

namespace {

// The datasets of both traces, paired by path (each keyed as the side that has it; the
// reference when both do), selected and sorted in execution order.
std::vector<DatasetDiff> pair_datasets(const TraceReader& a, const TraceReader& b,
                                       const DiffOptions& options, DiffResult& result) {
  std::vector<DatasetDiff> out;
  for (const auto& e : b.entries()) {
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    out.push_back(std::move(d));
  }
  for (const auto& e : a.entries()) {
    if (b.has(e.path)) continue;
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    // A reference that skipped the prefix has only the recomputed rows (no output of its own):
    // its datasets are judged by their local error alone, or not at all (DatasetJudge).
    const bool prefix_skipped = b.entries().empty() && b.has_series(Series::recompute);
    if (!prefix_skipped) {
      d.status = DatasetStatus::MissingInB;
      d.missing_path = e.path;
    }
    out.push_back(std::move(d));
  }
  if (!options.selection.empty()) {
    const auto kept = std::remove_if(out.begin(), out.end(), [&](const DatasetDiff& d) {
      return !options.selection.selects(d.path, d.key);
    });
    result.not_selected = size_t(out.end() - kept);
    out.erase(kept, out.end());
    result.selection = options.selection.describe();
    if (out.empty())
      fail("{} and {}: the selection ({}) matches none of the traces' datasets", a.path(),
           b.path(), result.selection);
  }
  std::sort(out.begin(), out.end(), [](const DatasetDiff& x, const DatasetDiff& y) {
    return std::tie(x.key.position, x.key.order, x.path) <
           std::tie(y.key.position, y.key.order, y.path);
  });
  return out;
}

// The rows a recomputed stage's bound is derived from, at one position: the judged stage's own
// output, magnitude and bias are B's recomputed ones; every other stage is an input, and its
// values are A's own (what the reference recomputed from).
class RecomputeBoundSource final : public BoundSource {
 public:
  RecomputeBoundSource(const TraceReader& a, const TraceReader& b) : a_(a), b_(b) {}
  void at(int position, Stage judged) {
    judged_ = judged;
    if (position == position_) return;
    position_ = position;
    rows_.clear();
  }
  const StageData& output(Stage s, int layer) override {
    const bool own = s == judged_;
    const StageData* d = row(own ? b_ : a_, s, layer, own ? Series::recompute : Series::output);
    if (d == nullptr) throw MissingBoundInput{{s, layer}, own ? Series::recompute : Series::output};
    return *d;
  }
  const StageData* magnitude(Stage s, int layer) override {
    return row(b_, s, layer, Series::recompute_magnitude);
  }
  const StageData* bias(Stage s, int layer) override {
    return row(b_, s, layer, Series::recompute_bias);
  }
  // A's own rows are the inputs here: a tensor-parallel group's partial sums where it traced them.
  std::vector<const StageData*> partials(Stage s, int layer) override {
    std::vector<const StageData*> out;
    for (int r = 0; r < a_.partial_ranks(); ++r) {
      const std::string path = trace_partial_path(r, position_, layer, s);
      if (!a_.has(path)) return {};
      auto it = rows_.find(path);
      if (it == rows_.end()) it = rows_.emplace(path, a_.read(path)).first;
      out.push_back(&it->second);
    }
    return out;
  }

 private:
  const StageData* row(const TraceReader& t, Stage s, int layer, Series series) {
    const std::string path = trace_dataset_path(position_, layer, s, series);
    auto it = rows_.find(path);
    if (it != rows_.end()) return &it->second;
    if (!t.has(path)) return nullptr;
    return &rows_.emplace(path, t.read(path)).first->second;
  }
  const TraceReader &a_, &b_;
  int position_ = -1;
  Stage judged_ = Stage::embedding;
  std::map<std::string, StageData> rows_;  // paths are unique across A's and B's series used
};

// An att row recorded without its sink column (NO_SINK) holds 1 - the keys' sum there: its
// error is the keys' errors summed, and its bound their bounds'.
void widen_derived_sink(std::vector<double>& bound, const std::vector<size_t>& dims) {
  if (dims.size() != 2 || dims[1] == 0) return;
  const size_t cols = dims[1];
  for (size_t h = 0; h < dims[0]; ++h) {
    double keys = 0;
    for (size_t j = 0; j + 1 < cols; ++j) keys += bound[h * cols + j];
    bound[h * cols + cols - 1] += keys;
  }
}

// The row scale of a norm's local error (tracer/bounds.h): delta = sum e_i y_i / sum y_i^2
// against shared + lambda sqrt(sum y_i^2 b_i^2 / 3) / sum y_i^2. One row scale per norm row
// (about 10^4 rows in a 20b trace of 200 positions) is held at 1.5 lambda standard deviations
// (6 with the default lambda: a sum of bounded independent roundings passes that about once in
// 10^9 rows), where a sum's bound per element uses lambda.
constexpr double kRowScaleLambda = 1.5;
std::optional<ScaleCheck> row_scale(const StageData& cand, const StageData& ref,
                                    const RowScaleBound& rb, double lambda) {
  double ey = 0, yy = 0, var = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double y = ref.at(i), e = cand.at(i) - y;
    if (!std::isfinite(y) || !std::isfinite(e)) return std::nullopt;  // the elements fail
    ey += e * y;
    yy += y * y;
    var += y * y * rb.element[i] * rb.element[i] / 3;
  }
  if (yy == 0) return std::nullopt;
  return ScaleCheck{ey / yy, rb.shared + lambda * std::sqrt(var) / yy};
}

// Judges one dataset's local and accumulated errors (the per-dataset job of diff_traces).
class DatasetJudge {
 public:
  DatasetJudge(const TraceReader& a, const TraceReader& b, const Config& config,
               const DiffResult& result, const DiffOptions& options)
      : a_(a), b_(b), config_(config), r_(result), o_(options), source_(b),
        recompute_source_(a, b), rows_(a) {
    if (r_.local_source == LocalSource::recompute) {
      int first = INT_MAX, last = 0;
      for (const auto& e : a.entries()) {
        first = std::min(first, e.key.position);
        last = std::max(last, e.key.position);
      }
      // Where the reference skipped the prefix, A's cache before its first position was handed
      // over whole (it is not among A's rows).
      coverage_.emplace(rows_, config_, last, r_.accumulated_unavailable ? first : 0);
    }
  }

  void judge(DatasetDiff& d) {
    d.judged = r_.judged;
    d.amplification = kNaN;
    if (d.status == DatasetStatus::MissingInB) return;
    const StageKey& k = d.key;
    source_.at_position(k.position);
    recompute_source_.at(k.position, k.stage);
    if (is_per_expert(k.stage) && b_.has(trace_dataset_path(k.position, k.layer, Stage::topk_idx))) {
      const StageData& idx = source_.output(Stage::topk_idx, k.layer);
      for (size_t i = 0; i < idx.size(); ++i) d.slot_experts.push_back(int32_t(idx.at(i)));
    }
    if (!a_.has(d.path) && r_.capture) {
      d.status = DatasetStatus::NotCaptured;
      return;
    }
    const std::string replay_path = trace_dataset_path(k.position, k.layer, k.stage, Series::replay);
    const std::string recompute_path =
        trace_dataset_path(k.position, k.layer, k.stage, Series::recompute);
    // Recomputed rows judge the local error under recompute, and, under replay, the stages the
    // candidate could not replay (Backend::replays: the reference recomputed those instead).
    const bool recomputed = r_.local_source != LocalSource::none && b_.has(recompute_path);
    if (r_.local_source == LocalSource::recompute && !recomputed && d.judged == Judge::local) {
      d.judged = Judge::accumulated;
      const auto lacking = coverage_->missing(k.position, k.layer, k.stage);
      d.local_unavailable = lacking ? lacking->describe() + " not captured"
                                    : "the reference trace has no recompute of it";
      d.fallback_tolerance = r_.fallback.has_value();
    }
    const bool has_out = a_.has(d.path),
               has_replay = r_.local_source == LocalSource::replay && a_.has(replay_path);
    if (!has_out || (d.judged == Judge::local && r_.local_source == LocalSource::replay &&
                     !has_replay && !recomputed)) {
      d.status = DatasetStatus::MissingInA;
      d.missing_path = has_out ? replay_path : d.path;
      return;
    }
    if (!recomputed && !b_.has(d.path)) {  // no local error, and B has no rows of its own
      d.status = r_.accumulated_unavailable ? DatasetStatus::Unjudged : DatasetStatus::MissingInB;
      if (d.status == DatasetStatus::MissingInB) d.missing_path = d.path;
      return;
    }
    Rows rows;
    if (b_.has(d.path)) rows.b = b_.read(d.path);
    rows.a = a_.read(d.path);
    d.dims_a = rows.a.dims;
    if (has_replay) rows.local_a = a_.read(replay_path);
    if (recomputed) {
      d.recomputed = true;
      rows.local_a = rows.a;
      rows.local_b = b_.read(recompute_path);
    }
    d.dims_b = rows.local_ref().dims;
    if (rows.a.dims != d.dims_b || (rows.local_a && rows.local_a->dims != d.dims_b) ||
        (rows.b && rows.b->dims != d.dims_b)) {
      d.status = DatasetStatus::ShapeMismatch;
      return;
    }
    if (k.stage == Stage::scores) {
      if (rows.local_a) normalize_masked(*rows.local_a, rows.local_ref());
      if (rows.b) normalize_masked(rows.a, *rows.b);
    }
    if (d.is_decision())
      judge_decision(d, rows);
    else
      judge_values(d, rows);
    const SideDiff* judged = d.judged_side();
    if (judged == nullptr) {  // judged by an accumulated error B has no rows for
      d.status = r_.accumulated_unavailable ? DatasetStatus::Unjudged : DatasetStatus::MissingInB;
      if (d.status == DatasetStatus::MissingInB) d.missing_path = d.path;
      return;
    }
    d.status = judged->failed ? DatasetStatus::Fail : DatasetStatus::Pass;
    attribute_rank(d, has_replay && !recomputed ? replay_path : d.path);
  }

 private:
  struct Rows {
    StageData a;                       // A's output
    std::optional<StageData> b;        // B's output (none where B skipped the prefix)
    std::optional<StageData> local_a;  // A's local result: its replay, or its output (recompute)
    std::optional<StageData> local_b;  // what it is held to under recompute: B's recompute
    const StageData& local_ref() const { return local_b ? *local_b : *b; }
  };

  // A row of a tensor-parallel group (A's "shards" attributes): what the gathering of its ranks'
  // rows found fails the dataset, naming the rank (a replicated stage whose copies differ, an
  // all-reduce that is not the sum of the partial sums); a failing element of a split stage is
  // blamed on the rank that computed it.
  void attribute_rank(DatasetDiff& d, const std::string& judged_path) const {
    for (const std::string& path : {judged_path, d.path}) {
      const std::optional<RowShards> sh = a_.shards(path);
      if (!sh || sh->problem.empty()) continue;
      d.status = DatasetStatus::Fail;
      d.ranks = sh->ranks;
      d.rank = sh->problem_rank;
      d.rank_note = sh->problem;
      return;
    }
    const std::optional<RowShards> sh = a_.shards(judged_path);
    if (!sh || d.status != DatasetStatus::Fail) return;
    d.ranks = sh->ranks;
    const SideDiff* side = d.judged_side();
    const std::optional<ElementMismatch>& e =
        side->values.worst ? side->values.worst : side->values.first_mismatch;
    if (sh->kind != "ranges" || !e) return;
    d.rank = sh->rank_of(int64_t(e->index));
    if (d.rank >= 0)
      d.rank_note = fmt::format("element {} is of rank {}'s part of the row", e->index, d.rank);
  }

  bool derived() const { return r_.criterion.kind == Criterion::Kind::derived; }
  BoundOptions bound_options(bool recompute) const {
    BoundOptions o = r_.criterion.bound;
    o.own_inputs = recompute;
    return o;
  }
  BoundSource& bound_source(bool recompute) {
    return recompute ? static_cast<BoundSource&>(recompute_source_) : source_;
  }

  // A fixed atol + rtol |ref| per element.
  static std::vector<double> fixed_bound(const Tolerance& t, Stage s, const StageData& ref) {
    const AbsRel tol = t.for_stage(s);
    std::vector<double> b(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) b[i] = tol.atol + tol.rtol * std::fabs(ref.at(i));
    return b;
  }

  std::vector<double> bound_for(const DatasetDiff& d, const StageData& ref, bool recompute,
                                bool fallback) {
    const StageKey& k = d.key;
    std::vector<double> bound;
    if (fallback)
      bound = fixed_bound(*r_.fallback, k.stage, ref);
    else if (derived())
      bound = derive_bound(config_, k.stage, k.layer, k.position, bound_source(recompute),
                           r_.policy, bound_options(recompute));
    else
      bound = fixed_bound(r_.criterion.tolerance, k.stage, ref);
    if (bound.size() != ref.size())
      fail("{}: {}: the bound has {} values for {} elements", b_.path(), d.path, bound.size(),
           ref.size());
    if (k.stage == Stage::att && a_.layout(d.path).find("NO_SINK") != std::string::npos)
      widen_derived_sink(bound, ref.dims);
    return bound;
  }

  void judge_values(DatasetDiff& d, Rows& rows) {
    const StageKey& k = d.key;
    const bool recompute = rows.local_b.has_value();
    if (rows.local_a) {
      const std::vector<double> bound = bound_for(d, rows.local_ref(), recompute, false);
      SideDiff s;
      s.values = compare_values(*rows.local_a, rows.local_ref(), bound, o_.max_listed);
      if (derived())
        if (auto rb = row_scale_bound(config_, k.stage, k.layer, bound_source(recompute),
                                      r_.policy, bound_options(recompute)))
          s.scale = row_scale(*rows.local_a, rows.local_ref(), *rb,
                              kRowScaleLambda * r_.criterion.bound.lambda);
      s.failed = s.values.mismatches > 0 || (s.scale && s.scale->failed());
      d.local = s;
    }
    if (!rows.b) return;  // no accumulated error without the reference's own rows
    const StageData& b = *rows.b;
    // Rows of expert slots the free candidate routed elsewhere compare different experts.
    std::vector<uint8_t> include;
    if (is_per_expert(k.stage) && b.dims.size() == 2) {
      const std::string topk = trace_dataset_path(k.position, k.layer, Stage::topk_idx);
      if (a_.has(topk) && b_.has(topk)) {
        const StageData ia = a_.read(topk);
        const StageData& ib = source_.output(Stage::topk_idx, k.layer);
        include.assign(b.size(), 1);
        const size_t cols = b.dims[1];
        for (size_t slot = 0; slot < b.dims[0] && slot < ia.size() && slot < ib.size(); ++slot)
          if (ia.at(slot) != ib.at(slot)) {
            ++d.rerouted_slots;
            std::fill_n(include.begin() + std::ptrdiff_t(slot * cols), cols, uint8_t(0));
          }
        if (d.rerouted_slots == 0) include.clear();
      }
    }
    SideDiff s;
    const std::vector<double> bound = bound_for(d, b, false, d.fallback_tolerance);
    s.values = compare_values(rows.a, b, bound, o_.max_listed, include);
    s.failed = s.values.mismatches > 0;
    d.accumulated = s;
    if (d.local) {
      const double l = d.local->values.max_abs_err, acc = d.accumulated->values.max_abs_err;
      d.amplification = l > 0 ? acc / l : (acc > 0 ? kInf : kNaN);
    }
  }

  void judge_decision(DatasetDiff& d, Rows& rows) {
    const StageKey& k = d.key;
    const StageRef on = decided_on(k.stage, k.layer);
    auto differs = [](const StageData& x, const StageData& y) {
      for (size_t i = 0; i < x.size(); ++i)
        if (x.at(i) != y.at(i)) return true;
      return false;
    };
    if (rows.local_a) {
      // The values decided on: the reference's (replay), or A's own (recompute: B's decision is
      // the top-k or argmax of A's values).
      const bool recompute = rows.local_b.has_value();
      const StageData& ref = rows.local_ref();
      const bool flip = differs(*rows.local_a, ref);
      StageData none;
      const StageData* g = &none;
      std::vector<double> allowance;
      if (recompute) {
        if (flip) g = &recompute_source_.output(on.stage, on.layer);
      } else if (flip || b_.has(trace_dataset_path(k.position, on.layer, on.stage))) {
        if (!b_.has(trace_dataset_path(k.position, on.layer, on.stage)))
          throw MissingBoundInput{on, Series::output};
        g = &source_.output(on.stage, on.layer);
      }
      allowance.assign(g->size(), 0.0);
      if (flip) allowance = decision_allowance(d, *g, recompute);
      SideDiff s;
      s.values = list_decisions(*rows.local_a, ref, o_.max_listed);
      s.decision = compare_decision(*rows.local_a, ref, *g, allowance);
      s.failed = s.decision->slots > 0 && !s.decision->explained;
      d.local = s;
    }
    // The accumulated decision is explained by the candidate's own error of the values it
    // decided on, as measured.
    if (!rows.b) return;
    const bool flip = differs(rows.a, *rows.b);
    const bool have_g = b_.has(trace_dataset_path(k.position, on.layer, on.stage));
    if (flip && !have_g) throw MissingBoundInput{on, Series::output};
    StageData none;
    const StageData& g = have_g ? source_.output(on.stage, on.layer) : none;
    std::vector<double> measured(g.size(), 0.0);
    const std::string on_path = trace_dataset_path(k.position, on.layer, on.stage);
    if (flip && a_.has(on_path)) {
      const StageData ga = a_.read(on_path);
      if (ga.size() == g.size())
        for (size_t i = 0; i < g.size(); ++i) {
          const double e = std::fabs(ga.at(i) - g.at(i));
          measured[i] = std::isfinite(e) ? e : 0.0;
        }
    }
    SideDiff s;
    s.values = list_decisions(rows.a, *rows.b, o_.max_listed);
    s.decision = compare_decision(rows.a, *rows.b, g, measured);
    s.failed = s.decision->slots > 0 && !s.decision->explained;
    d.accumulated = s;
  }

  // What a local decision's flip may be explained by: the bound of the values decided on.
  std::vector<double> decision_allowance(const DatasetDiff& d, const StageData& g, bool recompute) {
    const StageKey& k = d.key;
    const StageRef on = decided_on(k.stage, k.layer);
    if (!derived()) return fixed_bound(r_.criterion.tolerance, on.stage, g);
    try {
      return derive_bound(config_, k.stage, k.layer, k.position, bound_source(recompute),
                          r_.policy, bound_options(recompute));
    } catch (const MissingBoundInput&) {
      if (!recompute) throw;
      // A's values decided on, without what bounds their sums (their own inputs not captured):
      // their storage rounding is what a decision on them may differ by.
      std::vector<double> a(g.size());
      const StagePrecision& p = r_.policy.at(on.stage);
      for (size_t i = 0; i < g.size(); ++i) a[i] = p.storage * std::fabs(g.at(i)) + p.min_normal;
      return a;
    }
  }

  const TraceReader &a_, &b_;
  const Config& config_;
  const DiffResult& r_;
  const DiffOptions& o_;
  TraceBoundSource source_;
  RecomputeBoundSource recompute_source_;
  TraceCandidateRows rows_;
  std::optional<RecomputeCoverage> coverage_;
};

// The first failing dataset in execution order: the culprit.
std::optional<FirstDivergence> first_divergence(const DiffResult& result, const TraceReader& a,
                                                const TraceReader& b) {
  for (const DatasetDiff& d : result.datasets) {
    if (!d.failed()) continue;
    FirstDivergence f;
    f.path = d.path;
    f.position = d.key.position;
    f.layer = d.key.layer;
    f.stage = d.key.stage;
    f.status = d.status;
    f.judged = d.judged;
    f.amplification = d.amplification;
    f.ranks = d.ranks;
    f.rank = d.rank;
    f.rank_note = d.rank_note;
    if (d.status == DatasetStatus::Fail) {
      const SideDiff& s = *d.judged_side();
      if (d.is_decision()) {
        f.element = s.values.first_mismatch;
        f.share = kInf;
      } else {
        f.share = s.share();
        f.element = s.values.worst ? s.values.worst : s.values.first_mismatch;
        if (s.scale && s.scale->failed()) f.scale = s.scale;
      }
      if (f.element && is_per_expert(d.key.stage) && d.dims_b.size() == 2 && d.dims_b[1] > 0) {
        const size_t slot = f.element->index / d.dims_b[1];
        if (slot < d.slot_experts.size()) f.expert = d.slot_experts[slot];
      }
      if (f.element && d.judged == Judge::local && d.accumulated && !d.is_decision()) {
        const StageData da = a.read(d.path), db = b.read(d.path);
        if (f.element->index < da.size())
          f.accumulated_abs_err = std::fabs(da.at(f.element->index) - db.at(f.element->index));
      }
    }
    return f;
  }
  return std::nullopt;
}

// What the recompute saw of the capture's values against the storage it declares (B's run
// attribute, written by parity-trace --candidate-trace), as warnings.
void precision_warnings(const TraceReader& a, const TraceReader& b, DiffResult& result) {
  const nlohmann::json& run = b.meta().run;
  if (!run.is_object() || !run.contains("recompute") || !run["recompute"].is_object()) return;
  const nlohmann::json& rc = run["recompute"];
  auto count = [&](const char* key) -> double {
    return rc.contains(key) && rc[key].is_number() ? rc[key].get<double>() : 0.0;
  };
  const double values = count("input_values"), outside = count("not_in_storage"),
               bf16 = count("bfloat16_values");
  const double storage = result.policy.coarsest_storage();
  const std::string declared = result.policy.name.empty() ? result.policy.describe() : result.policy.name;
  if (outside > 0) {
    std::string first = rc.contains("first_not_in_storage") && rc["first_not_in_storage"].is_string()
                            ? rc["first_not_in_storage"].get<std::string>()
                            : std::string();
    result.warnings.push_back(fmt::format(
        "{} is judged as {}, but {:.0f} of its {:.0f} input values are not numbers of the "
        "storage format that declares (the first in {}); the reference recomputed from them "
        "rounded to it: declare the precision the port stores in",
        a.path(), declared, outside, values, one_line(first, 80)));
  }
  if (values >= 64 && bf16 == values && storage < kUnitBfloat16)
    result.warnings.push_back(fmt::format(
        "{} is judged as {}, but every one of its {:.0f} input values is a bfloat16 number: the "
        "port seems to store bfloat16; declare it (bfloat16, vllm-like, transformers-bf16) so "
        "that the bounds fit what it does",
        a.path(), declared, values));
}

}  // namespace

DiffResult diff_traces(const TraceReader& a, const TraceReader& b, const Criterion& criterion,
                       const DiffOptions& options) {
  check_same_model(a, b, options.across_runs);
  const Config config = Config::from_json(b.meta().config, b.path() + " (config)");
  DiffResult result;
  result.a = {a.path(), a.meta().backend, a.meta().precision};
  result.b = {b.path(), b.meta().backend, b.meta().precision};
  result.criterion = criterion;
  result.num_layers = layers_in(a, b);
  result.a_has_replay = a.has_series(Series::replay);
  result.capture = options.capture || is_capture(a.meta());
  result.accumulated_unavailable = b.entries().empty() && b.has_series(Series::recompute);
  result.local_source = result.a_has_replay                    ? LocalSource::replay
                        : b.has_series(Series::recompute) ? LocalSource::recompute
                                                               : LocalSource::none;
  result.judged = criterion.judge.value_or(
      result.local_source == LocalSource::none ? Judge::accumulated : Judge::local);
  if (result.judged == Judge::local && result.local_source == LocalSource::none)
    fail("{}: the candidate trace has no replay datasets and {} recomputes none of its stages, "
         "so its local errors are unknown (trace with replay, recompute a capture with "
         "parity-trace --candidate-trace, or judge the accumulated error)",
         a.path(), b.path());
  result.policy = criterion.policy.value_or(
      a.meta().precision_policy.value_or(PrecisionPolicy::float32(4)));
  if (result.capture && criterion.kind == Criterion::Kind::derived)
    result.fallback =
        tolerance_profile(result.policy.coarsest_storage() >= kUnitFloat16 ? "bf16" : "fp32");
  if (result.local_source == LocalSource::recompute) precision_warnings(a, b, result);

  result.datasets = pair_datasets(a, b, options, result);
  DatasetJudge judge(a, b, config, result, options);
  for (DatasetDiff& d : result.datasets) {
    try {
      judge.judge(d);
    } catch (const MissingBoundInput& m) {
      // The bound or the decision of this dataset needs a reference row B lacks: an explicit
      // failure line, never a silent pass.
      d.status = DatasetStatus::MissingInB;
      d.missing_path = trace_dataset_path(d.key.position, m.ref.layer, m.ref.stage, m.series);
      d.local.reset();
      d.accumulated.reset();
    }
  }
  for (const DatasetDiff& d : result.datasets) {
    result.not_captured += d.status == DatasetStatus::NotCaptured;
    result.unjudged += d.status == DatasetStatus::Unjudged;
    if (d.status != DatasetStatus::Fail && d.status != DatasetStatus::Pass) continue;
    const SideDiff* s = d.judged_side();
    if (s != nullptr && s->decision && s->decision->drift()) ++result.drift_decisions;
    if (!result.first_drift_path && d.accumulated && d.accumulated->failed)
      result.first_drift_path = d.path;
  }
  result.first_divergence = first_divergence(result, a, b);
  return result;
}

}  // namespace parity
