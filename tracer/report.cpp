// Reports of a DiffResult: h5diff-style text, JSON, JUnit XML and an HTML heatmap page.
#include "tracer/report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "model/error.h"

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
  return margin ? num(*margin) : "unknown (no reference router dataset)";
}

// One line on what is wrong with a failing dataset (JUnit messages, HTML lists).
std::string failure_summary(const DiffResult& r, const DatasetDiff& d) {
  switch (d.status) {
    case DatasetStatus::MissingInA: return fmt::format("{}: missing in A ({})", d.path, r.a.file);
    case DatasetStatus::MissingInB: return fmt::format("{}: missing in B ({})", d.path, r.b.file);
    case DatasetStatus::ShapeMismatch:
      return fmt::format("{}: shape {} in A but {} in B", d.path, dims_text(d.dims_a),
                         dims_text(d.dims_b));
    case DatasetStatus::Pass: return fmt::format("{}: within tolerance", d.path);
    case DatasetStatus::Fail: break;
  }
  const ValueComparison& v = d.values;
  if (d.is_decision())
    return fmt::format("{}: routing flip in {} of {} slots ({}; reference margin {})", d.path,
                       v.mismatches, v.elements,
                       d.routing && d.routing->same_set ? "same experts, another order"
                                                        : "different experts",
                       margin_text(d.routing ? d.routing->margin : std::nullopt));
  std::string s = fmt::format("{}: {} of {} elements differ (max abs err {} at {}, max rel err {} at {}",
                              d.path, v.mismatches, v.elements, num(v.max_abs_err),
                              v.max_abs_index, num(v.max_rel_err), v.max_rel_index);
  if (v.nonfinite_mismatches > 0) s += fmt::format(", {} NaN/Inf mismatches", v.nonfinite_mismatches);
  return s + ")";
}

// A table line without the padding of its last column.
std::string line(std::string text) {
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text + "\n";
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
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
      out += fmt::format("not comparable: missing in A ({})\n\n", r.a.file);
      return;
    case DatasetStatus::MissingInB:
      out += fmt::format("not comparable: missing in B ({})\n\n", r.b.file);
      return;
    case DatasetStatus::ShapeMismatch:
      out += fmt::format("not comparable: shape {} in A but {} in B\n\n", dims_text(d.dims_a),
                         dims_text(d.dims_b));
      return;
    case DatasetStatus::Pass:
    case DatasetStatus::Fail: break;
  }
  const ValueComparison& v = d.values;
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
    out += line(fmt::format("{:<16}{:<18}{:<18}{:<18}{:<18}", "position", "A", "B", "difference",
                            "relative")) +
           std::string(88, '-') + "\n";
    for (size_t i = 0; i < shown; ++i) {
      const auto& m = v.listed[i];
      out += line(fmt::format("{:<16}{:<18}{:<18}{:<18}{:<18}", element_position(m.index, d.dims_b),
                              value(m.a), value(m.b), num(m.abs_err), num(m.rel_err)));
    }
  }
  if (shown < v.mismatches)
    out += fmt::format("({} of {} listed; -n COUNT lists more)\n", shown, v.mismatches);
  if (v.nonfinite_mismatches > 0)
    out += fmt::format("NaN/Inf on one side only: {}\n", v.nonfinite_mismatches);
  if (d.routing)
    out += fmt::format("routing flip: {} of {} slots differ ({}); reference margin {} (k-th minus "
                       "(k+1)-th router logit)\n",
                       d.routing->slots, v.elements,
                       d.routing->same_set ? "same experts, another order" : "different experts",
                       margin_text(d.routing->margin));
  out += fmt::format("{} differences found\n\n", v.mismatches);
}

