#include "tools/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "device/runtime/options.h"
#include "device/runtime/shard_plan.h"
#include "model/error.h"
#include "model/synth.h"
#include "model/untrusted.h"
#include "reference/cpu_backend.h"
#include "tools/version.h"
#include "tracer/report.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#include "device/runtime/device.h"
#endif

namespace parity {
namespace fs = std::filesystem;

std::string resolve_model(const std::string& model, const std::string& models_dir_flag) {
  if (model.empty()) fail("--model: empty");
  const bool is_preset = model == "tiny" || model == "20b" || model == "120b";
  if (!is_preset || fs::is_directory(model)) {
    if (fs::is_regular_file(model))
      fail("{}: is a file; the model is the checkpoint directory that holds it ({})", model,
           fs::absolute(model).parent_path().string());
    if (!fs::is_directory(model))
      fail("{}: no such checkpoint directory (and not a preset: tiny, 20b, 120b)", model);
    return model;
  }
  std::string dir = models_dir_flag;
  if (dir.empty()) {
    const char* env = std::getenv("PARITY_MODELS_DIR");
    dir = env != nullptr && *env != 0 ? env : "models";
  }
  const fs::path path = fs::path(dir) / model;
  if (fs::exists(path / "config.json")) return path.string();
  if (model == "tiny") {
    // Synthesized on first use: deterministic, a few hundred kB, about a second.
    // Written beside and renamed into place, so concurrent first uses never see half a model.
    const fs::path tmp = fs::path(dir) / fmt::format(".tiny.tmp-{}", ::getpid());
    fs::create_directories(tmp);
    write_synthetic_checkpoint(synth_preset("tiny"), tmp.string(), false);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) fs::remove_all(tmp);  // another process won the race; its copy is identical
    if (!fs::exists(path / "config.json")) fail("{}: could not create the tiny model", path.string());
    return path.string();
  }
  fail("model preset {} not found at {} (HINT: put a checkpoint there, point --models-dir or "
       "PARITY_MODELS_DIR at its parent, or write a synthetic one with `parity-synth --preset {} "
       "--out {}`)",
       model, path.string(), model, path.string());
}

namespace {
// The device backend is written in HIP and runs on AMD and NVIDIA: cuda and gpu name it too.
std::string backend_name(const std::string& name_given) {
  return name_given == "cuda" || name_given == "gpu" ? "hip" : name_given;
}

// A host backend's products are float32 (cpu-f32) or float64 (reference): fp32 alone.
void check_backend_precision(const std::string& backend, device::Precision p) {
  if (p != device::Precision::fp32 && !is_device_backend(backend))
    fail(
        "--precision {}: a precision of the device backend (--backend hip), not of {} (the host "
        "backends compute in float32 or float64)",
        device::precision_name(p), quoted(backend, 40));
}
}  // namespace

bool is_device_backend(const std::string& name) {
  return backend_name(name) == "hip";
}

device::Precision backend_precision_option(const std::string& name, const std::string& backend) {
  const device::Precision p = device::parse_precision(name, "--precision");
  check_backend_precision(backend, p);
  return p;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model,
                                      std::optional<device::Precision> precision,
                                      int tensor_parallel) {
  // 0 sequences, 0 positions: the environment's sizes as they are.
  return make_batched_backend(name, model, 0, 0, precision, tensor_parallel);
}

