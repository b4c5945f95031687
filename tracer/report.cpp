// Reports of a DiffResult: h5diff-style text, JSON, JUnit XML and an HTML heatmap page.
#include "tracer/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <pugixml.hpp>
#include <sstream>

#include "model/error.h"
#include "model/untrusted.h"
#include "tracer/escape.h"

namespace parity {
namespace {

using nlohmann::json;

// ---- formatting helpers --------------------------------------------------------------------

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", x);
}

std::string value(double x) {
  if (!std::isfinite(x)) return num(x);
  return fmt::format("{:.9g}", x);
}

json json_number(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json json_layer(int layer) { return layer == kModelLayer ? json(nullptr) : json(layer); }

std::string dims_text(const std::vector<size_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// h5diff's element position: the multi-index "[ i j ]" of a flat index under dims.
std::string element_position(size_t index, const std::vector<size_t>& dims) {
  std::vector<size_t> idx(dims.size());
  size_t rest = index;
  for (size_t d = dims.size(); d-- > 0;) {
    const size_t extent = std::max<size_t>(dims[d], 1);
    idx[d] = rest % extent;
    rest /= extent;
  }
  if (dims.empty()) idx.push_back(index);
  std::string s = "[ ";
  for (size_t i : idx) s += std::to_string(i) + " ";
  return s + "]";
}

std::string location(const StageKey& k) {
  if (k.layer == kModelLayer)
    return fmt::format("stage {}, model scope, position {}", name(k.stage), k.position);
  return fmt::format("stage {}, layer {}, position {}", name(k.stage), k.layer, k.position);
}

std::string side_text(const TraceSide& s) {
  std::string facts = s.backend;
  if (!s.precision.empty()) facts += "; " + s.precision;
  return fmt::format("{} [{}]", s.file, facts);
}

std::string margin_text(const std::optional<double>& margin) {
  return margin ? num(*margin) : "unknown";
}

std::string share_text(double share) {
  if (std::isinf(share)) return "inf";
  return fmt::format("{:.3g}", share);
}

// What a decision difference is, in words.
std::string decision_text(Stage s, const DecisionDiff& d, size_t elements) {
  const bool topk = s == Stage::topk_idx;
  std::string kind = topk ? (d.same_set ? "same experts, another order" : "different experts")
                          : "another token";
  return fmt::format("{} {} of {} {} differ ({}); reference margin {} ({}); the widest gap {} "
                     "against {} allowed: {}",
                     topk ? "routing flip:" : "sampling flip:", d.slots, elements,
                     topk ? "slots" : "choices", kind, margin_text(d.margin),
                     topk ? "k-th minus (k+1)-th router logit" : "top-1 minus top-2 logit",
                     num(d.gap), num(d.allowance),
                     d.explained ? "drift (the values decided on explain it)" : "a wrong decision");
}

// One line on what is wrong with a failing dataset (JUnit messages, HTML lists).
std::string failure_summary(const DiffResult& r, const DatasetDiff& d) {
  switch (d.status) {
    case DatasetStatus::MissingInA:
      return fmt::format("{}: missing in A ({})", d.missing_path, r.a.file);
    case DatasetStatus::MissingInB:
      return fmt::format("{}: missing in B ({})", d.missing_path, r.b.file);
    case DatasetStatus::ShapeMismatch:
      return fmt::format("{}: shape {} in A but {} in B", d.path, dims_text(d.dims_a),
                         dims_text(d.dims_b));
    case DatasetStatus::NotCaptured: return fmt::format("{}: not captured by {}", d.path, r.a.file);
    case DatasetStatus::Unjudged:
      return fmt::format("{}: not judged ({}; the reference skipped the prefix)", d.path,
                         d.local_unavailable);
    case DatasetStatus::Pass: return fmt::format("{}: within the criterion", d.path);
    case DatasetStatus::Fail: break;
  }
  const SideDiff& side = *d.judged_side();
  const ValueComparison& v = side.values;
  if (side.decision)
    return fmt::format("{}: {} ({})", d.path, decision_text(d.key.stage, *side.decision, v.elements),
                       judge_name(d.judged));
  std::string s = fmt::format("{}: {} error exceeds the bound at {} of {} elements (worst {}x the "
                              "bound at {}; max abs err {})",
                              d.path, judge_name(d.judged), v.mismatches, v.compared,
                              share_text(v.share), v.share_index, num(v.max_abs_err));
  if (v.nonfinite_mismatches > 0) s += fmt::format(", {} NaN/Inf mismatches", v.nonfinite_mismatches);
  return s;
}

// A table line without the padding of its last column.
std::string line(std::string text) {
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text + "\n";
}

size_t accumulated_fallbacks(const DiffResult& r) {
  return size_t(std::count_if(r.datasets.begin(), r.datasets.end(),
                              [](const DatasetDiff& d) { return d.compared() && !d.local_unavailable.empty(); }));
}

std::string judged_text(const DiffResult& r) {
  if (r.judged == Judge::local && r.local_source == LocalSource::recompute) {
    std::string s =
        "judged by local error: each stage the capture recorded, recomputed by the reference "
        "from the capture's own inputs (B's recompute datasets): A's output minus that is the "
        "port's own error at that stage, free of what it inherited";
    if (const size_t n = accumulated_fallbacks(r); n > 0)
      s += fmt::format("; {} dataset(s) whose inputs the capture lacks are judged by their "
                       "accumulated error{}, each naming the input",
                       n, r.fallback ? " against " + r.fallback->describe() : std::string());
    if (r.accumulated_unavailable)
      s += "; the reference did not run the prefix (it took the candidate's KV-cache rows), so "
           "there is no accumulated error and no drift to report";
    return s;
  }
  if (r.capture && r.judged == Judge::accumulated)
    return "judged by accumulated error: A is a capture of a port, which cannot be re-run on the "
           "reference's inputs (no replay), so error inherited from earlier stages counts as each "
           "stage's own; the first divergence is where the port's output first leaves the "
           "criterion: a bug there, or drift grown past it (look at the stages before it)";
  if (r.judged == Judge::local) {
    std::string s =
        "judged by local error: each candidate stage re-run on the reference's inputs (replay)";
    const size_t n = size_t(std::count_if(r.datasets.begin(), r.datasets.end(),
                                          [](const DatasetDiff& d) { return d.recomputed; }));
    if (n > 0)
      s += fmt::format(
          "; {} dataset(s) of stages A's kernels compute from other inputs than "
          "their own (replay cannot re-run them) by A's output against the "
          "reference's recompute of it from A's own inputs",
          n);
    return s;
  }
  if (!r.a_has_replay)
    return "judged by accumulated error: A has no replay datasets, so drift inherited from "
           "earlier stages counts as this stage's error (trace with replay for a verdict by "
           "local error)";
  return "judged by accumulated error (asked for)";
}

// The largest judged share over the compared datasets of computing stages (copies use their
// whole rounding bound by design), failed ones included, and where.
const DatasetDiff* worst_dataset(const DiffResult& r) {
  const DatasetDiff* worst = nullptr;
  for (const auto& d : r.datasets) {
    if (!d.compared() || d.is_decision() || bound_is_rounding(d.key.stage)) continue;
    const SideDiff* s = d.judged_side();
    if (s == nullptr) continue;
    if (worst == nullptr || s->share() > worst->judged_side()->share()) worst = &d;
  }
  return worst;
}

std::string scale_text(const ScaleCheck& c) {
  return fmt::format("row scale: the row's common relative error {} against {} allowed ({}x){}",
                     num(c.estimate), num(c.bound), share_text(c.share()),
                     c.failed() ? ": every element moved together (an eps, a truncation)" : "");
}

// ---- text ------------------------------------------------------------------------------------

void text_dataset(std::string& out, const DiffResult& r, const DatasetDiff& d, size_t count) {
  out += fmt::format("dataset: {}  ({})\n", d.path, location(d.key));
  if (!d.slot_experts.empty()) {
    std::string experts;
    for (int32_t e : d.slot_experts) experts += (experts.empty() ? "" : ", ") + std::to_string(e);
    out += fmt::format("rows are topk slots; reference experts: {}\n", experts);
  }
  switch (d.status) {
    case DatasetStatus::MissingInA:
      out += fmt::format("not comparable: {} missing in A ({})\n\n", d.missing_path, r.a.file);
      return;
    case DatasetStatus::MissingInB:
      out += fmt::format("not comparable: missing in B ({})\n\n", r.b.file);
      return;
    case DatasetStatus::ShapeMismatch:
      out += fmt::format("not comparable: shape {} in A but {} in B\n\n", dims_text(d.dims_a),
                         dims_text(d.dims_b));
      return;
    case DatasetStatus::NotCaptured:
      out += fmt::format("not captured by {}\n\n", r.a.file);
      return;
    case DatasetStatus::Unjudged:
      out += fmt::format("not judged: {}, and the reference skipped the prefix\n\n",
                         d.local_unavailable);
      return;
    case DatasetStatus::Pass:
    case DatasetStatus::Fail: break;
  }
  const SideDiff& side = *d.judged_side();
  const ValueComparison& v = side.values;
  const bool recompute = d.judged == Judge::local && d.recomputed;
  out += fmt::format("{} error (A = {}):\n", judge_name(d.judged),
                     recompute                       ? "A's output; B = the stage recomputed from A's inputs"
                     : d.judged == Judge::local ? "the stage replayed on B's inputs"
                                                : "A's output");
  if (!d.local_unavailable.empty())
    out += fmt::format("no local error: {}{}\n", d.local_unavailable,
                       d.fallback_tolerance && r.fallback ? "; held to " + r.fallback->describe()
                                                          : std::string());
  out += fmt::format("size:           {}           {}\n", dims_text(d.dims_a), dims_text(d.dims_b));
  const size_t shown = std::min(count, v.listed.size());
  if (d.is_decision()) {
    out += line(fmt::format("{:<16}{:<16}{:<16}", "position", "A", "B")) + std::string(48, '-') + "\n";
    for (size_t i = 0; i < shown; ++i) {
      const auto& m = v.listed[i];
      out += line(fmt::format("{:<16}{:<16}{:<16}", element_position(m.index, d.dims_b),
                              value(m.a), value(m.b)));
    }
  } else {
    out += line(fmt::format("{:<16}{:<18}{:<18}{:<14}{:<14}{:<14}", "position", "A", "B",
                            "difference", "relative", "bound")) +
           std::string(94, '-') + "\n";
    for (size_t i = 0; i < shown; ++i) {
      const auto& m = v.listed[i];
      out += line(fmt::format("{:<16}{:<18}{:<18}{:<14}{:<14}{:<14}",
                              element_position(m.index, d.dims_b), value(m.a), value(m.b),
                              num(m.abs_err), num(m.rel_err), num(m.bound)));
    }
  }
  if (shown < v.mismatches)
    out += fmt::format("({} of {} listed; -n COUNT lists more)\n", shown, v.mismatches);
  if (v.nonfinite_mismatches > 0)
    out += fmt::format("NaN/Inf on one side only: {}\n", v.nonfinite_mismatches);
  if (side.decision) out += decision_text(d.key.stage, *side.decision, v.elements) + "\n";
  if (side.scale) out += scale_text(*side.scale) + "\n";
  if (d.judged == Judge::local && d.accumulated && !d.is_decision())
    out += fmt::format("accumulated error (A's free-running output): max abs {} ({}x the bound), "
                       "amplification {}\n",
                       num(d.accumulated->values.max_abs_err),
                       share_text(d.accumulated->values.share), num(d.amplification));
  if (d.rerouted_slots > 0)
    out += fmt::format("accumulated: {} slot(s) routed to another expert than the reference's "
                       "are not compared\n",
                       d.rerouted_slots);
  out += fmt::format("bound: {}\n", r.criterion.kind == Criterion::Kind::derived
                                        ? std::string(bound_formula(d.key.stage))
                                        : r.criterion.describe());
  out += fmt::format("{} differences found\n\n", v.mismatches);
}

void text_metrics_table(std::string& out, const DiffResult& r) {
  size_t width = 7;
  for (const auto& d : r.datasets) width = std::max(width, d.path.size());
  const auto row = [&](std::string_view path, std::string_view status, const std::string& elements,
                       const std::string& mism, const std::string& l_abs, const std::string& l_share,
                       const std::string& a_abs, const std::string& a_share, const std::string& amp,
                       const std::string& cosine, const std::string& nmse, const std::string& ulp) {
    out += line(fmt::format("{:<{}}  {:<14} {:>9} {:>10} {:>12} {:>10} {:>12} {:>10} {:>10} {:>12} "
                            "{:>11} {:>8}",
                            path, width, status, elements, mism, l_abs, l_share, a_abs, a_share,
                            amp, cosine, nmse, ulp));
  };
  row("dataset", "status", "elements", "mismatches", "local_abs", "local_share", "accum_abs",
      "accum_share", "amplif", "accum_cosine", "accum_nmse", "max_ulp");
  for (const auto& d : r.datasets) {
    if (!d.compared()) {
      row(d.path, status_name(d.status), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-");
      continue;
    }
    const SideDiff& j = *d.judged_side();
    const std::string mism = std::to_string(j.values.mismatches);
    if (d.is_decision()) {
      auto flip = [](const std::optional<SideDiff>& s) -> std::string {
        if (!s || !s->decision || s->decision->slots == 0) return "-";
        return s->decision->explained ? "drift" : "flip";
      };
      row(d.path, status_name(d.status), std::to_string(j.values.elements), mism, "-",
          flip(d.local), "-", flip(d.accumulated), "-", "-", "-", "-");
      continue;
    }
    const ValueComparison* l = d.local ? &d.local->values : nullptr;
    const ValueComparison* a = d.accumulated ? &d.accumulated->values : nullptr;
    row(d.path, status_name(d.status), std::to_string(j.values.elements), mism,
        l ? num(l->max_abs_err) : "-", l ? share_text(l->share) : "-",
        a ? num(a->max_abs_err) : "-", a ? share_text(a->share) : "-",
        std::isnan(d.amplification) ? "-" : num(d.amplification),
        a ? fmt::format("{:.9f}", a->cosine) : "-", a ? num(a->nmse) : "-",
        std::to_string((l ? l : a)->max_ulp));
  }
}

// ---- heatmap aggregation -----------------------------------------------------------------------

struct Cell {
  size_t datasets = 0, failed = 0;
  double worst = -1;  // max severity over positions
  const DatasetDiff* worst_dataset = nullptr;
  bool first = false;  // holds the first divergence
};

std::string cell_label(const Cell& c, bool accumulated) {
  if (c.worst_dataset == nullptr) return "";
  const DatasetDiff& d = *c.worst_dataset;
  switch (d.status) {
    case DatasetStatus::MissingInA:
    case DatasetStatus::MissingInB: return "missing";
    case DatasetStatus::ShapeMismatch: return "shape";
    case DatasetStatus::NotCaptured:
    case DatasetStatus::Unjudged: return "";
    case DatasetStatus::Pass:
    case DatasetStatus::Fail: break;
  }
  if (d.is_decision()) return c.worst == 0 ? "ok" : c.worst < 1 ? "drift" : "flip";
  const SideDiff* s = accumulated ? (d.accumulated ? &*d.accumulated : nullptr) : d.judged_side();
  if (s != nullptr && s->values.nonfinite_mismatches > 0) return "NaN";
  if (c.worst < 10) return fmt::format("{:.2g}", c.worst);
  if (c.worst < 1000) return fmt::format("{:.0f}", c.worst);
  return fmt::format("{:.0e}", c.worst);
}

std::string cell_class(const Cell& c) {
  if (c.datasets == 0) return "none";
  const double u = c.worst;
  if (std::isinf(u)) return "worst";
  if (u < 0.01) return "b0";
  if (u < 0.1) return "b1";
  if (u < 0.5) return "b2";
  if (u <= 1) return "b3";
  if (u < 10) return "b4";
  if (u < 100) return "b5";
  return "b6";
}

constexpr const char* kHtmlStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; }
h2 { font-size: 1.1em; margin-top: 1.6em; }
.verdict { font-weight: 600; padding: 0.6em 0.8em; border-radius: 4px; font-family: monospace; }
.verdict.pass { background: #e8f5e9; border: 1px solid #66bb6a; }
.verdict.diverged { background: #ffebee; border: 1px solid #e53935; }
table { border-collapse: collapse; }
table.meta td, table.meta th { text-align: left; padding: 0.15em 0.8em 0.15em 0; font-family: monospace; }
table.heat th, table.heat td { border: 1px solid #ddd; padding: 0.2em 0.35em; font-size: 0.78em;
  font-family: monospace; text-align: center; min-width: 2.8em; }
table.heat th.stage { text-align: left; }
td.none { background: #fafafa; }
td.b0 { background: #e8f5e9; } td.b1 { background: #c8e6c9; } td.b2 { background: #fff9c4; }
td.b3 { background: #ffe082; } td.b4 { background: #ef9a9a; } td.b5 { background: #e57373; }
td.b6, td.worst { background: #b71c1c; color: #fff; }
td.first { outline: 3px solid #1a237e; outline-offset: -3px; font-weight: 700; }
.legend span { display: inline-block; padding: 0.15em 0.6em; margin-right: 0.3em; font-size: 0.8em;
  font-family: monospace; border: 1px solid #ddd; }
table.fails td, table.fails th { border-bottom: 1px solid #eee; padding: 0.2em 0.8em 0.2em 0;
  font-family: monospace; font-size: 0.85em; text-align: left; }
input.view { display: none; }
label.view { display: inline-block; padding: 0.3em 0.9em; border: 1px solid #bbb; border-radius: 4px 4px 0 0;
  cursor: pointer; font-size: 0.9em; margin-right: 0.2em; background: #f5f5f5; }
#view-local:checked ~ label[for=view-local], #view-accum:checked ~ label[for=view-accum],
#view-pos:checked ~ label[for=view-pos] {
  background: #1a237e; color: #fff; border-color: #1a237e; }
div.heatmap { display: none; margin-top: 0.6em; }
#view-local:checked ~ div.local, #view-accum:checked ~ div.accum,
#view-pos:checked ~ div.pos { display: block; }
)";

// A heatmap of stages against columns: the layers (column 0 model scope, L + 1 layer L), or the
// positions (binned to at most kPositionColumns columns; every layer of a position in its cell).
enum class Columns { layers, positions };
constexpr int kPositionColumns = 64;

std::string heatmap(const DiffResult& r, bool accumulated, Columns by) {
  std::vector<int> positions;
  for (const auto& d : r.datasets) positions.push_back(d.key.position);
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  const int per_bin =
      std::max(1, int((positions.size() + kPositionColumns - 1) / kPositionColumns));
  const int columns = by == Columns::layers ? r.num_layers + 1
                                            : int((positions.size() + size_t(per_bin) - 1) / size_t(per_bin));
  auto column_of = [&](const DatasetDiff& d) {
    if (by == Columns::layers) return d.key.layer == kModelLayer ? 0 : d.key.layer + 1;
    const auto it = std::lower_bound(positions.begin(), positions.end(), d.key.position);
    return int(it - positions.begin()) / per_bin;
  };
  std::vector<std::vector<Cell>> grid(size_t(kNumStages),
                                      std::vector<Cell>(static_cast<size_t>(std::max(columns, 0))));
  for (const auto& d : r.datasets) {
    const int col = column_of(d);
    if (col < 0 || col >= columns || d.status == DatasetStatus::NotCaptured ||
        d.status == DatasetStatus::Unjudged)
      continue;
    Cell& c = grid[size_t(d.key.stage)][size_t(col)];
    ++c.datasets;
    const double sev = accumulated ? d.accumulated_severity() : d.severity();
    if (accumulated ? (d.accumulated && d.accumulated->failed) : d.failed()) ++c.failed;
    if (sev > c.worst || c.worst_dataset == nullptr) {
      c.worst = sev;
      c.worst_dataset = &d;
    }
    if (r.first_divergence && r.first_divergence->path == d.path) c.first = true;
  }
  auto column_name = [&](int col) -> std::string {
    if (by == Columns::layers) return col == 0 ? "model scope" : fmt::format("layer {}", col - 1);
    const int first = positions[size_t(col * per_bin)];
    const int last = positions[std::min(positions.size(), size_t((col + 1) * per_bin)) - 1];
    return first == last ? fmt::format("position {}", first)
                         : fmt::format("positions {}..{}", first, last);
  };
  std::string out = "<table class=\"heat\">\n<tr><th class=\"stage\">stage</th>";
  for (int col = 0; col < columns; ++col) {
    if (by == Columns::layers)
      out += col == 0 ? std::string("<th>model</th>") : fmt::format("<th>L{}</th>", col - 1);
    else
      out += fmt::format("<th title=\"{}\">{}</th>", column_name(col), positions[size_t(col * per_bin)]);
  }
  out += "</tr>\n";
  for (const auto& s : kStages) {
    out += fmt::format("<tr><th class=\"stage\">{}</th>", s.name);
    for (int col = 0; col < columns; ++col) {
      const Cell& c = grid[size_t(s.stage)][size_t(col)];
      if (c.datasets == 0) {
        out += "<td class=\"none\"></td>";
        continue;
      }
      const DatasetDiff& worst = *c.worst_dataset;
      std::string title = fmt::format("{} {}: {} of {} datasets exceed the criterion by {} error; "
                                      "largest share {} ({})",
                                      s.name, column_name(col), c.failed, c.datasets,
                                      accumulated ? "accumulated" : judge_name(r.judged),
                                      num(c.worst), location(worst.key));
      if (!accumulated && worst.failed()) title += "; " + failure_summary(r, worst);
      if (!std::isnan(worst.amplification))
        title += fmt::format("; amplification {}", num(worst.amplification));
      out += fmt::format("<td class=\"{}{}\" title=\"{}\">{}</td>", cell_class(c),
                         c.first && !accumulated ? " first" : "", markup_text(title),
                         markup_text(cell_label(c, accumulated)));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

// ---- public -------------------------------------------------------------------------------------

namespace {
std::string verdict_text(const DiffResult& r) {
  const size_t n = r.datasets.size() - r.not_captured - r.unjudged;
  std::string not_captured =
      r.not_captured == 0 ? std::string()
                          : fmt::format("; {} datasets not captured: {}", r.not_captured,
                                        one_line(r.not_captured_stages(), 300));
  if (r.unjudged > 0)
    not_captured += fmt::format("; {} datasets not judged (their inputs not captured, the "
                                "reference's prefix skipped)",
                                r.unjudged);
  const std::string how = fmt::format("by {} error under {}", judge_name(r.judged),
                                      r.criterion.describe());
  if (!r.diverged()) {
    std::string s = fmt::format("PASS: {} datasets of {} ({}) match {} ({}) {}", n, r.a.file,
                                r.a.backend, r.b.file, r.b.backend, how);
    if (const DatasetDiff* w = worst_dataset(r))
      s += fmt::format("; largest share of the bound {} ({}, {})",
                       share_text(w->judged_side()->share()), location(w->key),
                       judge_name(w->judged));
    if (const size_t n = accumulated_fallbacks(r); n > 0)
      s += fmt::format("; {} dataset(s) judged by accumulated error (inputs not captured)", n);
    if (r.drift_decisions > 0)
      s += fmt::format("; {} decision flip(s) within the bound (drift)", r.drift_decisions);
    return s + not_captured;
  }
  const FirstDivergence& f = *r.first_divergence;
  std::string where = f.layer == kModelLayer
                          ? fmt::format("position {}, model scope, stage {}", f.position, name(f.stage))
                          : fmt::format("position {}, layer {}, stage {}", f.position, f.layer,
                                        name(f.stage));
  if (f.expert) where += fmt::format(" (expert {})", *f.expert);
  if (f.rank >= 0) where += fmt::format(", rank {} of {}", f.rank, f.ranks);
  std::string what;
  const auto it = std::find_if(r.datasets.begin(), r.datasets.end(),
                               [&](const DatasetDiff& d) { return d.path == f.path; });
  if (f.status == DatasetStatus::MissingInA)
    what = fmt::format("dataset {} missing in A ({})",
                       it != r.datasets.end() ? it->missing_path : f.path, r.a.file);
  else if (f.status == DatasetStatus::MissingInB)
    what = fmt::format("dataset {} missing in B ({})", f.path, r.b.file);
  else if (f.status == DatasetStatus::ShapeMismatch && it != r.datasets.end())
    what = fmt::format("shape {} in A but {} in B", dims_text(it->dims_a), dims_text(it->dims_b));
  else if (f.element && is_decision(f.stage) && it != r.datasets.end())
    what = fmt::format("{} {}: candidate {} vs reference {}; {}",
                       f.stage == Stage::topk_idx ? "slot" : "choice", f.element->index,
                       value(f.element->a), value(f.element->b),
                       decision_text(f.stage, *it->judged_side()->decision,
                                     it->judged_side()->values.elements));
  else if (f.element) {
    what = fmt::format("element {} {}: {} candidate {} vs reference {} (abs err {}, rel err {}, "
                       "bound {}: {}x)",
                       f.element->index,
                       element_position(f.element->index, it != r.datasets.end() ? it->dims_b
                                                                                 : std::vector<size_t>{}),
                       judge_name(f.judged), value(f.element->a), value(f.element->b),
                       num(f.element->abs_err), num(f.element->rel_err), num(f.element->bound),
                       share_text(f.share));
    if (f.scale) what += "; " + scale_text(*f.scale);
    if (it != r.datasets.end() && !it->local_unavailable.empty())
      what += fmt::format(" (no local error: {}{})", it->local_unavailable,
                          it->fallback_tolerance && r.fallback
                              ? "; held to " + r.fallback->describe()
                              : std::string());
    if (f.accumulated_abs_err)
      what += fmt::format("; accumulated error there {}, amplification {}",
                          num(*f.accumulated_abs_err), num(f.amplification));
  }
  if (!f.rank_note.empty()) what += "; tensor parallel: " + f.rank_note;
  return fmt::format("DIVERGED: {} of {} datasets differ {}; first divergence at {}: {}{}",
                     r.failed_datasets(), n, how, where, what, not_captured);
}
}  // namespace

std::string verdict_line(const DiffResult& r) { return printable_text(verdict_text(r)); }

namespace {
// Per stage, over every position and layer: datasets, failures, the largest local and accumulated
// shares (and where the local one is), the largest amplification.
void text_stage_table(std::string& out, const DiffResult& r) {
  struct Row {
    size_t datasets = 0, failed = 0, flips = 0, drift = 0, not_captured = 0;
    double local = -1, accumulated = -1, amplification = -1;
    const DatasetDiff* worst = nullptr;
  };
  std::map<Stage, Row> rows;
  for (const auto& d : r.datasets) {
    Row& row = rows[d.key.stage];
    if (d.status == DatasetStatus::NotCaptured) {
      ++row.not_captured;
      continue;
    }
    ++row.datasets;
    row.failed += d.failed();
    if (d.is_decision()) {
      const SideDiff* j = d.judged_side();
      if (j != nullptr && j->decision && j->decision->slots > 0) {
        ++row.flips;
        row.drift += j->decision->explained;
      }
      continue;
    }
    if (d.local && d.local->share() > row.local) {
      row.local = d.local->share();
      row.worst = &d;
    }
    if (d.accumulated) row.accumulated = std::max(row.accumulated, d.accumulated->values.share);
    if (!std::isnan(d.amplification)) row.amplification = std::max(row.amplification, d.amplification);
  }
  out += line(fmt::format("{:<12} {:>9} {:>7} {:>12} {:>14} {:>12}  {}", "stage", "datasets",
                          "failed", "local_share", "accum_share", "amplif", "largest local share at"));
  for (const auto& si : kStages) {
    const auto it = rows.find(si.stage);
    if (it == rows.end()) continue;
    const Row& row = it->second;
    auto val = [](double x) { return x < 0 ? std::string("-") : share_text(x); };
    if (row.datasets == 0) {
      out += line(fmt::format("{:<12} {:>9} {:>7} {:>12} {:>14} {:>12}  {}", si.name, 0, "-", "-",
                              "-", "-", fmt::format("not captured ({} datasets)", row.not_captured)));
      continue;
    }
    if (is_decision(si.stage)) {
      out += line(fmt::format("{:<12} {:>9} {:>7} {:>12} {:>14} {:>12}  {}", si.name, row.datasets,
                              row.failed, "-", "-", "-",
                              row.flips == 0 ? std::string("no flips")
                                             : fmt::format("{} flip(s), {} drift", row.flips, row.drift)));
      continue;
    }
    out += line(fmt::format("{:<12} {:>9} {:>7} {:>12} {:>14} {:>12}  {}", si.name, row.datasets,
                            row.failed, val(row.local), val(row.accumulated), val(row.amplification),
                            row.worst ? location(row.worst->key) : std::string("-")));
  }
}
}  // namespace

std::string report_text(const DiffResult& r, const TextReportOptions& options) {
  if (options.quiet) return verdict_line(r) + "\n";
  // The verdict and the culprit first, then the summary, then the detail (capped).
  constexpr size_t kDetailed = 20, kTableRows = 500;
  std::string out = verdict_line(r) + "\n\n";
  out += fmt::format("A (candidate): {}\nB (reference): {}\n", side_text(r.a), side_text(r.b));
  out += fmt::format("criterion: {}; an element differs when |A - B| > its bound\n",
                     r.criterion.describe());
  out += judged_text(r) + "\n";
  if (r.criterion.kind == Criterion::Kind::derived)
    out += fmt::format("precision of A: {}\n", json_text(r.policy.to_json()));
  for (const std::string& w : r.warnings) out += "warning: " + w + "\n";
  out += "\n";
  const DatasetDiff* culprit = nullptr;
  if (r.first_divergence)
    for (const auto& d : r.datasets)
      if (d.path == r.first_divergence->path) culprit = &d;
  if (culprit != nullptr) {
    out += "first divergence:\n";
    text_dataset(out, r, *culprit, options.count);
  }
  out += fmt::format("summary: {} datasets compared, {} differ", r.datasets.size() - r.not_captured - r.unjudged,
                     r.failed_datasets());
  if (r.not_captured > 0)
    out += fmt::format(", {} not captured by the port ({})", r.not_captured,
                       r.not_captured_stages());
  if (!r.selection.empty())
    out += fmt::format(" (selected: {}; {} other datasets not compared)", r.selection, r.not_selected);
  if (r.drift_decisions > 0)
    out += fmt::format(", {} decision flip(s) within the bound (drift)", r.drift_decisions);
  out += "\n";
  if (r.first_drift_path)
    out += fmt::format("drift: the accumulated error first exceeds the criterion at {}\n",
                       *r.first_drift_path);
  out += "\n";
  text_stage_table(out, r);
  out += "\n";
  size_t detailed = 0, failed_left = 0;
  for (const auto& d : r.datasets) {
    if (!d.failed() || &d == culprit) continue;
    if (detailed == kDetailed) {
      ++failed_left;
      continue;
    }
    if (detailed++ == 0) out += "other datasets that differ:\n";
    text_dataset(out, r, d, options.count);
  }
  if (failed_left > 0)
    out += fmt::format("... and {} more datasets that differ (all of them are in the JSON report)\n\n",
                       failed_left);
  if (r.datasets.size() <= kTableRows) {
    text_metrics_table(out, r);
  } else {
    out += fmt::format("(the per-dataset table of {} datasets is in the JSON report)\n",
                       r.datasets.size());
  }
  out += "\n" + verdict_line(r) + "\n";
  // Every byte of the traces' attributes and the files' names the report quotes, escaped once.
  return printable_text(out);
}

namespace {
json side_json(const DatasetDiff& d, const std::optional<SideDiff>& s) {
  if (!s) return nullptr;
  const ValueComparison& v = s->values;
  if (s->decision) {
    const DecisionDiff& dd = *s->decision;
    return {{"failed", s->failed},
            {"elements", v.elements},
            {"mismatches", v.mismatches},
            {"flip", dd.slots > 0},
            {"drift", dd.drift()},
            {"same_set", dd.same_set},
            {"margin", dd.margin ? json_number(*dd.margin) : json(nullptr)},
            {"gap", json_number(dd.gap)},
            {"allowance", json_number(dd.allowance)}};
  }
  (void)d;
  json scale = nullptr;
  if (s->scale)
    scale = {{"estimate", json_number(s->scale->estimate)},
             {"bound", json_number(s->scale->bound)},
             {"share", json_number(s->scale->share())}};
  return {{"failed", s->failed},
          {"scale", scale},
          {"elements", v.elements},
          {"compared", v.compared},
          {"mismatches", v.mismatches},
          {"max_abs_err", json_number(v.max_abs_err)},
          {"max_abs_index", v.max_abs_index},
          {"max_rel_err", json_number(v.max_rel_err)},
          {"max_rel_index", v.max_rel_index},
          {"max_ulp", v.max_ulp},
          {"cosine", json_number(v.cosine)},
          {"nmse", json_number(v.nmse)},
          {"share", json_number(v.share)},
          {"share_index", v.share_index},
          {"max_bound", json_number(v.max_bound)},
          {"nonfinite_mismatches", v.nonfinite_mismatches}};
}
}  // namespace

json report_json(const DiffResult& r) {
  json first = nullptr;
  if (r.first_divergence) {
    const FirstDivergence& f = *r.first_divergence;
    const auto& e = f.element;
    first = {{"path", f.path},
             {"position", f.position},
             {"layer", json_layer(f.layer)},
             {"stage", name(f.stage)},
             {"status", status_name(f.status)},
             {"judged", judge_name(f.judged)},
             {"expert", f.expert ? json(*f.expert) : json(nullptr)},
             {"index", e ? json(e->index) : json(nullptr)},
             {"candidate", e ? json_number(e->a) : json(nullptr)},
             {"reference", e ? json_number(e->b) : json(nullptr)},
             {"abs_err", e ? json_number(e->abs_err) : json(nullptr)},
             {"rel_err", e ? json_number(e->rel_err) : json(nullptr)},
             {"bound", e ? json_number(e->bound) : json(nullptr)},
             {"share", e ? json_number(f.share) : json(nullptr)},
             {"scale", f.scale ? json{{"estimate", json_number(f.scale->estimate)},
                                      {"bound", json_number(f.scale->bound)}}
                               : json(nullptr)},
             {"accumulated_abs_err",
              f.accumulated_abs_err ? json_number(*f.accumulated_abs_err) : json(nullptr)},
             {"amplification", json_number(f.amplification)},
             {"ranks", f.ranks},
             {"rank", f.rank >= 0 ? json(f.rank) : json(nullptr)},
             {"rank_note", f.rank_note}};
  }
  json datasets = json::array();
  for (const auto& d : r.datasets) {
    json experts = nullptr;
    if (!d.slot_experts.empty()) experts = d.slot_experts;
    datasets.push_back({{"path", d.path},
                        {"position", d.key.position},
                        {"layer", json_layer(d.key.layer)},
                        {"stage", name(d.key.stage)},
                        {"order", d.key.order},
                        {"status", status_name(d.status)},
                        {"missing", d.missing_path.empty() ? json(nullptr) : json(d.missing_path)},
                        {"judged", judge_name(d.judged)},
                        {"local_unavailable",
                         d.local_unavailable.empty() ? json(nullptr) : json(d.local_unavailable)},
                        {"fallback_tolerance", d.fallback_tolerance},
                        {"recomputed", d.recomputed},
                        {"dims_a", d.dims_a},
                        {"dims_b", d.dims_b},
                        {"experts", experts},
                        {"rerouted_slots", d.rerouted_slots},
                        {"amplification", json_number(d.amplification)},
                        {"local", side_json(d, d.local)},
                        {"accumulated", side_json(d, d.accumulated)}});
  }
  json summary = {{"datasets", r.datasets.size()},
                  {"failed", r.failed_datasets()},
                  {"drift_decisions", r.drift_decisions}};
  if (!r.selection.empty()) summary["selection"] = {{"what", r.selection}, {"not_compared", r.not_selected}};
  if (r.capture)
    summary["not_captured"] = {{"datasets", r.not_captured}, {"stages", r.not_captured_stages()}};
  if (const DatasetDiff* w = worst_dataset(r))
    summary["largest_share"] = {{"path", w->path}, {"share", json_number(w->judged_side()->share())}};
  summary["judged_accumulated_for_lack_of_inputs"] = accumulated_fallbacks(r);
  summary["unjudged"] = r.unjudged;
  return {{"verdict", r.diverged() ? "diverged" : "pass"},
          {"summary", summary},
          {"first_divergence", first},
          {"first_drift", r.first_drift_path ? json(*r.first_drift_path) : json(nullptr)},
          {"criterion", r.criterion.to_json()},
          {"judged", judge_name(r.judged)},
          {"local_source", local_source_name(r.local_source)},
          {"accumulated_unavailable", r.accumulated_unavailable},
          {"fallback_tolerance", r.fallback ? r.fallback->to_json() : json(nullptr)},
          {"warnings", r.warnings},
          {"candidate_precision_policy", r.policy.to_json()},
          {"a", {{"file", r.a.file}, {"backend", r.a.backend}, {"precision", r.a.precision},
                 {"replay", r.a_has_replay}, {"capture", r.capture}}},
          {"b", {{"file", r.b.file}, {"backend", r.b.backend}, {"precision", r.b.precision}}},
          {"datasets", datasets}};
}

namespace {
std::string xml_document_text(const pugi::xml_document& doc) {
  std::ostringstream out;
  doc.save(out, "  ", pugi::format_default, pugi::encoding_utf8);
  return out.str();
}

pugi::xml_document junit_document() {
  pugi::xml_document doc;
  pugi::xml_node decl = doc.prepend_child(pugi::node_declaration);
  decl.append_attribute("version") = "1.0";
  decl.append_attribute("encoding") = "UTF-8";
  return doc;
}
}  // namespace

std::string report_junit(const DiffResult& r) {
  struct StageCase {
    size_t datasets = 0, failed = 0, not_captured = 0;
    std::vector<const DatasetDiff*> failures;
  };
  std::map<Stage, StageCase> cases;
  for (const auto& d : r.datasets) {
    StageCase& c = cases[d.key.stage];
    ++c.datasets;
    c.not_captured += d.status == DatasetStatus::NotCaptured;
    if (!d.failed()) continue;
    ++c.failed;
    c.failures.push_back(&d);
  }
  size_t failures = 0, skipped = 0;
  for (const auto& s : kStages) {
    const auto it = cases.find(s.stage);
    if (it == cases.end() || it->second.not_captured == it->second.datasets) ++skipped;
    else if (it->second.failed > 0) ++failures;
  }
  pugi::xml_document doc = junit_document();
  // The common JUnit schema: counts on <testsuites> are tests, failures, errors (no skipped).
  pugi::xml_node suites = doc.append_child("testsuites");
  suites.append_attribute("name") = "parity-diff";
  suites.append_attribute("tests") = kNumStages;
  suites.append_attribute("failures") = failures;
  suites.append_attribute("errors") = 0;
  pugi::xml_node suite = suites.append_child("testsuite");
  suite.append_attribute("name") = printable_text(fmt::format("parity-diff {} vs {}", r.a.file, r.b.file)).c_str();
  suite.append_attribute("tests") = kNumStages;
  suite.append_attribute("failures") = failures;
  suite.append_attribute("errors") = 0;
  suite.append_attribute("skipped") = skipped;
  suite.append_attribute("time") = 0;
  pugi::xml_node props = suite.append_child("properties");
  for (const auto& [key, val] : {std::pair<std::string, std::string>{"candidate", side_text(r.a)},
                                 {"reference", side_text(r.b)},
                                 {"criterion", r.criterion.describe()},
                                 {"judged", std::string(judge_name(r.judged))},
                                 {"verdict", verdict_line(r)}}) {
    pugi::xml_node p = props.append_child("property");
    p.append_attribute("name") = key.c_str();
    p.append_attribute("value") = printable_text(val).c_str();
  }
  for (const auto& s : kStages) {
    pugi::xml_node tc = suite.append_child("testcase");
    tc.append_attribute("classname") = fmt::format("parity.{}", scope_name(s.scope)).c_str();
    tc.append_attribute("name") = std::string(s.name).c_str();
    tc.append_attribute("time") = 0;
    const auto it = cases.find(s.stage);
    if (it == cases.end()) {
      tc.append_child("skipped").append_attribute("message") =
          fmt::format("no {} datasets in either trace", s.name).c_str();
      continue;
    }
    const StageCase& c = it->second;
    if (c.not_captured == c.datasets) {
      tc.append_child("skipped").append_attribute("message") =
          fmt::format("{} not captured by the port ({} datasets)", s.name, c.datasets).c_str();
      continue;
    }
    if (c.failed == 0) continue;
    // The culprit's testcase carries the first divergence itself.
    const bool first = r.first_divergence && r.first_divergence->stage == s.stage;
    std::string message = first ? verdict_line(r) : failure_summary(r, *c.failures.front());
    message += fmt::format(" ({} of {} datasets of stage {} differ)", c.failed, c.datasets, s.name);
    std::string details;
    for (const DatasetDiff* d : c.failures) details += failure_summary(r, *d) + "\n";
    pugi::xml_node f = tc.append_child("failure");
    f.append_attribute("type") = "diverged";
    f.append_attribute("message") = printable_text(message).c_str();
    f.append_child(pugi::node_pcdata).set_value(printable_text(details).c_str());
  }
  return xml_document_text(doc);
}

std::string junit_error(std::string_view tool, std::string_view message) {
  pugi::xml_document doc = junit_document();
  pugi::xml_node suites = doc.append_child("testsuites");
  suites.append_attribute("name") = std::string(tool).c_str();
  suites.append_attribute("tests") = 1;
  suites.append_attribute("failures") = 0;
  suites.append_attribute("errors") = 1;
  pugi::xml_node suite = suites.append_child("testsuite");
  suite.append_attribute("name") = std::string(tool).c_str();
  suite.append_attribute("tests") = 1;
  suite.append_attribute("failures") = 0;
  suite.append_attribute("errors") = 1;
  suite.append_attribute("skipped") = 0;
  suite.append_attribute("time") = 0;
  pugi::xml_node tc = suite.append_child("testcase");
  tc.append_attribute("classname") = "parity.run";
  tc.append_attribute("name") = "run";
  tc.append_attribute("time") = 0;
  pugi::xml_node e = tc.append_child("error");
  e.append_attribute("type") = "error";
  e.append_attribute("message") = printable_text(message).c_str();
  return xml_document_text(doc);
}

std::string report_html(const DiffResult& r) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += fmt::format("<title>parity-diff: {} vs {}</title>\n<style>{}</style>\n</head>\n<body>\n",
                     markup_text(r.a.file), markup_text(r.b.file), kHtmlStyle);
  out += "<h1>parity-diff</h1>\n";
  out += fmt::format("<p class=\"verdict {}\">{}</p>\n", r.diverged() ? "diverged" : "pass",
                     markup_text(verdict_line(r)));
  out += "<table class=\"meta\">\n";
  out += fmt::format("<tr><th>A (candidate)</th><td>{}</td></tr>\n", markup_text(side_text(r.a)));
  out += fmt::format("<tr><th>B (reference)</th><td>{}</td></tr>\n", markup_text(side_text(r.b)));
  out += fmt::format("<tr><th>criterion</th><td>{}; an element differs when |A &minus; B| &gt; "
                     "its bound</td></tr>\n",
                     markup_text(r.criterion.describe()));
  out += fmt::format("<tr><th>judged</th><td>{}</td></tr>\n", markup_text(judged_text(r)));
  out += fmt::format("<tr><th>datasets</th><td>{} compared, {} differ</td></tr>\n",
                     r.datasets.size() - r.not_captured - r.unjudged, r.failed_datasets());
  if (r.not_captured > 0)
    out += fmt::format("<tr><th>not captured</th><td>{} datasets: {}</td></tr>\n", r.not_captured,
                       markup_text(r.not_captured_stages()));
  if (r.first_drift_path)
    out += fmt::format("<tr><th>drift</th><td>the accumulated error first exceeds the criterion at "
                       "{}</td></tr>\n",
                       markup_text(*r.first_drift_path));
  for (const std::string& w : r.warnings)
    out += fmt::format("<tr><th>warning</th><td>{}</td></tr>\n", markup_text(w));
  out += "</table>\n";

  out += "<h2>Error heatmaps</h2>\n<p>Each cell: the largest share of the bound used over all "
         "positions, max |A&minus;B| / bound; above 1 fails. <b>Local</b>: each stage's own error "
         "(replayed on the reference's inputs, or recomputed by the reference from a capture's "
         "own inputs), which decides. <b>Accumulated</b>: the candidate "
         "running free, the drift it inherits (reported, not judged). The first divergence is "
         "outlined; hover a cell for details.</p>\n";
  out += "<p class=\"legend\"><span style=\"background:#e8f5e9\">&lt; 0.01</span>"
         "<span style=\"background:#c8e6c9\">&lt; 0.1</span>"
         "<span style=\"background:#fff9c4\">&lt; 0.5; a decision flip within the bound (drift)</span>"
         "<span style=\"background:#ffe082\">&le; 1</span>"
         "<span style=\"background:#ef9a9a\">&lt; 10</span>"
         "<span style=\"background:#e57373\">&lt; 100</span>"
         "<span style=\"background:#b71c1c;color:#fff\">&ge; 100, NaN, flip, missing</span></p>\n";
  out += "<div>\n<input class=\"view\" type=\"radio\" name=\"view\" id=\"view-local\" checked>\n"
         "<input class=\"view\" type=\"radio\" name=\"view\" id=\"view-accum\">\n"
         "<input class=\"view\" type=\"radio\" name=\"view\" id=\"view-pos\">\n";
  out += fmt::format("<label class=\"view\" for=\"view-local\">{} error by layer (decides)</label>\n",
                     judge_name(r.judged));
  out += "<label class=\"view\" for=\"view-accum\">accumulated error by layer (drift)</label>\n";
  out += fmt::format("<label class=\"view\" for=\"view-pos\">{} error by position</label>\n",
                     judge_name(r.judged));
  out += "<div class=\"heatmap local\" id=\"heat-local\">\n" + heatmap(r, false, Columns::layers) + "</div>\n";
  out += "<div class=\"heatmap accum\" id=\"heat-accum\">\n" + heatmap(r, true, Columns::layers) + "</div>\n";
  out += "<div class=\"heatmap pos\" id=\"heat-pos\">\n<p>Each column a position (or a range of them), "
         "every layer in its cell: a pattern over positions (a sliding window off by one, a cache "
         "written at the wrong row) shows here.</p>\n" +
         heatmap(r, false, Columns::positions) + "</div>\n</div>\n";

  constexpr size_t kMaxListed = 500;
  out += fmt::format("<h2>Datasets that differ ({})</h2>\n", r.failed_datasets());
  if (r.failed_datasets() > 0) {
    out += "<table class=\"fails\">\n<tr><th>position</th><th>layer</th><th>stage</th>"
           "<th>status</th><th>what</th></tr>\n";
    size_t listed = 0;
    for (const auto& d : r.datasets) {
      if (!d.failed()) continue;
      if (listed++ == kMaxListed) break;
      out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                         d.key.position,
                         d.key.layer == kModelLayer ? "model" : std::to_string(d.key.layer),
                         name(d.key.stage), status_name(d.status),
                         markup_text(failure_summary(r, d)));
    }
    out += "</table>\n";
    if (r.failed_datasets() > kMaxListed)
      out += fmt::format("<p>&hellip; and {} more (see the JSON report).</p>\n",
                         r.failed_datasets() - kMaxListed);
  }
  out += "</body>\n</html>\n";
  return out;
}

ReportFormat parse_report_format(std::string_view name) {
  if (name == "text") return ReportFormat::Text;
  if (name == "json") return ReportFormat::Json;
  if (name == "junit") return ReportFormat::Junit;
  if (name == "html") return ReportFormat::Html;
  fail("--report {}: unknown report format (text, json, junit, html)", name);
}

std::string render_report(const DiffResult& r, ReportFormat format,
                          const TextReportOptions& text_options) {
  switch (format) {
    case ReportFormat::Text: return report_text(r, text_options);
    case ReportFormat::Json: return json_text(report_json(r), 2) + "\n";
    case ReportFormat::Junit: return report_junit(r);
    case ReportFormat::Html: return report_html(r);
  }
  return report_text(r, text_options);
}

}  // namespace parity
