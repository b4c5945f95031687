// parity-trace: run the float64 reference and a candidate backend over one stage graph in
// lockstep, with every candidate stage also replayed on the reference's inputs, trace both into
// HDF5, diff them, and name the first stage whose own error exceeds its bound.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "device/runtime/options.h"
#include "model/error.h"
#include "model/lockstep.h"
#include "model/recompute.h"
#include "model/untrusted.h"
#include "tools/common.h"
#include "tools/version.h"
#include "tracer/capture_check.h"
#include "tracer/differ.h"
#include "tracer/escape.h"
#include "tracer/profiles.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

// The documented deterministic prefix of `--token T --pos P`: position i < P holds token
// (1 + 7919 i) mod V.
int32_t prefix_token(int i, int vocab) {
  return int32_t((1 + 7919ll * i) % vocab);
}

struct Phase {
  std::string name;
  double seconds;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string timing_text(const std::vector<Phase>& phases) {
  std::string timing;
  for (const auto& p : phases)
    timing += fmt::format("{}{} {:.3f} s", timing.empty() ? "" : ", ", p.name, p.seconds);
  return timing;
}

// The four reports of a run into `out` (and the JUnit one to junit_path when asked for): the
// text report followed by `extra` (what the run adds: the candidate, the timing), the JSON
// report with `json_extra` merged in and the phases' timing.
void write_reports(const fs::path& out, const DiffResult& result, const std::vector<Phase>& phases,
                   const std::string& extra, const nlohmann::json& json_extra,
                   const std::string& junit_path) {
  write_file_atomically((out / "report.txt").string(), report_text(result) + printable_text(extra));
  nlohmann::json j = report_json(result);
  j["timing_seconds"] = nlohmann::json::object();
  for (const auto& p : phases) j["timing_seconds"][p.name] = p.seconds;
  for (const auto& [key, value] : json_extra.items()) j[key] = value;
  write_file_atomically((out / "report.json").string(), json_text(j, 2) + "\n");
  write_file_atomically((out / "report.xml").string(), report_junit(result));
  write_file_atomically((out / "report.html").string(), report_html(result));
  if (!junit_path.empty()) write_file_atomically(junit_path, report_junit(result));
}

// "hip (arch=sm_90, ...)": the candidate and its facts, one line.
std::string candidate_line(const Backend& cand) {
  std::string facts_line;
  const nlohmann::json facts = cand.facts();
  for (const auto& [key, value] : facts.items())
    facts_line += fmt::format("{}{}={}", facts_line.empty() ? "" : ", ", key,
                              value.is_string() ? value.get<std::string>() : value.dump());
  return "candidate: " + cand.name() + (facts_line.empty() ? "" : " (" + facts_line + ")") + "\n";
}

// Text that came from a file or an argument (a capture's backend, a path), for the report text
// and the terminal: escaped as the reports escape it.
std::string shown(std::string_view untrusted) { return printable_text(untrusted); }

// The output directory belongs to one run at a time: two runs into one --out would read each
// other's traces. An advisory lock on DIR/.parity-trace.lock, held until the process ends.
class OutputLock {
 public:
  explicit OutputLock(const fs::path& dir) : path_((dir / ".parity-trace.lock").string()) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot create the lock file ({})", path_, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
      fail("{}: another parity-trace is writing into this directory; give each run its own --out",
           dir.string());
    }
  }
  ~OutputLock() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());  // still locked: a run starting now takes a new file
    ::close(fd_);
  }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// The files one run writes into --out (its traces and reports): those of an earlier run are
