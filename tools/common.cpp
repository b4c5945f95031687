#include "tools/common.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "model/error.h"
#include "model/synth.h"
#include "reference/cpu_backend.h"
#include "tools/version.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#endif

namespace parity {
namespace fs = std::filesystem;

std::string resolve_model(const std::string& model, const std::string& models_dir_flag) {
  if (model.empty()) fail("--model: empty");
  const bool is_preset = model == "tiny" || model == "20b" || model == "120b";
  if (!is_preset || fs::is_directory(model)) {
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

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model) {
  if (name == "reference") return make_reference_backend(model);
  if (name == "cpu-f32") return make_cpu_f32_backend(model);
#ifdef PARITY_HAVE_DEVICE
  if (name == "hip") return make_hip_backend(model);
#endif
  if (name == "hip")
    fail("backend hip: this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)");
  fail("unknown backend \"{}\" (reference, cpu-f32, hip)", name);
}

std::string default_candidate() {
#ifdef PARITY_HAVE_DEVICE
  if (device_available()) return "hip";
#endif
  return "cpu-f32";
}

int guarded_main(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << tool << ": error: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << tool << ": error: " << e.what() << "\n";
  }
  return kExitError;
}

std::string iso8601_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
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

LockstepResult trace_lockstep(Backend& reference, Backend& candidate, const Model& model,
                              const LockstepOptions& options, const std::string& reference_path,
                              const std::string& candidate_path, const nlohmann::json& run_facts) {
  TraceMeta ref_meta = trace_meta(reference, model), cand_meta = trace_meta(candidate, model);
  ref_meta.run = cand_meta.run = run_facts;
  cand_meta.replay = options.replay;
  if (options.injection != nullptr) cand_meta.device["injected_fault"] = options.injection->str();
  TraceWriter ref_writer(reference_path, ref_meta);
  TraceWriter cand_writer(candidate_path, cand_meta);
  LockstepResult run = run_lockstep(reference, candidate, &ref_writer, &cand_writer, options);
  std::vector<int32_t> positions(run.tokens.size());
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = int32_t(i);
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

}  // namespace parity
