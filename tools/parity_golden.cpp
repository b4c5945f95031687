// parity-golden: the regression gate on golden logits. `check`/`update` run the float64
// reference over the manifest's tokens and compare with (or rewrite) golden/<name>/logits.txt;
// `compare` checks two plain one-number-a-line logit files as engineers' checkers do.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "model/error.h"
#include "model/forward.h"
#include "model/untrusted.h"
#include "tools/common.h"
#include "tools/version.h"
#include "tracer/profiles.h"
#include "tracer/trace_file.h"


namespace parity {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

inline constexpr int kGoldenSchema = 1;

// Logit files: numbers separated by whitespace or commas, any number per line (blank lines
// skipped), at most 2^31 bytes; or h5dump's output of one dataset, whose numbers are read from
// its DATA { ... } block with h5dump's "(i):" index prefixes skipped.
constexpr uint64_t kMaxNumbersFile = uint64_t(1) << 31;

std::vector<double> read_numbers(const std::string& path) {
  std::string text = read_small_file(path, kMaxNumbersFile, "logits file");
  size_t first_line = 1;
  if (const size_t data = text.find("DATA {"); data != std::string::npos && text.find("HDF5 \"") == 0) {
    const size_t end = text.find('}', data);
    first_line += size_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(data), '\n'));
    text = text.substr(data + 6, end == std::string::npos ? std::string::npos : end - data - 6);
  }
  std::vector<double> v;
  std::istringstream in(text);
  std::string line;
  size_t line_no = first_line - 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (const size_t colon = line.find("):"); colon != std::string::npos && line.find('(') < colon)
      line = line.substr(colon + 2);  // h5dump's "(index):"
    for (char& c : line)
      if (c == ',' || c == '\t' || c == '\r') c = ' ';
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      try {
        size_t used = 0;
        v.push_back(std::stod(word, &used));
        if (used != word.size()) throw std::invalid_argument(word);
      } catch (const std::exception&) {
        fail("{}:{}: {} is not a number", path, line_no, quoted(word, 40));
      }
    }
  }
  if (v.empty()) fail("{}: holds no numbers", path);
  return v;
}

void write_numbers(const std::string& path, const std::vector<double>& v) {
  std::string text;
  for (double x : v) text += fmt::format("{:.17g}\n", x);
  write_file_atomically(path, text);
}

// Compares got against ans: |got - ans| > atol + rtol |ans| is a mismatch; NaN never matches.
int compare_numbers(const std::vector<double>& got, const std::vector<double>& ans, double atol,
                    double rtol, const std::string& got_name, const std::string& ans_name, int max_lines) {
  if (got.size() != ans.size())
    fail("{} has {} numbers but {} has {}", got_name, got.size(), ans_name, ans.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(got[i] - ans[i]);
    const bool ok = std::isfinite(got[i]) && std::isfinite(ans[i]) ? diff <= atol + rtol * std::fabs(ans[i])
                                                                   : got[i] == ans[i];
    if (!ok) {
      if (int(bad) < max_lines)
        std::cout << fmt::format("Mismatch at element {}: got={:.9g} vs ans={:.9g} (diff {:.3g})\n", i,
                                 got[i], ans[i], diff);
      ++bad;
    }
    if (std::isfinite(diff)) worst = std::max(worst, diff);
  }
  if (bad > 0) {
    std::cout << fmt::format("FAIL: {} of {} elements mismatch (atol {:g}, rtol {:g}; max abs diff {:.3g})\n",
                             bad, got.size(), atol, rtol, worst);
    return kExitDiverged;
  }
  std::cout << fmt::format("PASS: {} elements within atol {:g}, rtol {:g} (max abs diff {:.3g})\n",
                           got.size(), atol, rtol, worst);
  return kExitOk;
}

// A backend's logits for tokens at positions 0..n-1, flattened [position][vocab].
std::vector<double> backend_logits(const Model& m, const std::vector<int32_t>& tokens,
                                   const std::string& backend_name) {
  struct Collect : Observer {
    std::vector<double> logits;
    bool wants(int, int, Stage s) const override { return s == Stage::logits; }
    void record(const StageKey&, const StageData& d) override {
      for (size_t i = 0; i < d.size(); ++i) logits.push_back(d.at(i));
    }
  } collect;
  auto backend = make_backend(backend_name, m);
  Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.config.vocab_size)
      fail("golden token {} out of range for {}", tokens[i], m.dir);
    b.tokens.push_back(tokens[i]);
    b.positions.push_back(int32_t(i));
    b.seqs.push_back(0);
  }
  forward(*backend, b, &collect);
  return collect.logits;
}