// removed when the run starts, so that nothing of it sits beside the new ones, and this run's
// are removed again unless it completes (keep()), so that an error leaves no half of a run;
// the directory too when the run created it and nothing else is in it. Other files in --out are
// never touched.
class RunOutputs {
 public:
  RunOutputs(const std::string& out, std::vector<std::string> names)
      : dir_(out), names_(std::move(names)) {
    std::error_code ec;
    created_ = !fs::exists(dir_, ec);
    fs::create_directories(dir_);
    lock_.emplace(dir_);
    for (const std::string& n : names_) fs::remove(dir_ / n);
  }
  RunOutputs(const RunOutputs&) = delete;
  RunOutputs& operator=(const RunOutputs&) = delete;
  ~RunOutputs() {
    if (kept_) return;
    std::error_code ec;
    for (const std::string& n : names_) fs::remove(dir_ / n, ec);
    lock_.reset();
    if (created_) fs::remove(dir_, ec);  // only when empty
  }
  fs::path path(const std::string& name) const { return dir_ / name; }
  void keep() { kept_ = true; }

 private:
  fs::path dir_;
  std::vector<std::string> names_;
  bool created_ = false, kept_ = false;
  std::optional<OutputLock> lock_;
};

const std::vector<std::string> kReports = {"report.txt", "report.json", "report.xml", "report.html"};

std::vector<std::string> with_reports(std::vector<std::string> traces) {
  traces.insert(traces.end(), kReports.begin(), kReports.end());
  return traces;
}

// What a run prints once its reports are written: the verdict, the run's extra lines, where the
// traces (`traces`, as the run names them) and the reports in `out` are, and a `next` line when
// given; every name escaped as untrusted text.
void print_outcome(const DiffResult& result, const std::string& extra, const std::string& traces,
                   const std::string& out, const std::string& next = "") {
  const fs::path dir(out);
  std::cout << verdict_line(result) << "\n"
            << shown(extra)
            << shown(fmt::format("traces: {}\nreports: {} (text), {} (JSON), {} (JUnit), {} (HTML)\n",
                                 traces, (dir / "report.txt").string(),
                                 (dir / "report.json").string(), (dir / "report.xml").string(),
                                 (dir / "report.html").string()))
            << (next.empty() ? "" : shown("next: " + next + "\n"));
}

