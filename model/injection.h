// Fault injection: perturb one stage's output at one layer on every row, so that the harness
// can prove on every CI run that it localizes what it should.
#pragma once
#include <string>

#include "model/backend.h"

namespace parity {

// Modes: add (the first finite element moves by 0.5 + 0.5|x|; topk_idx: the first slot gets
// the lowest unselected expert; sampled: the next token id), nan (the first finite element
// becomes NaN), zero (the whole row becomes 0; index stages as add).
struct Injection {
  enum class Mode { Add, NaN, Zero };
  Stage stage = Stage::embedding;
  int layer = kModelLayer;
  Mode mode = Mode::Add;
  // "STAGE:LAYER[:MODE]" or "STAGE[:MODE]" for model-scope stages; throws on bad text.
  static Injection parse(const std::string& text, const Config& c);
  std::string str() const;
};
void apply_injection(const Injection& inj, const Config& c, StageData& row);

}  // namespace parity