void text_metrics_table(std::string& out, const DiffResult& r) {
  size_t width = 7;
  for (const auto& d : r.datasets) width = std::max(width, d.path.size());
  out += fmt::format("{:<{}}  {:<14} {:>9} {:>10} {:>12} {:>8} {:>12} {:>8} {:>9} {:>12} {:>11} {:>9}\n",
                     "dataset", width, "status", "elements", "mismatches", "max_abs_err", "at",
                     "max_rel_err", "at", "max_ulp", "cosine", "nmse", "tol_used");
  for (const auto& d : r.datasets) {
    const ValueComparison& v = d.values;
    const bool compared = d.status == DatasetStatus::Pass || d.status == DatasetStatus::Fail;
    if (!compared) {
      out += fmt::format("{:<{}}  {:<14} {:>9} {:>10} {:>12} {:>8} {:>12} {:>8} {:>9} {:>12} {:>11} {:>9}\n",
                         d.path, width, status_name(d.status), "-", "-", "-", "-", "-", "-", "-",
                         "-", "-", "-");
    } else if (d.is_decision()) {
      out += fmt::format("{:<{}}  {:<14} {:>9} {:>10} {:>12} {:>8} {:>12} {:>8} {:>9} {:>12} {:>11} {:>9}\n",
                         d.path, width, status_name(d.status), v.elements, v.mismatches, "-", "-",
                         "-", "-", "-", "-", "-", v.mismatches > 0 ? "flip" : "-");
    } else {
      out += fmt::format("{:<{}}  {:<14} {:>9} {:>10} {:>12} {:>8} {:>12} {:>8} {:>9} {:>12.9f} {:>11} {:>9}\n",
                         d.path, width, status_name(d.status), v.elements, v.mismatches,
                         num(v.max_abs_err), v.max_abs_index, num(v.max_rel_err), v.max_rel_index,
                         v.max_ulp, v.cosine, num(v.nmse), num(v.tolerance_used));
    }
  }
}

// ---- heatmap aggregation -----------------------------------------------------------------------

struct Cell {
  size_t datasets = 0, failed = 0;
  double worst = -1;  // max severity over positions
  const DatasetDiff* worst_dataset = nullptr;
  bool first = false;  // holds the first divergence
};

std::string cell_label(const Cell& c) {
  if (c.worst_dataset == nullptr) return "";
  const DatasetDiff& d = *c.worst_dataset;
  switch (d.status) {
    case DatasetStatus::MissingInA:
    case DatasetStatus::MissingInB: return "missing";
    case DatasetStatus::ShapeMismatch: return "shape";
    case DatasetStatus::Pass:
    case DatasetStatus::Fail: break;
  }
  if (d.is_decision()) return d.values.mismatches > 0 ? "flip" : "ok";
  if (d.values.nonfinite_mismatches > 0) return "NaN";
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
)";

}  // namespace

// ---- public -------------------------------------------------------------------------------------

std::string verdict_line(const DiffResult& r) {
  const size_t n = r.datasets.size();
  if (!r.diverged())
    return fmt::format("PASS: {} datasets of {} ({}) match {} ({}) within {}", n, r.a.file,
                       r.a.backend, r.b.file, r.b.backend, r.tolerance.describe());
  const FirstDivergence& f = *r.first_divergence;
  std::string where = f.layer == kModelLayer
                          ? fmt::format("position {}, model scope, stage {}", f.position, name(f.stage))
                          : fmt::format("position {}, layer {}, stage {}", f.position, f.layer,
                                        name(f.stage));
  if (f.expert) where += fmt::format(" (expert {})", *f.expert);
  std::string what;
  const auto it = std::find_if(r.datasets.begin(), r.datasets.end(),
                               [&](const DatasetDiff& d) { return d.path == f.path; });
  if (f.status == DatasetStatus::MissingInA)
    what = fmt::format("dataset {} missing in A ({})", f.path, r.a.file);
  else if (f.status == DatasetStatus::MissingInB)
    what = fmt::format("dataset {} missing in B ({})", f.path, r.b.file);
  else if (f.status == DatasetStatus::ShapeMismatch && it != r.datasets.end())
    what = fmt::format("shape {} in A but {} in B", dims_text(it->dims_a), dims_text(it->dims_b));
  else if (f.element && info(f.stage).kind == ValueKind::Index)
    what = fmt::format("slot {}: candidate expert {} vs reference expert {} (routing flip; "
                       "reference margin {})",
                       f.element->index, value(f.element->a), value(f.element->b),
                       margin_text(it != r.datasets.end() && it->routing ? it->routing->margin
                                                                         : std::nullopt));
  else if (f.element)
    what = fmt::format("element {} {}: candidate {} vs reference {} (abs err {}, rel err {})",
                       f.element->index,
                       element_position(f.element->index, it != r.datasets.end() ? it->dims_b
                                                                                 : std::vector<size_t>{}),
                       value(f.element->a), value(f.element->b), num(f.element->abs_err),
                       num(f.element->rel_err));
  return fmt::format("DIVERGED: {} of {} datasets differ under {}; first divergence at {}: {}",
                     r.failed_datasets(), n, r.tolerance.describe(), where, what);
}