// parity-trace --candidate-trace FILE: the reference on the capture's tokens and, from the
// capture's own inputs, every stage it recorded (model/recompute.h); then the diff, each stage
// judged by its local error where the capture holds its inputs.
int trace_capture(const TraceReader& capture, const std::string& model,
                  const std::string& models_dir, const std::vector<int32_t>& tokens_flag,
                  bool tokens_given, const Criterion& criterion, int step_rows,
                  const std::string& out, const std::string& junit_path) {
  std::vector<Phase> phases;
  auto t0 = std::chrono::steady_clock::now();
  const std::string& capture_path = capture.path();
  const TraceMeta& cm = capture.meta();
  auto m = Model::load(resolve_model(model, models_dir));
  const Config& c = m->config;
  phases.push_back({"load", since(t0)});
  // Everything about the capture is checked before anything is written.
  const CaptureCheck check = check_capture(capture, *m, tokens_given ? &tokens_flag : nullptr);
  const std::vector<int32_t>& tokens = cm.tokens;

  const std::vector<std::string> outputs = with_reports({"reference.h5"});
  for (const std::string& name : outputs) {
    std::error_code ec;
    const fs::path p = fs::path(out) / name;
    if (fs::exists(p, ec) && fs::equivalent(p, capture_path, ec))
      fail("{}: the capture would be overwritten by {}; give another --out", capture_path,
           p.string());
  }
  RunOutputs files(out, outputs);
  const fs::path ref_path = files.path("reference.h5");

  t0 = std::chrono::steady_clock::now();
  auto reference = make_backend("reference", *m);
  phases.push_back({"reference setup", since(t0)});
  // The capture's inputs are rounded to the storage it declares (or the one --precision names).
  const PrecisionPolicy policy =
      criterion.policy.value_or(cm.precision_policy.value_or(PrecisionPolicy::float32(4)));
  // A capture with KV-cache rows of positions 0..n-1 (/cache): the reference takes them as its
  // cache and runs from n on, recomputed rows only (long positions at the cost of one).
  const int prefix = check.cached;
  nlohmann::json run_facts = {{"candidate_trace", capture_path}, {"step_rows", step_rows}};
  if (prefix > 0) {
    t0 = std::chrono::steady_clock::now();
    reference->reset();
    for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
      KvRows rows = capture.cache_rows(layer);
      for (double& x : rows.k) x = round_to_storage(x, policy.at(Stage::k_rope).storage);
      for (double& x : rows.v) x = round_to_storage(x, policy.at(Stage::v).storage);
      reference->load_cache(kRecomputeSequence, layer, rows);
    }
    phases.push_back({"KV-cache rows of the capture", since(t0)});
    run_facts["reference_prefix"] =
        fmt::format("skipped: the capture's KV-cache rows of positions 0..{}", prefix - 1);
  }
  t0 = std::chrono::steady_clock::now();
  const RecomputeResult rr = trace_recompute(*reference, *m, capture, policy, step_rows,
                                             ref_path.string(), run_facts, prefix);
  phases.push_back({prefix > 0 ? "reference (recomputed rows)" : "reference (free and recomputed rows)",
                    rr.seconds});
  phases.push_back({"tracing", since(t0) - rr.seconds});

  t0 = std::chrono::steady_clock::now();
  const TraceReader b(ref_path.string());
  DiffOptions options;
  options.capture = true;
  Criterion judged_by = criterion;
  judged_by.policy = policy;
  DiffResult result = diff_traces(capture, b, judged_by, options);
  phases.push_back({"diff", since(t0)});
  if (result.datasets.size() == result.not_captured)
    fail("{}: none of the capture's datasets is one the reference traced", capture_path);

  std::string extra = fmt::format("candidate: capture {} ({}, {}); {} tokens\n", capture_path,
                                  cm.backend, cm.precision, tokens.size());
  if (cm.fingerprint.empty())
    extra += "checkpoint: the capture records no fingerprint; only its config was checked\n";
  extra += "timing: " + timing_text(phases) + "\n";
  write_reports(out, result, phases, extra,
                {{"candidate_backend", cm.backend},
                 {"candidate_trace", capture_path},
                 {"tokens", tokens}},
                junit_path);
  files.keep();
  print_outcome(result, extra,
                fmt::format("{} (capture), {} (reference)", capture_path, ref_path.string()), out);
  return result.diverged() ? kExitDiverged : kExitOk;
}