std::unique_ptr<Backend> make_batched_backend(const std::string& name_given, const Model& model,
                                              int sequences, int context,
                                              std::optional<device::Precision> precision,
                                              int tensor_parallel) {
  const std::string name = backend_name(name_given);
  if (precision) check_backend_precision(name_given, *precision);
  if (tensor_parallel < 1) fail("--tensor-parallel {}: give 1 or more GPUs", tensor_parallel);
  if (tensor_parallel > 1) {
    if (name != "hip")
      fail("--tensor-parallel {}: the device backend's (--candidate hip), not {}'s",
           tensor_parallel, quoted(name_given, 40));
#ifdef PARITY_HAVE_DEVICE
    if (const int gpus = device_count(); tensor_parallel > gpus)
      fail("--tensor-parallel {} takes {} GPUs, but this host has {}", tensor_parallel,
           tensor_parallel, gpus);
#endif
    if (const std::string why = device::tensor_parallel_problem(
            model.config, tensor_parallel, device::ExpertSplit::by_intermediate);
        !why.empty())
      fail("--tensor-parallel {}: {}: {}", tensor_parallel, model.dir, why);
  }
  if (name == "reference") return make_reference_backend(model);
  if (name == "cpu-f32") return make_cpu_f32_backend(model);
#ifdef PARITY_HAVE_DEVICE
  if (name == "hip") {
    device::DeviceOptions o = device::device_options_from_environment();
    if (o.max_context == 0) o.max_context = context;
    if (o.kv_sequences > 0) o.kv_sequences = std::max(o.kv_sequences, sequences);
    if (precision) o.precision = *precision;
    if (tensor_parallel == 1) return make_hip_backend(model, o);
    std::vector<int> devices(static_cast<size_t>(tensor_parallel));
    for (int r = 0; r < tensor_parallel; ++r) devices[size_t(r)] = r;
    return make_hip_group_backend(model, o, devices);
  }
#else
  (void)sequences;
  (void)context;
#endif
  if (name == "hip")
    fail("backend {}: this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)",
         name_given);
  fail("unknown backend {} (reference, cpu-f32, hip; cuda and gpu are names of hip)",
       quoted(name_given, 40));
}

std::string default_candidate() {
#ifdef PARITY_HAVE_DEVICE
  if (device_available()) return "hip";
#endif
  return "cpu-f32";
}

namespace {
// An error line stays one line of bounded length whatever it quotes (a file name with a
// newline, a 100 KB argument).
std::string error_line(const char* tool, std::string_view what) {
  return fmt::format("{}: error: {}", tool, one_line(what, 2000));
}
}  // namespace

void prefer_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

int guarded_main(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << error_line(tool, e.what()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << error_line(tool, e.what()) << "\n";
  }
  return kExitError;
}

std::optional<int> parse_command_line(CLI::App& app, const char* tool, int argc, char** argv) {
  app.set_version_flag("--version", fmt::format("{} {} (commit {}; {})", tool, PARITY_VERSION,
                                                PARITY_COMMIT, PARITY_BUILD));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e);
      return kExitOk;
    }
    std::cerr << error_line(tool, std::string(e.what()) + " (see --help)") << "\n";
    return kExitError;
  }
  return std::nullopt;
}

std::string iso8601_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string default_golden_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "gpt-oss-parity" / "golden";
    if (fs::is_directory(installed, ec)) return installed.string();
  }
  return PARITY_SOURCE_GOLDEN_DIR;
}

void write_file_atomically(const std::string& path, std::string_view text) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (fs::is_directory(st)) fail("{}: is a directory; give a file name to write to", path);
    if (!fs::is_regular_file(st)) fail("{}: exists and is not a regular file; not replacing it", path);
  }
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  auto give_up = [&](const std::string& what) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail("{}: {}", path, what);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) give_up(fmt::format("cannot create {} ({})", tmp, std::strerror(errno)));
    out.write(text.data(), std::streamsize(text.size()));
    out.flush();
    if (!out) give_up(fmt::format("writing failed ({})", std::strerror(errno)));
    out.close();
    if (!out) give_up(fmt::format("writing failed ({})", std::strerror(errno)));
  }
  fs::rename(tmp, path, ec);
  if (ec) give_up(fmt::format("cannot move {} into place ({})", tmp, ec.message()));
}

void require_output_file_destination(const std::string& path, std::string_view option) {
  if (path.empty()) fail("{}: an empty file name", option);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (fs::is_directory(st)) fail("{} {}: is a directory; give a file name to write to", option, path);
    if (!fs::is_regular_file(st))
      fail("{} {}: exists and is not a regular file; not replacing it", option, path);
    return;
  }
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;  // the current directory
  const fs::file_status dir = fs::status(parent, ec);
  if (!fs::exists(dir)) fail("{} {}: no directory {} to write it in", option, path, parent.string());
  if (!fs::is_directory(dir)) fail("{} {}: {} is not a directory", option, path, parent.string());
}

