#include "model/forward.h"

#include <algorithm>

#include "model/error.h"

namespace parity {

std::vector<std::pair<int, Stage>> stage_sequence(const Config& c) {
  std::vector<std::pair<int, Stage>> seq;
  walk_graph(c, [&](int layer, Stage s) { seq.emplace_back(layer, s); });
  return seq;
}

int stages_per_position(const Config& c) {
  int model = 0, layer = 0;
  for (const auto& s : kStages) (s.scope == Scope::Model ? model : layer)++;
  return model + layer * c.num_hidden_layers;
}

int execution_order(const Config& c, int layer, Stage s) {
  // Layer stages run in list order (tested against walk_graph); the prologue and epilogue
  // around them in their own order.
  int per_layer = 0, in_layer = 0;
  for (const auto& i : kStages) {
    if (i.scope == Scope::Model) continue;
    if (i.stage < s) ++in_layer;
    ++per_layer;
  }
  const int prologue = int(kPrologue.size());
  if (layer != kModelLayer) return prologue + per_layer * layer + in_layer;
  const auto pro = std::find(kPrologue.begin(), kPrologue.end(), s);
  if (pro != kPrologue.end()) return int(pro - kPrologue.begin());
  const auto epi = std::find(kEpilogue.begin(), kEpilogue.end(), s);
  PARITY_CHECK(epi != kEpilogue.end(), "stage {} is not a model-scope stage", name(s));
  return prologue + per_layer * c.num_hidden_layers + int(epi - kEpilogue.begin());
}

void forward(Backend& b, const Batch& batch, Observer* observer, const Injection* injection) {
  const Config& c = b.config();
  b.begin_step(batch);
  // Untraced: the backend may run the whole step at once (the same kernels, the same values).
  if (observer == nullptr && injection == nullptr && b.run_step()) return;
  walk_graph(c, [&](int layer, Stage s) {
    b.run(s, layer);
    const bool inject = injection != nullptr && injection->stage == s && injection->layer == layer;
    if (!inject && observer == nullptr) return;
    for (int r = 0; r < batch.rows(); ++r) {
      const int pos = batch.positions[size_t(r)];
      if (inject) {
        StageData row = b.read(s, layer, r);
        apply_injection(*injection, c, row);
        b.write(s, layer, r, row);
      }
      if (observer != nullptr && batch.seqs[size_t(r)] == 0 && observer->wants(pos, layer, s)) {
        const StageKey key{pos, layer, s, execution_order(c, layer, s)};
        observer->record(key, b.read(s, layer, r));
        const std::vector<StageData> partials = b.partials(s, layer, r);
        for (size_t rank = 0; rank < partials.size(); ++rank)
          observer->record_partial(key, int(rank), partials[rank]);
      }
    }
  });
}

}  // namespace parity
