#include "model/injection.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/error.h"

namespace parity {

Injection Injection::parse(const std::string& text, const Config& c) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t p = text.find(':', start);
    parts.push_back(text.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  Injection inj;
  auto st = stage_from_name(parts[0]);
  if (!st) fail("--inject {}: unknown stage \"{}\"", text, parts[0]);
  inj.stage = *st;
  size_t next = 1;
  if (is_model_scope(inj.stage)) {
    inj.layer = kModelLayer;
  } else {
    if (parts.size() < 2 || parts[1].empty())
      fail("--inject {}: stage {} is per layer; write {}:LAYER", text, parts[0], parts[0]);
    try {
      size_t used = 0;
      inj.layer = std::stoi(parts[1], &used);
      if (used != parts[1].size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      fail("--inject {}: layer \"{}\" is not a number", text, parts[1]);
    }
    if (inj.layer < 0 || inj.layer >= c.num_hidden_layers)
      fail("--inject {}: layer {} out of range (the model has {} layers)", text, inj.layer,
           c.num_hidden_layers);
    next = 2;
  }
  if (parts.size() > next) {
    const std::string& m = parts[next];
    if (m == "add")
      inj.mode = Mode::Add;
    else if (m == "nan")
      inj.mode = Mode::NaN;
    else if (m == "zero")
      inj.mode = Mode::Zero;
    else
      fail("--inject {}: unknown mode \"{}\" (add, nan, zero)", text, m);
  }
  if (parts.size() > next + 1) fail("--inject {}: too many fields", text);
  return inj;
}

std::string Injection::str() const {
  std::string s(name(stage));
  if (layer != kModelLayer) s += ":" + std::to_string(layer);
  s += mode == Mode::Add ? ":add" : mode == Mode::NaN ? ":nan" : ":zero";
  return s;
}

void apply_injection(const Injection& inj, const Config& c, StageData& row) {
  if (inj.stage == Stage::sampled) {
    row.i32[0] = (row.i32[0] + 1) % c.vocab_size;
    return;
  }
  if (is_decision(inj.stage)) {
    // Route slot 0 to the lowest expert the row did not select.
    for (int e = 0; e < c.num_local_experts; ++e) {
      if (std::find(row.i32.begin(), row.i32.end(), e) == row.i32.end()) {
        row.i32[0] = e;
        return;
      }
    }
    return;
  }
  if (inj.mode == Injection::Mode::Zero) {
    for (size_t i = 0; i < row.size(); ++i) row.set(i, 0.0);
    return;
  }
  for (size_t i = 0; i < row.size(); ++i) {
    const double x = row.at(i);
    if (!std::isfinite(x)) continue;
    row.set(i, inj.mode == Injection::Mode::NaN ? std::numeric_limits<double>::quiet_NaN()
                                                : x + 0.5 + 0.5 * std::fabs(x));
    return;
  }
}

}  // namespace parity
