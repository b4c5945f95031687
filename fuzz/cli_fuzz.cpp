// Fuzzes the command-line value parsers the tools share (tools/common.h): the criterion flags
// (--tolerance, --profile, --atol/--rtol, --stage-tol, --lambda, --bound-safety, --judge),
// parity-diff's selection (--stage, --layer, --position, --exclude, object paths) and
// parity-trace's --tokens list, through the same CLI11 definitions the tools use. The input is
// an argument vector: arguments separated by NUL bytes.
//
// Beyond "no crash": bad text ends in CLI::Error or parity::Error and nothing else; an accepted
// fixed tolerance is finite and non-negative everywhere; derived bounds have a finite positive
// lambda and safety; an accepted selection holds only stages that exist, layers >= -1,
// positions >= 0 and paths that start with '/'; an accepted --tokens list holds int32 values
// that were written in the input (CLI11 must not wrap 4294967297 to 1).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "model/error.h"
#include "tools/common.h"

namespace {

bool finite_nonnegative(const parity::AbsRel& t) {
  return std::isfinite(t.atol) && std::isfinite(t.rtol) && t.atol >= 0 && t.rtol >= 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return -1;  // a command line, not a file
  std::vector<std::string> args{"parity-fuzz"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(data[i]));
    }
  }
  args.push_back(cur);
  if (args.size() > 64) return -1;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());

  CLI::App app{"fuzz"};
  parity::CriterionFlags cf;
  parity::SelectionFlags sel;
  std::vector<int32_t> tokens;
  app.add_option("OBJECTS", sel.paths);
  parity::add_token_list_option(app, "--tokens", tokens, "tokens");
  parity::add_criterion_options(app, cf, "judge");
  parity::add_selection_options(app, sel);
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::Error&) {
    return 0;
  }
  for (int32_t t : tokens) {
    // The value must be written in the input: a wrapped value would be a different number.
    const std::string text = std::to_string(t);
    bool seen = false;
    for (const auto& a : args) seen = seen || a.find(text.substr(t < 0 ? 1 : 0)) != std::string::npos;
    FUZZ_REQUIRE(seen);
  }
  try {
    const parity::Criterion c = parity::criterion_from_flags(cf);
    if (c.kind == parity::Criterion::Kind::fixed) {
      FUZZ_REQUIRE(finite_nonnegative(c.tolerance.base));
      for (const auto& [stage, t] : c.tolerance.overrides) FUZZ_REQUIRE(finite_nonnegative(t));
    } else {
      FUZZ_REQUIRE(std::isfinite(c.bound.lambda) && c.bound.lambda > 0);
      FUZZ_REQUIRE(std::isfinite(c.bound.safety) && c.bound.safety > 0);
    }
  } catch (const parity::Error&) {
  }
  try {
    const parity::DiffSelection s = parity::selection_from_flags(sel);
    for (parity::Stage st : s.stages) FUZZ_REQUIRE(int(st) >= 0 && int(st) < parity::kNumStages);
    for (int l : s.layers) FUZZ_REQUIRE(l >= parity::kModelLayer);
    for (int p : s.positions) FUZZ_REQUIRE(p >= 0);
    for (const auto& p : s.paths) FUZZ_REQUIRE(!p.empty() && p[0] == '/');
    for (const auto& p : s.excluded) FUZZ_REQUIRE(!p.empty() && p[0] == '/');
    (void)s.describe();
  } catch (const parity::Error&) {
  }
  return 0;
}
