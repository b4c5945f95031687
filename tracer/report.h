// Reports of a diff: h5diff-style text, JSON, JUnit XML (a testcase per stage) and a
// self-contained HTML page with an error heatmap (stages x layers).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tracer/differ.h"

namespace parity {

struct TextReportOptions {
  size_t count = 10;   // mismatching elements listed per dataset (at most what the diff kept)
  bool quiet = false;  // only the verdict line
};

// One line: "PASS: ..." or "DIVERGED: ... first divergence at ...".
std::string verdict_line(const DiffResult& r);
// h5diff-style: per failing dataset a header, a `position A B difference relative bound` table
// of its judged (local) error and "N differences found"; then a per-dataset table of local and
// accumulated error, their shares of the bound and the amplification; then the verdict line.
std::string report_text(const DiffResult& r, const TextReportOptions& options = {});
// {"verdict", "first_divergence", "criterion", "judged", "a", "b", "datasets": [...]}, each
// dataset with "local" and "accumulated" metrics; non-finite numbers are null.
nlohmann::json report_json(const DiffResult& r);
// One <testsuite>, one <testcase> per stage (aggregated over positions and layers); a stage fails
// when its judged (local) error exceeds the criterion somewhere, so one bug is one red testcase.
std::string report_junit(const DiffResult& r);
// A JUnit file for a run that failed before it had a verdict (bad input, an unreadable trace):
// one testcase with an <error> carrying the tool's error line, so CI shows why.
std::string junit_error(std::string_view tool, std::string_view message);
// One self-contained page (inline CSS, no script): summary, heatmaps of the share of the bound
// used per (stage, layer) by the local error (what decides) and by the accumulated error (drift),
// and the failing datasets.
std::string report_html(const DiffResult& r);

enum class ReportFormat { Text, Json, Junit, Html };
// "text", "json", "junit", "html"; throws parity::Error on anything else.
ReportFormat parse_report_format(std::string_view name);
// The report in the given format, as the text to write.
std::string render_report(const DiffResult& r, ReportFormat format,
                          const TextReportOptions& text_options = {});

}  // namespace parity