int golden_main(int argc, char** argv) {
  CLI::App app{"parity-golden: regression gate on golden logits.\nExit: 0 pass, 1 mismatch, 2 error."};
  app.require_subcommand(1);
  std::string model = "tiny", models_dir, golden_dir = default_golden_dir(), name;
  auto* check = app.add_subcommand("check", "compare the reference's logits with golden/<name>/");
  auto* update = app.add_subcommand("update", "regenerate golden/<name>/ from the reference");
  for (auto* sub : {check, update}) {
    sub->add_option("--model", model, "checkpoint directory or preset")->capture_default_str();
    sub->add_option("--models-dir", models_dir, "where presets live");
    sub->add_option("--golden-dir", golden_dir, "golden root")->capture_default_str();
    sub->add_option("--name", name, "golden set name (default: the preset name)");
  }
  std::vector<int32_t> update_tokens;
  double update_atol = 1e-9, update_rtol = 1e-9;
  add_token_list_option(*update, "--tokens", update_tokens, "token ids (default: keep the manifest's)");
  update->add_option("--atol", update_atol, "tolerance recorded in the manifest")->capture_default_str();
  update->add_option("--rtol", update_rtol, "tolerance recorded in the manifest")->capture_default_str();
  auto* compare = app.add_subcommand(
      "compare", "compare two logit files (numbers separated by whitespace or commas, or h5dump's "
                 "output of a dataset)");
  std::string got_file, ans_file, backend_name = "reference";
  // One default across the tools: the fp32 profile's, as parity-diff --profile fp32.
  const AbsRel fp32 = tolerance_profile("fp32").base;
  double atol = fp32.atol, rtol = fp32.rtol;
  int max_lines = 20;
  compare->add_option("got", got_file, "candidate logits")->required();
  compare->add_option("ans", ans_file, "expected logits")->required();
  compare->add_option("--atol", atol)->capture_default_str();
  compare->add_option("--rtol", rtol)->capture_default_str();
  compare->add_option("-n,--count", max_lines, "mismatch lines printed at most")->capture_default_str();
  double check_atol = -1, check_rtol = -1;
  check->add_option("--backend", backend_name,
                    "the backend whose logits are gated: reference (against the manifest's "
                    "tolerance), cpu-f32, hip (against --atol/--rtol, default the fp32 profile's)")
      ->capture_default_str();
  check->add_option("--atol", check_atol, "tolerance for a backend other than the reference");
  check->add_option("--rtol", check_rtol, "tolerance for a backend other than the reference");
  if (const auto done = parse_command_line(app, "parity-golden", argc, argv)) return *done;

  if (*compare)
    return compare_numbers(read_numbers(got_file), read_numbers(ans_file), atol, rtol, got_file, ans_file, max_lines);

  if (name.empty()) {
    if (fs::is_directory(model) && !(model == "tiny" || model == "20b" || model == "120b"))
      fail("--name is needed when --model is a directory ({})", model);
    name = model;
  }
  const fs::path dir = fs::path(golden_dir) / name;
  const fs::path manifest_path = dir / "manifest.json", logits_path = dir / "logits.txt";
  json manifest;
  if (fs::exists(manifest_path)) {
    manifest = parse_json(read_small_file(manifest_path.string(), 1 << 24, "golden manifest"),
                          manifest_path.string());
    if (manifest.value("schema_version", 0) != kGoldenSchema)
      fail("{}: schema_version {} (this tool reads {}); regenerate with: {}", manifest_path.string(),
           manifest.value("schema_version", 0), kGoldenSchema,
           manifest.value("regenerate", std::string("parity-golden update")));
  } else if (*check) {
    fail("{}: no golden manifest (create one with `parity-golden update --model {}`)", manifest_path.string(), model);
  }

  auto m = Model::load(resolve_model(model, models_dir));
  if (*update) {
    std::vector<int32_t> tokens = update_tokens;
    if (tokens.empty() && manifest.contains("tokens")) tokens = manifest["tokens"].get<std::vector<int32_t>>();
    if (tokens.empty()) fail("update: give --tokens (no manifest to take them from)");
    const auto logits = backend_logits(*m, tokens, "reference");
    fs::create_directories(dir);
    write_numbers(logits_path.string(), logits);
    json out = {{"schema_version", kGoldenSchema},
                {"model", model},
                {"checkpoint_fingerprint", m->fingerprint},
                {"config", m->config.to_json()},
                {"tokens", tokens},
                {"layout", "logits.txt: one number per line, [position][vocab] flattened, %.17g"},
                {"backend", "reference (float64)"},
                {"atol", update_atol},
                {"rtol", update_rtol},
                {"tool_version", PARITY_VERSION},
                {"commit", PARITY_COMMIT},
                {"created", iso8601_now()},
                {"regenerate", fmt::format("parity-golden update --model {} --name {}", model, name)}};
    write_file_atomically(manifest_path.string(), out.dump(2) + "\n");
    std::cout << fmt::format("wrote {} ({} logits) and {}\n", logits_path.string(), logits.size(),
                             manifest_path.string());
    return kExitOk;
  }
  for (const char* key : {"tokens", "atol", "rtol"})
    if (!manifest.contains(key)) fail("{}: missing \"{}\"", manifest_path.string(), key);
  const auto tokens = manifest["tokens"].get<std::vector<int32_t>>();
  const auto logits = backend_logits(*m, tokens, backend_name);
  const bool reference = backend_name == "reference";
  const double tol_a = reference ? manifest["atol"].get<double>() : check_atol >= 0 ? check_atol : fp32.atol;
  const double tol_r = reference ? manifest["rtol"].get<double>() : check_rtol >= 0 ? check_rtol : fp32.rtol;
  std::cout << fmt::format("golden {}: {} positions x {} logits of {}, backend {}\n", name,
                           tokens.size(), m->config.vocab_size, m->dir, backend_name);
  return compare_numbers(logits, read_numbers(logits_path.string()), tol_a, tol_r, backend_name,
                         logits_path.string(), 20);
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-golden", [&] { return parity::golden_main(argc, argv); });
}
