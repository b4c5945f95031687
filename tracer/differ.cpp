// The differ: per-dataset local and accumulated errors between a candidate and a reference
// trace, judged against derived bounds or a fixed tolerance; decisions for topk_idx and
// sampled; the first divergence in execution order.
#include "tracer/differ.h"

#include <algorithm>
#include <bit>
#include <fmt/ranges.h>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "model/error.h"

namespace parity {
namespace {

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
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// Refuses to compare traces of different runs, models, checkpoints or token sequences.
void check_same_model(const TraceReader& a, const TraceReader& b) {
  const TraceMeta &ma = a.meta(), &mb = b.meta();
  // First: a run killed before it wrote its candidate leaves its new reference beside the
  // previous run's candidate, and those may well agree on everything below.
  if (!ma.run_id.empty() && !mb.run_id.empty() && ma.run_id != mb.run_id)
    fail("{} and {} come from different runs (run_id {} vs {}): one was left by an earlier or "
         "interrupted run; trace again",
         a.path(), b.path(), ma.run_id, mb.run_id);
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
    const double share = bnd > 0 ? diff / bnd : (diff == 0 ? 0 : kInf);
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
    if (diff > bnd) note_mismatch(v, {i, x, y, diff, rel, bnd}, max_listed);
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
  return s.values.share;
}
}  // namespace

double DatasetDiff::severity() const {
  if (status == DatasetStatus::NotCaptured) return 0;
  if (status == DatasetStatus::MissingInA || status == DatasetStatus::MissingInB ||
      status == DatasetStatus::ShapeMismatch)
    return kInf;
  const SideDiff* s = judged_side();
  return s == nullptr ? kInf : side_severity(*s, is_decision());
}

double DatasetDiff::accumulated_severity() const {
  if (status == DatasetStatus::NotCaptured) return 0;
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

DiffResult diff_traces(const TraceReader& a, const TraceReader& b, const Criterion& criterion,
                       const DiffOptions& options) {
  check_same_model(a, b);
  const Config config = Config::from_json(b.meta().config, b.path() + " (config)");
  DiffResult result;
  result.a = {a.path(), a.meta().backend, a.meta().precision};
  result.b = {b.path(), b.meta().backend, b.meta().precision};
  result.criterion = criterion;
  result.num_layers = layers_in(a, b);
  result.a_has_replay = a.has_series(Series::replay);
  result.capture = options.capture;
  result.judged = criterion.judge.value_or(result.a_has_replay ? Judge::local : Judge::accumulated);
  if (result.judged == Judge::local && !result.a_has_replay)
    fail("{}: the candidate trace has no replay datasets, so its local errors are unknown (trace "
         "with replay, or judge the accumulated error)",
         a.path());
  result.policy = criterion.policy.value_or(
      a.meta().precision_policy.value_or(PrecisionPolicy::float32(4)));
  const bool derived = criterion.kind == Criterion::Kind::derived;

  // Pair by path: the union of both sides' outputs, each keyed as the side that has it (the
  // reference when both do).
  for (const auto& e : b.entries()) {
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    result.datasets.push_back(std::move(d));
  }
  for (const auto& e : a.entries()) {
    if (b.has(e.path)) continue;
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    d.status = DatasetStatus::MissingInB;
    d.missing_path = e.path;
    result.datasets.push_back(std::move(d));
  }
  if (!options.selection.empty()) {
    const auto kept = std::remove_if(result.datasets.begin(), result.datasets.end(),
                                     [&](const DatasetDiff& d) { return !options.selection.selects(d.path, d.key); });
    result.not_selected = size_t(result.datasets.end() - kept);
    result.datasets.erase(kept, result.datasets.end());
    result.selection = options.selection.describe();
    if (result.datasets.empty())
      fail("{} and {}: the selection ({}) matches none of the traces' datasets", a.path(), b.path(),
           result.selection);
  }
  std::sort(result.datasets.begin(), result.datasets.end(),
            [](const DatasetDiff& x, const DatasetDiff& y) {
              return std::tie(x.key.position, x.key.order, x.path) <
                     std::tie(y.key.position, y.key.order, y.path);
            });

  TraceBoundSource source(b);
  auto diff_dataset = [&](DatasetDiff& d) {
    d.judged = result.judged;
    d.amplification = kNaN;
    if (d.status == DatasetStatus::MissingInB) return;
    const StageKey& k = d.key;
    const Stage stage = k.stage;
    source.at_position(k.position);
    const std::string replay_path = trace_dataset_path(k.position, k.layer, stage, Series::replay);
    const bool has_out = a.has(d.path), has_replay = a.has(replay_path);
    if (is_per_expert(stage)) {
      const std::string topk = trace_dataset_path(k.position, k.layer, Stage::topk_idx);
      if (b.has(topk)) {
        const StageData& idx = source.output(Stage::topk_idx, k.layer);
        for (size_t i = 0; i < idx.size(); ++i) d.slot_experts.push_back(int32_t(idx.at(i)));
      }
    }
    if (!has_out && options.capture) {
      d.status = DatasetStatus::NotCaptured;
      return;
    }
    if (!has_out || (d.judged == Judge::local && !has_replay)) {
      d.status = DatasetStatus::MissingInA;
      d.missing_path = has_out ? replay_path : d.path;
      return;
    }
    const StageData db = b.read(d.path);
    d.dims_b = db.dims;
    std::optional<StageData> dl, da;
    if (has_replay) dl = a.read(replay_path);
    da = a.read(d.path);
    d.dims_a = (dl ? dl : da)->dims;
    if (da->dims != db.dims || (dl && dl->dims != db.dims)) {
      d.status = DatasetStatus::ShapeMismatch;
      if (da->dims != db.dims) d.dims_a = da->dims;
      return;
    }
    if (stage == Stage::scores) {
      if (dl) normalize_masked(*dl, db);
      normalize_masked(*da, db);
    }

    if (d.is_decision()) {
      // The values decided on are needed only to judge a flip (and to report the margin).
      const StageRef on = decided_on(stage, k.layer);
      auto differs = [&](const StageData& x) {
        for (size_t i = 0; i < x.size(); ++i)
          if (x.at(i) != db.at(i)) return true;
        return false;
      };
      const bool flip = differs(*da) || (dl && differs(*dl));
      const bool have_g = b.has(trace_dataset_path(k.position, on.layer, on.stage));
      if (flip && !have_g) throw MissingBoundInput{on, Series::output};
      StageData none;
      const StageData& g = have_g ? source.output(on.stage, on.layer) : none;
      std::vector<double> allowance(g.size(), 0.0);
      if (flip && derived) {
        allowance = derive_bound(config, stage, k.layer, k.position, source, result.policy,
                                 criterion.bound);
      } else if (flip) {
        const AbsRel t = criterion.tolerance.for_stage(on.stage);
        for (size_t i = 0; i < g.size(); ++i) allowance[i] = t.atol + t.rtol * std::fabs(g.at(i));
      }
      if (dl) {
        SideDiff s;
        s.values = list_decisions(*dl, db, options.max_listed);
        s.decision = compare_decision(*dl, db, g, allowance);
        s.failed = s.decision->slots > 0 && !s.decision->explained;
        d.local = s;
      }
      {
        // The accumulated decision is explained by the candidate's own error of the values it
        // decided on, as measured.
        std::vector<double> measured(g.size(), 0.0);
        const std::string on_path = trace_dataset_path(k.position, on.layer, on.stage);
        if (flip && a.has(on_path)) {
          const StageData ga = a.read(on_path);
          if (ga.size() == g.size())
            for (size_t i = 0; i < g.size(); ++i) {
              const double e = std::fabs(ga.at(i) - g.at(i));
              measured[i] = std::isfinite(e) ? e : 0.0;
            }
        }
        SideDiff s;
        s.values = list_decisions(*da, db, options.max_listed);
        s.decision = compare_decision(*da, db, g, measured);
        s.failed = s.decision->slots > 0 && !s.decision->explained;
        d.accumulated = s;
      }
    } else {
      std::vector<double> bound;
      if (derived) {
        bound = derive_bound(config, stage, k.layer, k.position, source, result.policy,
                             criterion.bound);
      } else {
        const AbsRel t = criterion.tolerance.for_stage(stage);
        bound.resize(db.size());
        for (size_t i = 0; i < db.size(); ++i) bound[i] = t.atol + t.rtol * std::fabs(db.at(i));
      }
      if (bound.size() != db.size())
        fail("{}: {}: the bound has {} values for {} elements", b.path(), d.path, bound.size(),
             db.size());
      if (dl) {
        SideDiff s;
        s.values = compare_values(*dl, db, bound, options.max_listed);
        s.failed = s.values.mismatches > 0;
        d.local = s;
      }
      // Rows of expert slots the free candidate routed elsewhere compare different experts.
      std::vector<uint8_t> include;
      if (is_per_expert(stage) && db.dims.size() == 2) {
        const std::string topk = trace_dataset_path(k.position, k.layer, Stage::topk_idx);
        if (a.has(topk) && b.has(topk)) {
          const StageData ia = a.read(topk);
          const StageData& ib = source.output(Stage::topk_idx, k.layer);
          include.assign(db.size(), 1);
          const size_t cols = db.dims[1];
          for (size_t slot = 0; slot < db.dims[0] && slot < ia.size() && slot < ib.size(); ++slot)
            if (ia.at(slot) != ib.at(slot)) {
              ++d.rerouted_slots;
              std::fill_n(include.begin() + std::ptrdiff_t(slot * cols), cols, uint8_t(0));
            }
          if (d.rerouted_slots == 0) include.clear();
        }
      }
      SideDiff s;
      s.values = compare_values(*da, db, bound, options.max_listed, include);
      s.failed = s.values.mismatches > 0;
      d.accumulated = s;
      if (d.local) {
        const double l = d.local->values.max_abs_err, acc = d.accumulated->values.max_abs_err;
        d.amplification = l > 0 ? acc / l : (acc > 0 ? kInf : kNaN);
      }
    }
    const SideDiff* judged = d.judged_side();
    d.status = judged->failed ? DatasetStatus::Fail : DatasetStatus::Pass;
    if (judged->decision && judged->decision->drift()) ++result.drift_decisions;
    };
  for (DatasetDiff& d : result.datasets) {
    try {
      diff_dataset(d);
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
    if (!result.first_drift_path && d.accumulated && d.accumulated->failed)
      result.first_drift_path = d.path;
    if (result.first_divergence || !d.failed()) continue;
    FirstDivergence f;
    f.path = d.path;
    f.position = d.key.position;
    f.layer = d.key.layer;
    f.stage = d.key.stage;
    f.status = d.status;
    f.judged = d.judged;
    f.amplification = d.amplification;
    if (d.status == DatasetStatus::Fail) {
      const SideDiff& s = *d.judged_side();
      if (d.is_decision()) {
        f.element = s.values.first_mismatch;
        f.share = kInf;
      } else {
        f.share = s.values.share;
        f.element = s.values.worst ? s.values.worst : s.values.first_mismatch;
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
    result.first_divergence = f;
  }
  return result;
}

}  // namespace parity
