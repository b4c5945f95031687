// Tolerance profiles: lookup in the constexpr table, explicit tolerances, per-stage overrides.
#include "tracer/profiles.h"

#include <cmath>

#include "model/error.h"

namespace parity {
namespace {

void check_tolerance(AbsRel t, const std::string& what) {
  if (!std::isfinite(t.atol) || t.atol < 0)
    fail("{}: atol must be finite and >= 0, got {}", what, t.atol);
  if (!std::isfinite(t.rtol) || t.rtol < 0)
    fail("{}: rtol must be finite and >= 0, got {}", what, t.rtol);
}

double parse_number(const std::string& text, const std::string& flag) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail("{}: \"{}\" is not a number", flag, text);
}

}  // namespace

AbsRel Tolerance::for_stage(Stage s) const {
  const auto it = overrides.find(s);
  return it == overrides.end() ? base : it->second;
}

Tolerance Tolerance::absolute_relative(double atol, double rtol) {
  Tolerance t;
  t.name = "explicit";
  t.base = {atol, rtol};
  check_tolerance(t.base, "--atol/--rtol");
  return t;
}

void Tolerance::set_override(Stage s, AbsRel tol) {
  check_tolerance(tol, fmt::format("tolerance for stage {}", parity::name(s)));
  overrides[s] = tol;
}

nlohmann::json Tolerance::to_json() const {
  nlohmann::json o = nlohmann::json::object();
  for (const auto& [stage, t] : overrides)
    o[std::string(parity::name(stage))] = {{"atol", t.atol}, {"rtol", t.rtol}};
  return {{"profile", name}, {"atol", base.atol}, {"rtol", base.rtol}, {"overrides", o}};
}

std::string Tolerance::describe() const {
  std::string s = name == "explicit" ? "explicit" : "profile " + name;
  s += fmt::format(" (atol {:g}, rtol {:g})", base.atol, base.rtol);
  if (!overrides.empty()) {
    s += "; per stage:";
    for (const auto& [stage, t] : overrides)
      s += fmt::format(" {} (atol {:g}, rtol {:g})", parity::name(stage), t.atol, t.rtol);
  }
  return s;
}

Tolerance tolerance_profile(std::string_view name) {
  for (const auto& p : kToleranceProfiles) {
    if (p.name != name) continue;
    Tolerance t;
    t.name = std::string(p.name);
    t.base = p.base;
    for (const auto& o : p.overrides) t.overrides[o.stage] = o.tol;
    return t;
  }
  fail("unknown tolerance profile \"{}\" (known: {})", name, profile_names());
}

std::string profile_names() {
  std::string s;
  for (const auto& p : kToleranceProfiles) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

std::pair<Stage, AbsRel> parse_stage_tolerance(const std::string& text) {
  const std::string flag = "--stage-tol " + text;
  const size_t eq = text.find('='), comma = text.find(',', eq == std::string::npos ? 0 : eq);
  if (eq == std::string::npos || comma == std::string::npos)
    fail("{}: expected STAGE=ATOL,RTOL (e.g. logits=1e-4,1e-3)", flag);
  const std::string stage_name = text.substr(0, eq);
  const auto stage = stage_from_name(stage_name);
  if (!stage) fail("{}: unknown stage \"{}\"", flag, stage_name);
  const AbsRel tol{parse_number(text.substr(eq + 1, comma - eq - 1), flag),
                   parse_number(text.substr(comma + 1), flag)};
  check_tolerance(tol, flag);
  return {*stage, tol};
}

}  // namespace parity
