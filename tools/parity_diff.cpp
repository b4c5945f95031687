// parity-diff: compare two gpt-oss-parity traces as h5diff does. A is the candidate, B the
// reference (relative error is taken against B). Reports per-dataset differences and the first
// divergence as text, JSON, JUnit or HTML. Exit 0 no differences, 1 differences, 2 error.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "model/error.h"
#include "model/untrusted.h"
#include "tools/common.h"
#include "tracer/differ.h"
#include "tracer/profiles.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

int diff_main(int argc, char** argv) {
  CLI::App app{
      "parity-diff: compare two gpt-oss-parity traces, as h5diff does.\n"
      "A is the candidate, B the reference. Each stage is judged by its local error (A's replay "
      "datasets: the stage re-run on B's inputs) against a per-element bound derived from B's "
      "values and A's precision; --profile or --atol/--rtol give a fixed |A - B| <= atol + "
      "rtol*|B| instead. A NaN/Inf on one side only always differs; a dataset missing on either "
      "side differs.\n"
      "Exit: 0 no differences, 1 differences, 2 error (unreadable or foreign file, different "
      "models)."};
  std::string a_path, b_path, report = "text", output;
  CriterionFlags cf;
  SelectionFlags sel;
  bool quiet = false;
  int count = 10;
  std::string precision;
  bool list_precisions = false;
  app.add_flag("--list-precisions", list_precisions,
               "print each precision preset as NAME and its policy (JSON), one per line, and exit");
  auto* o_a = app.add_option("A", a_path, "candidate trace (.h5)");
  auto* o_b = app.add_option("B", b_path, "reference trace (.h5); relative error is taken against B");
  app.add_option("OBJECTS", sel.paths,
                 "compare only these objects and what is under them (as h5diff): /pos_3, "
                 "/pos_3/layer_1, /pos_3/layer_1/qkv");
  add_criterion_options(app, cf,
                        "local (default when A has replay datasets) or accumulated: which error decides");
  add_selection_options(app, sel);
  app.add_option("--precision", precision,
                 "judge A as this precision preset (" + preset_list() +
                     "; default: the precision policy A declares)");
  app.add_option("--report", report, "report format: text, json, junit, html")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json", "junit", "html"}));
  app.add_option("-o,--output", output, "write the report to FILE (default: standard output)");
  app.add_flag("-q,--quiet", quiet, "print only the verdict line");
  bool across_runs = false;
  app.add_flag("--across-runs", across_runs,
               "compare traces of two runs (two machines, two days) of the same model, checkpoint "
               "and tokens; without it, traces of different runs are refused (one left beside "
               "another by an interrupted run). Two traces of one directory are refused even so");
  app.add_option("-n,--count", count, "mismatching elements listed per dataset")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000000));
  if (const auto done = parse_command_line(app, "parity-diff", argc, argv)) return *done;
  if (list_precisions) {
    for (std::string_view name : PrecisionPolicy::preset_names())
      std::cout << name << " " << PrecisionPolicy::preset(name).to_json().dump() << "\n";
    return kExitOk;
  }
  if (o_a->count() == 0 || o_b->count() == 0) fail("give the two traces A and B (--help)");

  Criterion criterion = criterion_from_flags(cf);
  if (!precision.empty()) criterion.policy = PrecisionPolicy::preset(precision);
  const DiffSelection selection = selection_from_flags(sel);
  const ReportFormat format = parse_report_format(report);
  // Before any work: a report that cannot be written is found now, and never hides the error
  // a JUnit report was asked to carry.
  if (!output.empty()) require_output_file_destination(output, "--output");

  // A JUnit report asked for is written even when the diff cannot run (an unreadable trace, a
  // mismatched pair): one error testcase with the error line, so CI shows why.
  const auto diff = [&] {
    const TraceReader a(a_path), b(b_path);
    DiffOptions options;
    options.max_listed = size_t(count);
    options.selection = selection;
    options.across_runs = across_runs;
    return diff_traces(a, b, criterion, options);
  };
  DiffResult result;
  try {
    result = diff();
  } catch (const Error& e) {
    if (format == ReportFormat::Junit && !output.empty())
      write_junit_error_file(output, "parity-diff", e);
    throw;
  }
  const TextReportOptions text_options{size_t(count), quiet};

  if (!output.empty()) {
    write_file_atomically(output, render_report(result, format, text_options));
    std::cout << verdict_line(result) << "\n";
  } else if (quiet) {
    std::cout << verdict_line(result) << "\n";
  } else {
    std::cout << render_report(result, format, text_options);
  }
  std::cout.flush();
  if (!std::cout) fail("standard output: write failed");
  return result.diverged() ? kExitDiverged : kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-diff", [&] { return parity::diff_main(argc, argv); });
}