// parity-trace --token T --pos P --skip-reference-prefix: the candidate runs the prefix alone and
// hands its KV-cache rows to the reference, which recomputes every stage at P from the
// candidate's own rows (model/recompute.h): P is judged by its local error, at the cost of one
// position for the reference whatever P is; there is no accumulated error.
int trace_skipping_prefix(const Model& m, Backend& cand, const std::vector<int32_t>& prompt,
                          const Injection* inj, int step_rows, const Criterion& criterion,
                          const std::string& out, const std::string& junit_path,
                          std::vector<Phase> phases) {
  const int pos = int(prompt.size()) - 1;
  RunOutputs files(out, with_reports({"reference.h5", "candidate.h5"}));
  const fs::path ref_path = files.path("reference.h5"), cand_path = files.path("candidate.h5");
  const nlohmann::json run_facts = {
      {"replay", false},
      {"step_rows", step_rows},
      {"reference_prefix",
       fmt::format("skipped: the candidate's KV-cache rows of positions 0..{}", pos - 1)},
      {"injected_fault", inj ? nlohmann::json(inj->str()) : nlohmann::json(nullptr)}};
  TraceMeta cand_meta = trace_meta(cand, m);
  cand_meta.run = run_facts;
  cand_meta.run_id = new_run_id();
  if (inj != nullptr) cand_meta.device["injected_fault"] = inj->str();

  // The candidate: the prefix untraced, in steps, then position P traced.
  auto t0 = std::chrono::steady_clock::now();
  {
    TraceWriter writer(cand_path.string(), cand_meta, {pos});
    cand.reset();
    for (int first = 0; first < pos; first += step_rows) {
      Batch b;
      for (int i = first; i < std::min(pos, first + step_rows); ++i) {
        b.tokens.push_back(prompt[size_t(i)]);
        b.positions.push_back(i);
        b.seqs.push_back(0);
      }
      forward(cand, b, nullptr, inj);
    }
    phases.push_back({"candidate prefix (" + cand.name() + ")", since(t0)});
    t0 = std::chrono::steady_clock::now();
    forward(cand, Batch::single(prompt[size_t(pos)], pos), &writer, inj);
    writer.set_tokens(prompt, positions_of(prompt.size()));
    writer.finish();
    phases.push_back({"candidate at the position, traced", since(t0)});
  }

  // Its KV cache, handed to the reference's recompute sequence layer by layer.
  t0 = std::chrono::steady_clock::now();
  auto reference = make_backend("reference", m);
  reference->reset();
  for (int layer = 0; layer < m.config.num_hidden_layers && pos > 0; ++layer) {
    const auto rows = cand.cache_rows(0, layer, 0, pos);
    if (!rows) fail("candidate {} cannot hand over its KV cache (--skip-reference-prefix)", cand.name());
    reference->load_cache(kRecomputeSequence, layer, *rows);
  }
  phases.push_back({"KV-cache handover", since(t0)});

  const TraceReader a(cand_path.string());
  t0 = std::chrono::steady_clock::now();
  trace_recompute(*reference, m, a, criterion.policy.value_or(cand.precision_policy()), step_rows,
                  ref_path.string(), run_facts, pos);
  phases.push_back({"reference at the position (recomputed)", since(t0)});

  t0 = std::chrono::steady_clock::now();
  const TraceReader b(ref_path.string());
  DiffResult result = diff_traces(a, b, criterion);
  phases.push_back({"diff", since(t0)});

  std::string extra = candidate_line(cand);
  extra += fmt::format("reference: skipped the prefix; recomputed position {} from the "
                       "candidate's own rows and KV cache (local error only)\n",
                       pos);
  extra += "timing: " + timing_text(phases) + "\n";
  nlohmann::json json_extra = {{"candidate_backend", cand.name()},
                               {"candidate_facts", cand.facts()},
                               {"reference_prefix", "skipped"},
                               {"position", pos}};
  if (inj) json_extra["injected_fault"] = inj->str();
  write_reports(out, result, phases, extra, json_extra, junit_path);
  files.keep();
  print_outcome(result, extra, fmt::format("{}, {}", ref_path.string(), cand_path.string()), out);
  return result.diverged() ? kExitDiverged : kExitOk;
}