std::string report_text(const DiffResult& r, const TextReportOptions& options) {
  if (options.quiet) return verdict_line(r) + "\n";
  std::string out;
  out += fmt::format("A (candidate): {}\nB (reference): {}\n", side_text(r.a), side_text(r.b));
  out += fmt::format("tolerance: {}; an element differs when |A - B| > atol + rtol * |B|\n\n",
                     r.tolerance.describe());
  for (const auto& d : r.datasets)
    if (d.failed()) text_dataset(out, r, d, options.count);
  out += fmt::format("summary: {} datasets compared, {} differ\n", r.datasets.size(),
                     r.failed_datasets());
  text_metrics_table(out, r);
  out += '\n';
  out += verdict_line(r);
  out += '\n';
  return out;
}

json report_json(const DiffResult& r) {
  json first = nullptr;
  if (r.first_divergence) {
    const FirstDivergence& f = *r.first_divergence;
    first = {{"path", f.path},
             {"position", f.position},
             {"layer", json_layer(f.layer)},
             {"stage", name(f.stage)},
             {"status", status_name(f.status)},
             {"expert", f.expert ? json(*f.expert) : json(nullptr)},
             {"index", f.element ? json(f.element->index) : json(nullptr)},
             {"candidate", f.element ? json_number(f.element->a) : json(nullptr)},
             {"reference", f.element ? json_number(f.element->b) : json(nullptr)},
             {"abs_err", f.element ? json_number(f.element->abs_err) : json(nullptr)},
             {"rel_err", f.element ? json_number(f.element->rel_err) : json(nullptr)}};
  }
  json datasets = json::array();
  for (const auto& d : r.datasets) {
    const ValueComparison& v = d.values;
    const bool compared = d.status == DatasetStatus::Pass || d.status == DatasetStatus::Fail;
    const bool real = compared && !d.is_decision();
    auto metric = [&](double x) { return real ? json_number(x) : json(nullptr); };
    auto index = [&](size_t i) { return real ? json(i) : json(nullptr); };
    json experts = nullptr;
    if (!d.slot_experts.empty()) experts = d.slot_experts;
    json flip = nullptr;
    if (d.routing)
      flip = {{"slots", d.routing->slots},
              {"same_set", d.routing->same_set},
              {"margin", d.routing->margin ? json_number(*d.routing->margin) : json(nullptr)}};
    datasets.push_back({{"path", d.path},
                        {"position", d.key.position},
                        {"layer", json_layer(d.key.layer)},
                        {"stage", name(d.key.stage)},
                        {"order", d.key.order},
                        {"status", status_name(d.status)},
                        {"dims_a", d.dims_a},
                        {"dims_b", d.dims_b},
                        {"atol", d.tolerance.atol},
                        {"rtol", d.tolerance.rtol},
                        {"elements", compared ? json(v.elements) : json(nullptr)},
                        {"mismatches", compared ? json(v.mismatches) : json(nullptr)},
                        {"max_abs_err", metric(v.max_abs_err)},
                        {"max_abs_index", index(v.max_abs_index)},
                        {"max_rel_err", metric(v.max_rel_err)},
                        {"max_rel_index", index(v.max_rel_index)},
                        {"max_ulp", real ? json(v.max_ulp) : json(nullptr)},
                        {"cosine", metric(v.cosine)},
                        {"nmse", metric(v.nmse)},
                        {"tolerance_used", metric(v.tolerance_used)},
                        {"nonfinite_mismatches", real ? json(v.nonfinite_mismatches) : json(nullptr)},
                        {"experts", experts},
                        {"routing_flip", flip}});
  }
  return {{"verdict", r.diverged() ? "diverged" : "pass"},
          {"summary", {{"datasets", r.datasets.size()}, {"failed", r.failed_datasets()}}},
          {"first_divergence", first},
          {"tolerance", r.tolerance.to_json()},
          {"a", {{"file", r.a.file}, {"backend", r.a.backend}, {"precision", r.a.precision}}},
          {"b", {{"file", r.b.file}, {"backend", r.b.backend}, {"precision", r.b.precision}}},
          {"datasets", datasets}};
}

