// parity-trace: run the double reference and a candidate backend over the same stage graph,
// trace both into HDF5, diff them, and name the first divergence.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "model/error.h"
#include "model/forward.h"
#include "tools/common.h"
#include "tools/version.h"
#include "tracer/differ.h"
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

// Runs `backend` over tokens in steps of at most `step_rows` rows, tracing `traced` positions.
void run_backend(Backend& backend, const Model& model, const std::vector<int32_t>& tokens,
                 const std::set<int>& traced, int step_rows, const Injection* inj,
                 const std::string& path, const std::string& commit) {
  TraceMeta meta;
  meta.backend = backend.name();
  meta.precision = backend.precision();
  meta.config = model.config.to_json();
  meta.fingerprint = model.fingerprint;
  meta.model_dir = model.dir;
  meta.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) meta.positions.push_back(int32_t(i));
  meta.tool_version = PARITY_VERSION;
  meta.commit = commit;
  meta.device = backend.facts();
  if (inj != nullptr) meta.device["injected_fault"] = inj->str();
  meta.created = iso8601_now();
  TraceWriter writer(path, meta, traced);
  backend.reset();
  for (size_t start = 0; start < tokens.size(); start += size_t(step_rows)) {
    Batch b;
    for (size_t i = start; i < std::min(tokens.size(), start + size_t(step_rows)); ++i) {
      b.tokens.push_back(tokens[i]);
      b.positions.push_back(int32_t(i));
      b.seqs.push_back(0);
    }
    forward(backend, b, &writer, inj);
  }
  writer.finish();
}

void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) fail("{}: write failed", tmp.string());
  }
  fs::rename(tmp, path);
}

