// The differ: per-dataset error metrics between a candidate and a reference trace, routing
// decisions for topk_idx, and the first divergence in execution order.
#include "tracer/differ.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "model/error.h"

namespace parity {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

// topk_idx: slots compared as decisions; metrics are mismatch counts only.
ValueComparison compare_decisions(const StageData& a, const StageData& b, size_t max_listed) {
  ValueComparison v;
  v.elements = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a.at(i), y = b.at(i);
    if (x != y) note_mismatch(v, {i, x, y, kNaN, kNaN}, max_listed);
  }
  return v;
}

std::vector<double> as_doubles(const StageData& d) {
  std::vector<double> v(d.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = d.at(i);
  return v;
}

// Gap between the k-th and (k+1)-th largest reference router logits at (position, layer).
std::optional<double> routing_margin(const TraceReader& b, int position, int layer, size_t k) {
  const std::string path = trace_dataset_path(position, layer, Stage::router);
  if (k == 0 || !b.has(path)) return std::nullopt;
  std::vector<double> logits = as_doubles(b.read(path));
  if (logits.size() <= k) return std::nullopt;
  std::partial_sort(logits.begin(), logits.begin() + std::ptrdiff_t(k + 1), logits.end(),
                    std::greater<>());
  return logits[k - 1] - logits[k];
}

std::string json_value_text(const nlohmann::json& j) {
  return j.is_null() ? "(absent)" : j.dump();
}

// Refuses to compare traces of different models, checkpoints or token sequences.
void check_same_model(const TraceReader& a, const TraceReader& b) {
  const TraceMeta &ma = a.meta(), &mb = b.meta();
  if (ma.config != mb.config) {
    std::string what = "config differs";
    if (ma.config.is_object() && mb.config.is_object()) {
      std::set<std::string> keys;
      for (const auto& [k, v] : ma.config.items()) keys.insert(k);
      for (const auto& [k, v] : mb.config.items()) keys.insert(k);
      for (const auto& k : keys) {
        const auto va = ma.config.contains(k) ? ma.config[k] : nlohmann::json();
        const auto vb = mb.config.contains(k) ? mb.config[k] : nlohmann::json();
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

}  // namespace

std::string_view status_name(DatasetStatus s) {
  switch (s) {
    case DatasetStatus::Pass: return "pass";
    case DatasetStatus::Fail: return "fail";
    case DatasetStatus::MissingInA: return "missing_in_a";
    case DatasetStatus::MissingInB: return "missing_in_b";
    case DatasetStatus::ShapeMismatch: return "shape_mismatch";
  }
  return "unknown";
}

uint64_t ulp_distance(float x, float y) {
  const int64_t d = ordered_bits(x) - ordered_bits(y);
  return uint64_t(d < 0 ? -d : d);
}

ValueComparison compare_values(const StageData& a, const StageData& b, AbsRel tol,
                               size_t max_listed) {
  if (a.size() != b.size())
    fail("compare_values: {} values against {} (the caller must pair equal shapes)", a.size(),
         b.size());
  ValueComparison v;
  v.elements = a.size();
  double dot = 0, norm_a = 0, norm_b = 0, err2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a.at(i), y = b.at(i);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (x == y) continue;  // equal infinities, e.g. masked -inf scores on both sides
      ++v.nonfinite_mismatches;
      v.tolerance_used = kInf;
      note_mismatch(v, {i, x, y, std::fabs(x - y), kNaN}, max_listed);
      continue;
    }
    const double diff = std::fabs(x - y);
    const double bound = tol.atol + tol.rtol * std::fabs(y);
    const double rel = y != 0 ? diff / std::fabs(y) : (diff == 0 ? 0 : kInf);
    if (diff > v.max_abs_err) {
      v.max_abs_err = diff;
      v.max_abs_index = i;
    }
    if (rel > v.max_rel_err) {
      v.max_rel_err = rel;
      v.max_rel_index = i;
    }
    v.tolerance_used = std::max(v.tolerance_used, bound > 0 ? diff / bound : (diff == 0 ? 0 : kInf));
    const float fx = float(x), fy = float(y);
    if (std::isfinite(fx) && std::isfinite(fy)) v.max_ulp = std::max(v.max_ulp, ulp_distance(fx, fy));
    dot += x * y;
    norm_a += x * x;
    norm_b += y * y;
    err2 += (x - y) * (x - y);
    if (diff > bound) note_mismatch(v, {i, x, y, diff, rel}, max_listed);
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

double DatasetDiff::severity() const {
  if (status == DatasetStatus::MissingInA || status == DatasetStatus::MissingInB ||
      status == DatasetStatus::ShapeMismatch)
    return kInf;
  if (is_decision()) return values.mismatches > 0 ? kInf : 0;
  return values.tolerance_used;
}

size_t DiffResult::failed_datasets() const {
  return size_t(std::count_if(datasets.begin(), datasets.end(),
                              [](const DatasetDiff& d) { return d.failed(); }));
}

DiffResult diff_traces(const TraceReader& a, const TraceReader& b, const Tolerance& tol,
                       const DiffOptions& options) {
  check_same_model(a, b);
  DiffResult result;
  result.a = {a.path(), a.meta().backend, a.meta().precision};
  result.b = {b.path(), b.meta().backend, b.meta().precision};
  result.tolerance = tol;
  result.num_layers = layers_in(a, b);

  // Pair by path; the union of both sides, each dataset keyed as the side that has it
  // (the reference when both do).
  for (const auto& e : b.entries()) {
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    if (!a.has(e.path)) d.status = DatasetStatus::MissingInA;
    result.datasets.push_back(std::move(d));
  }
  for (const auto& e : a.entries()) {
    if (b.has(e.path)) continue;
    DatasetDiff d;
    d.path = e.path;
    d.key = e.key;
    d.status = DatasetStatus::MissingInB;
    result.datasets.push_back(std::move(d));
  }
  std::sort(result.datasets.begin(), result.datasets.end(),
            [](const DatasetDiff& x, const DatasetDiff& y) {
              return std::tie(x.key.position, x.key.order, x.path) <
                     std::tie(y.key.position, y.key.order, y.path);
            });

  for (DatasetDiff& d : result.datasets) {
    const Stage stage = d.key.stage;
    d.tolerance = tol.for_stage(stage);
    if (is_per_expert(stage)) {
      const std::string topk = trace_dataset_path(d.key.position, d.key.layer, Stage::topk_idx);
      if (b.has(topk)) {
        const StageData idx = b.read(topk);
        for (size_t i = 0; i < idx.size(); ++i) d.slot_experts.push_back(int32_t(idx.at(i)));
      }
    }
    if (d.status != DatasetStatus::Pass) continue;  // missing on one side
    const StageData da = a.read(d.path), db = b.read(d.path);
    d.dims_a = da.dims;
    d.dims_b = db.dims;
    if (da.dims != db.dims || da.size() != db.size()) {
      d.status = DatasetStatus::ShapeMismatch;
      continue;
    }
    if (d.is_decision()) {
      d.values = compare_decisions(da, db, options.max_listed);
      RoutingFlip flip;
      flip.slots = d.values.mismatches;
      auto sa = as_doubles(da), sb = as_doubles(db);
      std::sort(sa.begin(), sa.end());
      std::sort(sb.begin(), sb.end());
      flip.same_set = sa == sb;
      flip.margin = routing_margin(b, d.key.position, d.key.layer, db.size());
      d.routing = flip;
    } else {
      d.values = compare_values(da, db, d.tolerance, options.max_listed);
    }
    d.status = d.values.mismatches > 0 ? DatasetStatus::Fail : DatasetStatus::Pass;
  }

  for (const DatasetDiff& d : result.datasets) {
    if (!d.failed()) continue;
    FirstDivergence f;
    f.path = d.path;
    f.position = d.key.position;
    f.layer = d.key.layer;
    f.stage = d.key.stage;
    f.status = d.status;
    if (d.status == DatasetStatus::Fail) {
      f.element = d.values.first_mismatch;
      if (f.element && is_per_expert(d.key.stage) && d.dims_b.size() == 2 && d.dims_b[1] > 0) {
        const size_t slot = f.element->index / d.dims_b[1];
        if (slot < d.slot_experts.size()) f.expert = d.slot_experts[slot];
      }
    }
    result.first_divergence = f;
    break;
  }
  return result;
}

}  // namespace parity