std::string report_junit(const DiffResult& r) {
  struct StageCase {
    size_t datasets = 0, failed = 0;
    const DatasetDiff* first_failure = nullptr;
    std::vector<const DatasetDiff*> failures;
  };
  std::map<Stage, StageCase> cases;
  for (const auto& d : r.datasets) {
    StageCase& c = cases[d.key.stage];
    ++c.datasets;
    if (!d.failed()) continue;
    ++c.failed;
    if (c.first_failure == nullptr) c.first_failure = &d;
    c.failures.push_back(&d);
  }
  size_t failures = 0, skipped = 0;
  for (const auto& s : kStages) {
    const auto it = cases.find(s.stage);
    if (it == cases.end()) ++skipped;
    else if (it->second.failed > 0) ++failures;
  }
  const std::string suite = fmt::format("parity-diff {} vs {}", r.a.file, r.b.file);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"parity-diff\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
                     "skipped=\"{}\">\n",
                     kNumStages, failures, skipped);
  out += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
                     "skipped=\"{}\" time=\"0\">\n",
                     xml_escape(suite), kNumStages, failures, skipped);
  out += "    <properties>\n";
  for (const auto& [key, val] : {std::pair<std::string, std::string>{"candidate", side_text(r.a)},
                                 {"reference", side_text(r.b)},
                                 {"tolerance", r.tolerance.describe()},
                                 {"verdict", verdict_line(r)}})
    out += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", key, xml_escape(val));
  out += "    </properties>\n";
  for (const auto& s : kStages) {
    out += fmt::format("    <testcase classname=\"parity.{}\" name=\"{}\" time=\"0\"", scope_name(s.scope),
                       s.name);
    const auto it = cases.find(s.stage);
    if (it == cases.end()) {
      out += fmt::format(">\n      <skipped message=\"no {} datasets in either trace\"/>\n    </testcase>\n",
                         s.name);
      continue;
    }
    const StageCase& c = it->second;
    if (c.failed == 0) {
      out += "/>\n";
      continue;
    }
    std::string details;
    for (const DatasetDiff* d : c.failures) details += failure_summary(r, *d) + "\n";
    out += fmt::format(">\n      <failure type=\"diverged\" message=\"{} ({} of {} datasets of stage {} "
                       "differ)\">{}</failure>\n    </testcase>\n",
                       xml_escape(failure_summary(r, *c.first_failure)), c.failed, c.datasets,
                       s.name, xml_escape(details));
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

std::string report_html(const DiffResult& r) {
  // Column 0 is model scope; column L + 1 is layer L.
  const int columns = r.num_layers + 1;
  std::vector<std::vector<Cell>> grid(size_t(kNumStages), std::vector<Cell>(static_cast<size_t>(columns)));
  for (const auto& d : r.datasets) {
    const int col = d.key.layer == kModelLayer ? 0 : d.key.layer + 1;
    if (col < 0 || col >= columns) continue;
    Cell& c = grid[size_t(d.key.stage)][size_t(col)];
    ++c.datasets;
    if (d.failed()) ++c.failed;
    const double sev = d.severity();
    if (sev > c.worst || c.worst_dataset == nullptr) {
      c.worst = sev;
      c.worst_dataset = &d;
    }
    if (r.first_divergence && r.first_divergence->path == d.path) c.first = true;
  }

  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += fmt::format("<title>parity-diff: {} vs {}</title>\n<style>{}</style>\n</head>\n<body>\n",
                     xml_escape(r.a.file), xml_escape(r.b.file), kHtmlStyle);
  out += "<h1>parity-diff</h1>\n";
  out += fmt::format("<p class=\"verdict {}\">{}</p>\n", r.diverged() ? "diverged" : "pass",
                     xml_escape(verdict_line(r)));
  out += "<table class=\"meta\">\n";
  out += fmt::format("<tr><th>A (candidate)</th><td>{}</td></tr>\n", xml_escape(side_text(r.a)));
  out += fmt::format("<tr><th>B (reference)</th><td>{}</td></tr>\n", xml_escape(side_text(r.b)));
  out += fmt::format("<tr><th>tolerance</th><td>{}; an element differs when |A &minus; B| &gt; "
                     "atol + rtol&middot;|B|</td></tr>\n",
                     xml_escape(r.tolerance.describe()));
  out += fmt::format("<tr><th>datasets</th><td>{} compared, {} differ</td></tr>\n</table>\n",
                     r.datasets.size(), r.failed_datasets());

  out += "<h2>Error heatmap</h2>\n<p>Each cell: the largest share of tolerance used over all "
         "positions, max |A&minus;B| / (atol + rtol&middot;|B|); 1 or more fails. The first "
         "divergence is outlined; hover a cell for details.</p>\n";
  out += "<p class=\"legend\"><span style=\"background:#e8f5e9\">&lt; 0.01</span>"
         "<span style=\"background:#c8e6c9\">&lt; 0.1</span>"
         "<span style=\"background:#fff9c4\">&lt; 0.5</span>"
         "<span style=\"background:#ffe082\">&le; 1</span>"
         "<span style=\"background:#ef9a9a\">&lt; 10</span>"
         "<span style=\"background:#e57373\">&lt; 100</span>"
         "<span style=\"background:#b71c1c;color:#fff\">&ge; 100, NaN, flip, missing</span></p>\n";
  out += "<table class=\"heat\">\n<tr><th class=\"stage\">stage</th><th>model</th>";
  for (int l = 0; l < r.num_layers; ++l) out += fmt::format("<th>L{}</th>", l);
  out += "</tr>\n";
  for (const auto& s : kStages) {
    out += fmt::format("<tr><th class=\"stage\">{}</th>", s.name);
    for (int col = 0; col < columns; ++col) {
      const Cell& c = grid[size_t(s.stage)][size_t(col)];
      if (c.datasets == 0) {
        out += "<td class=\"none\"></td>";
        continue;
      }
      const std::string where = col == 0 ? "model scope" : fmt::format("layer {}", col - 1);
      const DatasetDiff& worst = *c.worst_dataset;
      std::string title = fmt::format("{} {}: {} of {} datasets differ; largest tolerance used {} "
                                      "at position {}",
                                      s.name, where, c.failed, c.datasets, num(c.worst),
                                      worst.key.position);
      if (worst.failed()) title += "; " + failure_summary(r, worst);
      out += fmt::format("<td class=\"{}{}\" title=\"{}\">{}</td>", cell_class(c),
                         c.first ? " first" : "", xml_escape(title), xml_escape(cell_label(c)));
    }
    out += "</tr>\n";
  }
  out += "</table>\n";

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
                         xml_escape(failure_summary(r, d)));
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
    case ReportFormat::Json: return report_json(r).dump(2) + "\n";
    case ReportFormat::Junit: return report_junit(r);
    case ReportFormat::Html: return report_html(r);
  }
  return report_text(r, text_options);
}

}  // namespace parity