int trace_main(int argc, char** argv) {
  CLI::App app{
      "parity-trace: run the float64 reference and a candidate backend over one stage "
      "graph, trace both into HDF5 and name the first divergence.\n"
      "Exit: 0 within tolerance, 1 diverged, 2 error."};
  std::string model = "tiny", models_dir, tokens_text, candidate, inject_text, profile = "fp32",
              out;
  int token = -1, pos = -1, step_rows = 64;
  double atol = -1, rtol = -1;
  app.add_option("--model", model, "checkpoint directory, or preset tiny|20b|120b")
      ->capture_default_str();
  app.add_option("--models-dir", models_dir,
                 "where presets live (default $PARITY_MODELS_DIR, else ./models)");
  auto* o_tokens = app.add_option("--tokens", tokens_text,
                                  "comma-separated token ids at positions 0,1,...; all traced");
  auto* o_token = app.add_option(
      "--token", token, "trace this token id at --pos, after the prefix (1 + 7919 i) mod vocab");
  auto* o_pos = app.add_option("--pos", pos, "position of --token");
  o_tokens->excludes(o_token)->excludes(o_pos);
  o_token->needs(o_pos);
  o_pos->needs(o_token);
  app.add_option(
      "--candidate", candidate,
      "candidate backend: cpu-f32, hip, reference (default: hip with a GPU, else cpu-f32)");
  app.add_option("--inject", inject_text,
                 "fault injection on the candidate: STAGE:LAYER[:add|nan|zero], or STAGE[:MODE] at "
                 "model scope");
  auto* o_atol =
      app.add_option("--atol", atol, "absolute tolerance (with --rtol; overrides the profile)");
  auto* o_rtol = app.add_option("--rtol", rtol, "relative tolerance (with --atol)");
  o_atol->needs(o_rtol);
  o_rtol->needs(o_atol);
  app.add_option("--profile", profile, "tolerance profile: fp32, bf16, mxfp4")
      ->capture_default_str();
  app.add_option("--step", step_rows, "rows per forward step (prefill batch size)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--out", out,
                 "output directory for reference.h5, candidate.h5, report.txt, report.json")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitError;
  }
  if (tokens_text.empty() && token < 0) fail("give --tokens t0,t1,... or --token T --pos P");
  if (candidate.empty()) candidate = default_candidate();

  std::vector<Phase> phases;
  auto t0 = std::chrono::steady_clock::now();
  auto m = Model::load(resolve_model(model, models_dir));
  const Config& c = m->config;
  phases.push_back({"load", since(t0)});

  std::vector<int32_t> tokens;
  std::set<int> traced;
  if (!tokens_text.empty()) {
    std::stringstream ss(tokens_text);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        const long v = std::stol(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
        tokens.push_back(int32_t(v));
      } catch (const std::exception&) {
        fail("--tokens: \"{}\" is not a token id", item);
      }
    }
    for (size_t i = 0; i < tokens.size(); ++i) traced.insert(int(i));
  } else {
    if (pos < 0) fail("--pos {}: positions start at 0", pos);
    for (int i = 0; i < pos; ++i) tokens.push_back(prefix_token(i, c.vocab_size));
    tokens.push_back(token);
    traced.insert(pos);
  }
  if (tokens.empty()) fail("--tokens: no tokens given");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id {} at position {} is out of range for {} (vocabulary 0..{})", tokens[i], i,
           m->dir, c.vocab_size - 1);
  if (int(tokens.size()) > c.max_position_embeddings)
    fail("position {} is past the context of {} ({} positions)", tokens.size() - 1, m->dir,
         c.max_position_embeddings);

  std::optional<Injection> inj;
  if (!inject_text.empty()) inj = Injection::parse(inject_text, c);
  Tolerance tol = atol >= 0 ? Tolerance::absolute_relative(atol, rtol) : tolerance_profile(profile);

  fs::create_directories(out);
  const fs::path ref_path = fs::path(out) / "reference.h5",
                 cand_path = fs::path(out) / "candidate.h5";
  // A stale report from an earlier run must never sit beside new traces.
  for (const char* f : {"report.txt", "report.json"}) fs::remove(fs::path(out) / f);

  t0 = std::chrono::steady_clock::now();
  auto reference = make_backend("reference", *m);
  phases.push_back({"reference setup", since(t0)});
  t0 = std::chrono::steady_clock::now();
  auto cand = make_backend(candidate, *m);  // the device backend uploads the weights here
  phases.push_back({"candidate setup (" + cand->name() + ")", since(t0)});
  t0 = std::chrono::steady_clock::now();
  run_backend(*reference, *m, tokens, traced, step_rows, nullptr, ref_path.string(), PARITY_COMMIT);
  phases.push_back({"reference", since(t0)});
  t0 = std::chrono::steady_clock::now();
  run_backend(*cand, *m, tokens, traced, step_rows, inj ? &*inj : nullptr, cand_path.string(),
              PARITY_COMMIT);
  phases.push_back({"candidate (" + cand->name() + ")", since(t0)});

  t0 = std::chrono::steady_clock::now();
  TraceReader a(cand_path.string()), b(ref_path.string());
  DiffResult result = diff_traces(a, b, tol);
  phases.push_back({"diff", since(t0)});

  std::string timing;
  for (const auto& p : phases)
    timing += fmt::format("{}{} {:.3f} s", timing.empty() ? "" : ", ", p.name, p.seconds);
  TextReportOptions text_opts;
  std::string facts_line;
  const nlohmann::json facts = cand->facts();
  for (const auto& [key, value] : facts.items())
    facts_line += fmt::format("{}{}={}", facts_line.empty() ? "" : ", ", key,
                              value.is_string() ? value.get<std::string>() : value.dump());
  write_atomically(fs::path(out) / "report.txt",
                   report_text(result, text_opts) + "candidate: " + cand->name() +
                       (facts_line.empty() ? "" : " (" + facts_line + ")") + "\n" +
                       "timing: " + timing + "\n");
  nlohmann::json j = report_json(result);
  j["timing_seconds"] = nlohmann::json::object();
  for (const auto& p : phases) j["timing_seconds"][p.name] = p.seconds;
  j["candidate_backend"] = cand->name();
  j["candidate_facts"] = cand->facts();
  if (inj) j["injected_fault"] = inj->str();
  write_atomically(fs::path(out) / "report.json", j.dump(2) + "\n");

  std::cout << verdict_line(result) << "\n";
  std::cout << "candidate: " << cand->name() << (facts_line.empty() ? "" : " (" + facts_line + ")")
            << "\n";
  std::cout << "timing: " << timing << "\n";
  std::cout << "traces: " << ref_path.string() << ", " << cand_path.string()
            << "; report: " << (fs::path(out) / "report.txt").string() << "\n";
  return result.diverged() ? kExitDiverged : kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  return parity::guarded_main("parity-trace", [&] { return parity::trace_main(argc, argv); });
}