int trace_main(int argc, char** argv) {
  CLI::App app{
      "parity-trace: run the float64 reference and a candidate backend over one stage graph in "
      "lockstep, trace both into HDF5, replay every candidate stage on the reference's inputs, "
      "and name the first stage whose own (local) error exceeds its derived bound.\n"
      "Exit: 0 within the bounds, 1 diverged, 2 error."};
  std::string model = "tiny", models_dir, candidate, inject_text, out, junit_path;
  std::vector<int32_t> tokens;
  int token = -1, pos = -1, step_rows = 64, generate = 0;
  CriterionFlags cf;
  bool no_replay = false, free_run = false, skip_prefix = false;
  app.add_option("--model", model, "checkpoint directory, or preset tiny|20b|120b")
      ->capture_default_str();
  app.add_option("--models-dir", models_dir,
                 "where presets live (default $PARITY_MODELS_DIR, else ./models)");
  auto* o_tokens = add_token_list_option(
      app, "--tokens", tokens, "comma-separated token ids at positions 0,1,...; all traced");
  auto* o_token = app.add_option(
      "--token", token, "trace this token id at --pos, after the prefix (1 + 7919 i) mod vocab");
  auto* o_pos = app.add_option("--pos", pos, "position of --token");
  o_tokens->excludes(o_token)->excludes(o_pos);
  o_token->needs(o_pos);
  o_pos->needs(o_token);
  app.add_option(
      "--candidate", candidate,
      "candidate backend: cpu-f32, hip (also cuda, gpu), reference (default: hip with a GPU, "
      "else cpu-f32)");
  app.add_option("--inject", inject_text,
                 "fault injection on the candidate: STAGE:LAYER[:add|nan|zero], or STAGE[:MODE] at "
                 "model scope");
  add_decimal_option(app, "--generate", generate,
                     "after the prompt, N greedy decode steps on both sides; the sampled token is "
                     "a traced decision",
                     0);
  app.add_flag("--free-run", free_run,
               "generated tokens follow the candidate's argmax (default: the reference's); both "
               "sides always see the same tokens");
  app.add_flag("--no-replay", no_replay,
               "do not replay the candidate's stages on the reference's inputs (then only the "
               "accumulated error is known, and drift can look like divergence)");
  add_criterion_options(app, cf, "local (default with replay) or accumulated: which error decides");
  app.add_flag("--skip-reference-prefix", skip_prefix,
               "with --token T --pos P: the reference does not run the prefix; the candidate does, "
               "and hands its KV-cache rows over; every stage at P is recomputed by the reference "
               "from the candidate's own rows and judged by that local error (no accumulated "
               "error): long positions at the cost of one");
  app.add_option("--step", step_rows, "prompt rows per forward step (prefill batch size)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--out", out,
                 "output directory for reference.h5, candidate.h5 and the reports (report.txt, "
                 ".json, .xml (JUnit), .html)")
      ->required();
  int tensor_parallel = 1;
  add_decimal_option(
      app, "--tensor-parallel", tensor_parallel,
      "with --candidate hip: split the model over N GPUs as `run --tensor-parallel N` does (its "
      "heads, its experts' intermediate columns, its vocabulary); every stage's rows are gathered "
      "from the ranks into the reference's shape, each rank's partial sums before an all-reduce "
      "are traced (/partials), and a divergence names the rank behind it",
      1);
  std::string candidate_trace, precision;
  auto* o_precision = app.add_option(
      "--precision", precision,
      "with --candidate hip: the device's precision of the products, fp32 (exact) or bf16 (each "
      "product's input rounded once to BF16, FP32 accumulation; the bf16-operands preset); "
      "default PARITY_DEVICE_PRECISION, else fp32. With --candidate-trace: judge the capture as "
      "this precision preset (" +
          preset_list() + "; default: the one it declares)");
  auto* o_capture = app.add_option(
      "--candidate-trace", candidate_trace,
      "diff a capture of your own port (parity_capture.h, python/parity_capture) instead of "
      "running "
      "a candidate: the reference runs on the capture's tokens (--tokens, if given, must match "
      "them); stages the port did not capture are listed as not captured");
  o_capture->excludes(o_token)->excludes(o_pos);
  app.add_option("--junit", junit_path,
                 "also write the JUnit report to FILE; on an error, a JUnit file whose one "
                 "testcase carries the error line");
  if (const auto done = parse_command_line(app, "parity-trace", argc, argv)) return *done;
  // Before any work: a JUnit file that cannot be written is found now, not after the run (one
  // in --out itself, which the run creates, is written there).
  if (!junit_path.empty() &&
      fs::path(junit_path).parent_path().lexically_normal() != fs::path(out).lexically_normal())
    require_output_file_destination(junit_path, "--junit");
  // Everything after the command line runs here, so that an error can still leave the JUnit
  // file asked for, with the error line in it.
  const auto run = [&]() -> int {
    if (o_capture->count() > 0) {
      for (const char* flag : {"--candidate", "--inject", "--generate", "--free-run", "--no-replay",
                               "--tensor-parallel"})
        if (app.get_option(flag)->count() > 0)
          fail("{} does not apply to --candidate-trace (the capture is the candidate)", flag);
      // Refuses a truncated or foreign file, or one that is not a capture, naming it.
      const TraceReader capture(candidate_trace, TraceKind::capture);
      Criterion criterion = criterion_from_flags(cf);
      if (o_precision->count() > 0) criterion.policy = PrecisionPolicy::preset(precision);
      return trace_capture(capture, model, models_dir, tokens, o_tokens->count() > 0, criterion,
                           step_rows, out, junit_path);
    }
    // --precision with a candidate: the device backend's precision of the products.
    std::optional<device::Precision> device_precision;
    if (o_precision->count() > 0)
      device_precision = device::parse_precision(precision, "--precision");
    if (o_tokens->count() == 0 && o_token->count() == 0)
      fail("give --tokens t0,t1,... or --token T --pos P");
    if (candidate.empty()) candidate = default_candidate();
    if (device_precision && !is_device_backend(candidate))
      fail(
          "--precision applies to --candidate hip (the device's precision of the products) and "
          "to --candidate-trace (the precision a capture is judged as), not to --candidate {}",
          quoted(candidate, 40));

    // The criterion, checked before any work.
    const Criterion criterion = criterion_from_flags(cf);
    if (criterion.judge == Judge::local && no_replay && !skip_prefix)
      fail("--judge local needs the replay that --no-replay turns off");
    if (skip_prefix) {
      if (o_token->count() == 0) fail("--skip-reference-prefix needs --token T --pos P");
      for (const char* flag : {"--generate", "--free-run"})
        if (app.get_option(flag)->count() > 0)
          fail("{} does not apply to --skip-reference-prefix (one traced position)", flag);
      if (criterion.judge == Judge::accumulated)
        fail("--judge accumulated: with --skip-reference-prefix the reference has no rows of its "
             "own, only the local error exists");
    }

    std::vector<Phase> phases;
    auto t0 = std::chrono::steady_clock::now();
    auto m = Model::load(resolve_model(model, models_dir));
    const Config& c = m->config;
    phases.push_back({"load", since(t0)});

    LockstepOptions lo;
    if (o_tokens->count() > 0) {
      lo.prompt = tokens;
      if (lo.prompt.empty()) fail("--tokens: no tokens given");
      for (size_t i = 0; i < lo.prompt.size(); ++i) lo.traced.insert(int(i));
    } else {
      if (pos < 0) fail("--pos {}: positions start at 0", pos);
      if (int64_t(pos) >= c.max_position_embeddings)
        fail("--pos {}: past the context of {} ({} positions)", pos, m->dir,
             c.max_position_embeddings);
      for (int i = 0; i < pos; ++i) lo.prompt.push_back(prefix_token(i, c.vocab_size));
      lo.prompt.push_back(token);
      lo.traced.insert(pos);
    }
    for (size_t i = 0; i < lo.prompt.size(); ++i)
      if (lo.prompt[i] < 0 || lo.prompt[i] >= c.vocab_size)
        fail("token id {} at position {} is out of range for {} (vocabulary 0..{})", lo.prompt[i], i,
             m->dir, c.vocab_size - 1);
    if (int64_t(lo.prompt.size()) > c.max_position_embeddings)
      fail("position {} is past the context of {} ({} positions)", lo.prompt.size() - 1, m->dir,
           c.max_position_embeddings);
    lo.step_rows = step_rows;
    // On a terminal, positions done and the time left, redrawn at most ten times a second.
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    const auto started = std::chrono::steady_clock::now();
    auto last_drawn = started;
    if (tty)
      lo.progress = [&](int done, int total) {
        const auto now = std::chrono::steady_clock::now();
        if (done < total && now - last_drawn < std::chrono::milliseconds(100)) return;
        last_drawn = now;
        const double spent = std::chrono::duration<double>(now - started).count();
        const double left = done > 0 ? spent * double(total - done) / double(done) : 0.0;
        std::cerr << fmt::format("\rparity-trace: position {} of {}, {:.0f} s, about {:.0f} s left   ",
                                 done, total, spent, left)
                  << (done == total ? "\n" : "") << std::flush;
      };
    lo.replay = !no_replay;
    lo.generate = generate;
    lo.free_run = free_run;

    std::optional<Injection> inj;
    if (!inject_text.empty()) inj = Injection::parse(inject_text, c);
    lo.injection = inj ? &*inj : nullptr;

    if (skip_prefix) {
      t0 = std::chrono::steady_clock::now();
      // A device cache as long as the prompt (its default is 4,096 positions).
      auto cand = make_batched_backend(candidate, *m, 1, int(lo.prompt.size()), device_precision,
                                       tensor_parallel);
      phases.push_back({"candidate setup (" + cand->name() + ")", since(t0)});
      return trace_skipping_prefix(*m, *cand, lo.prompt, lo.injection, step_rows, criterion, out,
                                   junit_path, phases);
    }
    t0 = std::chrono::steady_clock::now();
    auto reference = make_backend("reference", *m);
    phases.push_back({"reference setup", since(t0)});
    t0 = std::chrono::steady_clock::now();
    // The device backend uploads the weights here.
    auto cand = make_backend(candidate, *m, device_precision, tensor_parallel);
    phases.push_back({"candidate setup (" + cand->name() + ")", since(t0)});
    check_lockstep(lo, *reference, *cand);

    // Nothing of an earlier run may sit beside the new one, and a run that dies half way
    // leaves nothing of itself.
    RunOutputs files(out, with_reports({"reference.h5", "candidate.h5"}));
    const fs::path ref_path = files.path("reference.h5"), cand_path = files.path("candidate.h5");

    const nlohmann::json run_facts = {{"replay", lo.replay},
                                      {"generate", lo.generate},
                                      {"free_run", lo.free_run},
                                      {"step_rows", lo.step_rows},
                                      {"injected_fault", inj ? nlohmann::json(inj->str()) : nlohmann::json(nullptr)}};
    t0 = std::chrono::steady_clock::now();
    const LockstepResult run = trace_lockstep(*reference, *cand, *m, lo, ref_path.string(),
                                              cand_path.string(), run_facts);
    const double run_seconds = since(t0);
    phases.push_back({"reference", run.reference_seconds});
    phases.push_back({"candidate (" + cand->name() + (lo.replay ? ", with replay rows" : "") + ")",
                      run.candidate_seconds});
    if (lo.replay) phases.push_back({"replay forcing", run.forcing_seconds});
    // Tracing: reading and writing the traced rows, and finishing the files.
    phases.push_back({"tracing", run_seconds - run.reference_seconds - run.candidate_seconds -
                                     run.forcing_seconds});

    t0 = std::chrono::steady_clock::now();
    TraceReader a(cand_path.string()), b(ref_path.string());
    DiffResult result = diff_traces(a, b, criterion);
    phases.push_back({"diff", since(t0)});

    std::string generated;
    nlohmann::json generated_json = nlohmann::json::array();
    for (size_t i = lo.prompt.size(); i < run.tokens.size(); ++i) {
      generated += (generated.empty() ? "" : ",") + std::to_string(run.tokens[i]);
      generated_json.push_back(run.tokens[i]);
    }
    std::string extra = candidate_line(*cand);
    if (lo.generate > 0)
      extra += fmt::format("generated ({}): {}\n", lo.free_run ? "the candidate's tokens" : "the reference's tokens", generated);
    extra += "timing: " + timing_text(phases) + "\n";
    nlohmann::json json_extra = {{"candidate_backend", cand->name()},
                                 {"candidate_facts", cand->facts()},
                                 {"tokens", run.tokens},
                                 {"generated", generated_json}};
    if (inj) json_extra["injected_fault"] = inj->str();
    write_reports(out, result, phases, extra, json_extra, junit_path);
    files.keep();
    print_outcome(result, extra, fmt::format("{}, {}", ref_path.string(), cand_path.string()), out,
                  fmt::format("open the HTML report; `parity-diff {} {} --judge accumulated` "
                              "shows the drift; --inject STAGE:LAYER proves the harness finds a "
                              "fault there",
                              cand_path.string(), ref_path.string()));
    return result.diverged() ? kExitDiverged : kExitOk;
  };
  try {
    return run();
  } catch (const Error& e) {
    if (!junit_path.empty()) write_junit_error_file(junit_path, "parity-trace", e);
    throw;
  }
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-trace", [&] { return parity::trace_main(argc, argv); });
}
