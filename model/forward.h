// The gpt-oss forward graph, written once: the sequence of stage calls every backend runs,
// with the tracer's observer and fault injection at every stage boundary.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "model/backend.h"

namespace parity {

// Where a row of a stage's output lives: the key of a trace dataset.
struct StageKey {
  int position = 0;
  int layer = kModelLayer;  // kModelLayer for model-scope stages
  Stage stage = Stage::embedding;
  int order = 0;  // execution order within the position (see execution_order)
};

// Execution order of (layer, stage) within one position: embedding, then every layer's
// stages in list order, then final_norm and logits.
int execution_order(const Config& c, int layer, Stage s);
int stages_per_position(const Config& c);

class Observer {
 public:
  virtual ~Observer() = default;
  virtual bool wants(int position, int layer, Stage s) const = 0;
  virtual void record(const StageKey& key, const StageData& data) = 0;
};

// Fault injection: perturb one stage's output at one layer (kModelLayer for model scope) on
// every row. Modes: add (the first finite element moves by 0.5 + 0.5|x|; for topk_idx the
// first slot gets the lowest unselected expert), nan (the first finite element becomes NaN),
// zero (the whole row becomes 0; topk_idx as add).
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

// Runs one step of the graph. `observer` and `injection` may be null: then the graph is only
// the list of backend calls and costs nothing more.
void forward(Backend& backend, const Batch& batch, Observer* observer = nullptr,
             const Injection* injection = nullptr);

// The stage calls of one step, in order, as (layer, stage); the graph itself iterates this.
std::vector<std::pair<int, Stage>> stage_sequence(const Config& c);

}  // namespace parity