void write_junit_error_file(const std::string& path, const char* tool, const Error& error) {
  try {
    write_file_atomically(path, junit_error(tool, fmt::format("{}: error: {}", tool,
                                                              one_line(error.what(), 2000))));
  } catch (const Error& junit) {
    throw Error(fmt::format("{} (and the JUnit file could not be written: {})", error.what(),
                            junit.what()));
  }
}

TraceMeta trace_meta(const Backend& backend, const Model& model) {
  TraceMeta meta;
  meta.backend = backend.name();
  meta.precision = backend.precision();
  meta.precision_policy = backend.precision_policy();
  meta.config = model.config.to_json();
  meta.fingerprint = model.fingerprint;
  meta.model_dir = model.dir;
  meta.tool_version = PARITY_VERSION;
  meta.commit = PARITY_COMMIT;
  meta.device = backend.facts();
  meta.created = iso8601_now();
  return meta;
}

std::vector<int32_t> positions_of(size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = int32_t(i);
  return p;
}

RecomputeResult trace_recompute(Backend& reference, const Model& model, const TraceReader& candidate,
                                const PrecisionPolicy& policy, int step_rows,
                                const std::string& reference_path, nlohmann::json run_facts,
                                int first_position) {
  const TraceMeta& cm = candidate.meta();
  std::set<int> positions;
  for (const auto& e : candidate.entries()) positions.insert(e.key.position);
  TraceMeta meta = trace_meta(reference, model);
  meta.run_id = cm.run_id.empty() ? new_run_id() : cm.run_id;
  TraceWriter writer(reference_path, meta, positions);
  RecomputeOptions ro;
  ro.tokens = cm.tokens;
  ro.traced = positions;
  ro.step_rows = step_rows;
  ro.policy = policy;
  ro.first_position = first_position;
  ro.free_rows = first_position == 0;
  const TraceCandidateRows rows(candidate);
  const RecomputeResult rr = run_recompute(reference, rows, writer, ro);
  run_facts["recompute"] = {{"precision", policy.to_json()},
                            {"input_values", rr.input_values},
                            {"not_in_storage", rr.not_in_storage},
                            {"first_not_in_storage", rr.first_not_in_storage},
                            {"bfloat16_values", rr.bfloat16_values},
                            {"seconds", rr.seconds}};
  writer.set_run(std::move(run_facts));
  writer.set_tokens(cm.tokens, positions_of(cm.tokens.size()));
  writer.finish();
  return rr;
}

LockstepResult trace_lockstep(Backend& reference, Backend& candidate, const Model& model,
                              const LockstepOptions& options, const std::string& reference_path,
                              const std::string& candidate_path, const nlohmann::json& run_facts) {
  TraceMeta ref_meta = trace_meta(reference, model), cand_meta = trace_meta(candidate, model);
  ref_meta.run = cand_meta.run = run_facts;
  ref_meta.run_id = cand_meta.run_id = new_run_id();
  cand_meta.replay = options.replay;
  if (options.injection != nullptr) cand_meta.device["injected_fault"] = options.injection->str();
  TraceWriter ref_writer(reference_path, ref_meta);
  TraceWriter cand_writer(candidate_path, cand_meta);
  LockstepResult run = run_lockstep(reference, candidate, &ref_writer, &cand_writer, options);
  const std::vector<int32_t> positions = positions_of(run.tokens.size());
  ref_writer.set_tokens(run.tokens, positions);
  cand_writer.set_tokens(run.tokens, positions);
  ref_writer.finish();
  cand_writer.finish();
  return run;
}

