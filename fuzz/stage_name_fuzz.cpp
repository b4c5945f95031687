// Fuzzes the stage-name lookup and the --inject parser (model/stages.h, model/injection.h), the
// first text a user types that reaches the graph. The input is the --inject text itself.
//
// Beyond "no crash": every stage name found must be the name it was looked up by; every
// Injection parsed must name a layer the model has (kModelLayer exactly for model-scope
// stages), parse back to itself from str(), and, applied to a row of its stage's shape, touch
// at most the elements its mode promises. A broken invariant traps, which libFuzzer saves as a
// crash input. Bad text must end in parity::Error, nothing else.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/fuzz_check.h"
#include "model/backend.h"
#include "model/error.h"
#include "model/injection.h"
#include "model/stages.h"
#include "model/synth.h"

namespace {

using parity::Config;
using parity::Injection;
using parity::Stage;
using parity::StageData;

// Two layer counts, so that a layer valid for one model is out of range for the other. Built
// once: per-input state would be allocation noise for the leak and rss checks.
const Config& tiny_config() {
  static const Config c = parity::synth_preset("tiny").config;  // 4 layers, small shapes
  return c;
}
Config deep_config() {
  Config c = tiny_config();
  c.num_hidden_layers = 24;
  c.layer_is_sliding.assign(24, false);
  return c;
}
const Config& deep() {
  static const Config c = deep_config();
  return c;
}

// A row of the stage's shape at position 2, filled from the input so that NaN and inf rows
// (which `add` and `nan` must skip) and finite ones both occur.
StageData make_row(const Config& c, Stage s, const uint8_t* data, size_t size) {
  StageData row;
  row.dims = parity::stage_dims(c, s, 2);
  size_t n = 1;
  for (size_t d : row.dims) n *= d;
  if (parity::is_decision(s)) {
    row.type = StageData::Type::I32;
    row.i32.resize(n);
    // Distinct expert ids (or token ids): what the graph gives apply_injection.
    for (size_t i = 0; i < n; ++i) row.i32[i] = int32_t(i);
    return row;
  }
  row.type = StageData::Type::F32;
  row.f32.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = size ? data[i % size] : 0;
    row.f32[i] = b == 0xff ? NAN : b == 0xfe ? INFINITY : float(b) - 128.0f;
  }
  return row;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void check_injection(const std::string& text, const Config& c, const uint8_t* data, size_t size) {
  Injection inj;
  try {
    inj = Injection::parse(text, c);
  } catch (const parity::Error&) {
    return;  // refused with a message: what bad text must get
  }
  if (parity::is_model_scope(inj.stage))
    FUZZ_REQUIRE(inj.layer == parity::kModelLayer);
  else
    FUZZ_REQUIRE(inj.layer >= 0 && inj.layer < c.num_hidden_layers);

  const Injection again = Injection::parse(inj.str(), c);
  FUZZ_REQUIRE(again.stage == inj.stage && again.layer == inj.layer && again.mode == inj.mode);

  StageData row = make_row(c, inj.stage, data, size);
  const StageData before = row;
  parity::apply_injection(inj, c, row);
  FUZZ_REQUIRE(row.size() == before.size());
  if (row.type != StageData::Type::F32) return;
  size_t changed = 0;
  for (size_t i = 0; i < row.size(); ++i) changed += !same_bits(row.f32[i], before.f32[i]);
  // add and nan move the first finite element only; zero may touch every element.
  if (inj.mode != Injection::Mode::Zero) FUZZ_REQUIRE(changed <= 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  if (const auto st = parity::stage_from_name(text)) FUZZ_REQUIRE(parity::name(*st) == text);

  check_injection(text, tiny_config(), data, size);
  check_injection(text, deep(), data, size);
  return 0;
}