Criterion criterion_from_flags(const CriterionFlags& f) {
  Criterion criterion;
  if (f.explicit_abs_rel || !f.profile.empty() || f.tolerance != "derived") {
    Tolerance tol = f.explicit_abs_rel
                        ? Tolerance::absolute_relative(f.atol, f.rtol)
                        : tolerance_profile(f.profile.empty() ? f.tolerance : f.profile);
    for (const auto& text : f.stage_tolerances) {
      const auto [stage, t] = parse_stage_tolerance(text);
      tol.set_override(stage, t);
    }
    criterion = Criterion::fixed(tol);
  } else {
    if (!f.stage_tolerances.empty())
      fail("--stage-tol sets a fixed tolerance: give it with --profile or --atol/--rtol");
    if (!(std::isfinite(f.lambda) && f.lambda > 0)) fail("--lambda {}: must be positive", f.lambda);
    if (!(std::isfinite(f.safety) && f.safety > 0))
      fail("--bound-safety {}: must be positive", f.safety);
    BoundOptions bo;
    bo.lambda = f.lambda;
    bo.safety = f.safety;
    criterion = Criterion::derived(bo);
  }
  if (!f.judge.empty()) {
    if (f.judge != "local" && f.judge != "accumulated")
      fail("--judge {}: local or accumulated", f.judge);
    criterion.judge = f.judge == "local" ? Judge::local : Judge::accumulated;
  }
  return criterion;
}

void add_criterion_options(CLI::App& app, CriterionFlags& cf, const std::string& judge_help) {
  auto* o_atol = app.add_option("--atol", cf.atol,
                                "fixed absolute tolerance (with --rtol; replaces the derived bounds)")
                     ->each([&cf](const std::string&) { cf.explicit_abs_rel = true; });
  auto* o_rtol = app.add_option("--rtol", cf.rtol, "fixed relative tolerance (with --atol)");
  o_atol->needs(o_rtol);
  o_rtol->needs(o_atol);
  auto* o_tol = app.add_option("--tolerance", cf.tolerance,
                               "derived (per-element bounds from the reference and the candidate's "
                               "precision) or a fixed profile name: " + profile_names())
                    ->capture_default_str();
  app.add_option("--profile", cf.profile, "a fixed tolerance profile: " + profile_names())
      ->excludes(o_atol)
      ->excludes(o_rtol)
      ->excludes(o_tol);
  o_tol->excludes(o_atol);
  app.add_option("--stage-tol", cf.stage_tolerances,
                 "per-stage fixed tolerance STAGE=ATOL,RTOL (repeatable, with --profile or "
                 "--atol/--rtol), e.g. logits=1e-4,1e-3");
  app.add_option("--lambda", cf.lambda, "probabilistic factor of the derived bounds of sums")
      ->capture_default_str();
  app.add_option("--bound-safety", cf.safety, "multiplies every derived bound")->capture_default_str();
  app.add_option("--judge", cf.judge, judge_help)->check(CLI::IsMember({"local", "accumulated"}));
}

namespace {
std::string stage_names_text() {
  std::string names;
  for (const auto& s : kStages) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}
}  // namespace

CLI::Option* add_token_list_option(CLI::App& app, const std::string& name,
                                   std::vector<int32_t>& tokens, const std::string& help) {
  // The raw arguments, split here rather than by CLI11's delimiter (which drops empty parts, so
  // "1,,2" would pass as 1,2), each part read as a decimal int32 with std::from_chars: CLI11's
  // integer conversion reads a leading 0 as octal ("051" became 41; found by fuzz/cli_fuzz.cpp)
  // and takes 0x and 0b prefixes, and a token id is a decimal number.
  return app.add_option_function<std::vector<std::string>>(
      name,
      [&tokens, name](const std::vector<std::string>& args) {
        tokens.clear();
        for (const std::string& arg : args) {
          size_t start = 0;
          while (true) {
            const size_t comma = arg.find(',', start);
            const std::string part = arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            int32_t id = 0;
            if (part.empty()) throw CLI::ValidationError(name, "an empty token id in " + quoted(arg, 60));
            const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), id, 10);
            if (ec != std::errc() || end != part.data() + part.size())
              throw CLI::ValidationError(name, quoted(part, 40) + " is not a token id (a decimal integer of 32 bits)");
            tokens.push_back(id);
            if (comma == std::string::npos) break;
            start = comma + 1;
          }
        }
      },
      help);
}

namespace {
// "--seed" for "-s,--seed": the name an error line gives.
std::string long_name(const std::string& names) {
  const size_t comma = names.rfind(',');
  return comma == std::string::npos ? names : names.substr(comma + 1);
}

template <typename T>
T decimal_value(const std::string& name, const std::string& text, T min) {
  T value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (end != text.data() + text.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range))
    throw CLI::ValidationError(name, quoted(text, 40) + " is not a decimal integer");
  if (ec == std::errc::result_out_of_range)
    throw CLI::ValidationError(name, fmt::format("{} is out of range (at most {})",
                                                 quoted(text, 40), std::numeric_limits<T>::max()));
  if (value < min)
    throw CLI::ValidationError(name, min == 1   ? fmt::format("{} is not a positive count", value)
                                     : min == 0 ? fmt::format("{} is negative", value)
                                                : fmt::format("{} is below {}", value, min));
  return value;
}
}  // namespace

CLI::Option* add_decimal_option(CLI::App& app, const std::string& name, int& value,
                                const std::string& help, int min) {
  return app
      .add_option_function<std::string>(
          name,
          [&value, name, min](const std::string& text) {
            value = decimal_value(long_name(name), text, min);
          },
          help)
      ->default_str(std::to_string(value));
}

CLI::Option* add_decimal_option(CLI::App& app, const std::string& name, uint64_t& value,
                                const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&value, name](const std::string& text) {
            value = decimal_value<uint64_t>(long_name(name), text, 0);
          },
          help)
      ->default_str(std::to_string(value));
}

CLI::Validator non_empty_value() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string("an empty value") : std::string();
      },
      "");
}

void add_selection_options(CLI::App& app, SelectionFlags& f) {
  app.add_option("--stage", f.stages, "compare only these stages (repeatable or comma-separated): " +
                                          stage_names_text())
      ->delimiter(',');
  app.add_option("--layer", f.layers,
                 "compare only these layers (repeatable or comma-separated; 'model' for the "
                 "model-scope stages)")
      ->delimiter(',');
  app.add_option("--position", f.positions, "compare only these positions (repeatable or comma-separated)")
      ->delimiter(',');
  app.add_option("--exclude", f.excluded,
                 "leave out this object and everything under it, e.g. /pos_0 or /pos_3/layer_1/qkv "
                 "(repeatable; h5diff's --exclude-path)");
}

DiffSelection selection_from_flags(const SelectionFlags& f) {
  DiffSelection sel;
  for (const auto& name : f.stages) {
    const auto stage = stage_from_name(name);
    if (!stage) fail("--stage {}: not a stage ({})", quoted(name, 40), stage_names_text());
    sel.stages.insert(*stage);
  }
  for (const auto& text : f.layers) {
    if (text == "model") {
      sel.layers.insert(kModelLayer);
      continue;
    }
    int layer = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), layer);
    if (ec != std::errc() || end != text.data() + text.size() || layer < 0)
      fail("--layer {}: a layer number (0, 1, ...) or 'model'", quoted(text, 40));
    sel.layers.insert(layer);
  }
  for (int p : f.positions) {
    if (p < 0) fail("--position {}: positions start at 0", p);
    sel.positions.insert(p);
  }
  const auto check_path = [](const std::string& path, const char* what) {
    if (path.empty() || path[0] != '/')
      fail("{} {}: an object path starts with '/' (e.g. /pos_3/layer_1/qkv)", what, quoted(path, 80));
  };
  for (const auto& p : f.paths) check_path(p, "object");
  for (const auto& p : f.excluded) check_path(p, "--exclude");
  sel.paths = f.paths;
  sel.excluded = f.excluded;
  return sel;
}

std::string preset_list() { return fmt::format("{}", fmt::join(PrecisionPolicy::preset_names(), ", ")); }

}  // namespace parity
