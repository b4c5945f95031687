// The gpt-oss forward graph, written once: the sequence of stage calls every backend runs,
// with the tracer's observer and fault injection at every stage boundary.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/injection.h"

namespace parity {

// Which run a traced row comes from.
//   output               a backend's own output: the reference's values, or a candidate running
//                        free on its own inputs (its error accumulated over every stage before)
//   replay               a candidate stage re-run on the reference's inputs (teacher forcing):
//                        the stage's local result, whose error is that stage's own
//   magnitude            the reference's per-element sum of |terms| of a stage's sums
//                        (Backend::magnitude)
//   recompute            the reference's output of a stage recomputed from the candidate's own
//                        values of its inputs (model/recompute.h): the candidate's output minus
//                        it is the candidate stage's local error, for a candidate that cannot be
//                        replayed (a capture of the user's port)
//   recompute_magnitude  the magnitude rows of those recomputed sums
//   recompute_bias       |bias| per element of the recomputed projections (Backend::bias): a
//                        port that rounds its sum before adding the bias errs by a rounding of
//                        the sum without it
enum class Series { output, replay, magnitude, recompute, recompute_magnitude, recompute_bias };

// Where a row of a stage's output lives: the key of a trace dataset.
struct StageKey {
  int position = 0;
  int layer = kModelLayer;  // kModelLayer for model-scope stages
  Stage stage = Stage::embedding;
  int order = 0;  // execution order within the position (see execution_order)
  Series series = Series::output;
};

// The model-scope stages before and after the layers, in order.
inline constexpr std::array kPrologue = {Stage::embedding};
inline constexpr std::array kEpilogue = {Stage::final_norm, Stage::logits, Stage::sampled};

// The graph, written once: fn(layer, stage) for every stage call of one step, in order.
// A layer is the attention block, then the MoE block (gpt_oss/torch/model.py TransformerBlock).
template <typename F>
void walk_graph(const Config& c, F&& fn) {
  for (Stage s : kPrologue) fn(kModelLayer, s);
  for (int L = 0; L < c.num_hidden_layers; ++L) {
    fn(L, Stage::attn_norm);
    fn(L, Stage::qkv);
    fn(L, Stage::q_rope);
    fn(L, Stage::k_rope);
    fn(L, Stage::v);
    fn(L, Stage::scores);
    fn(L, Stage::att);
    fn(L, Stage::attn_out);
    fn(L, Stage::o_proj);
    fn(L, Stage::resid_attn);
    fn(L, Stage::ffn_norm);
    fn(L, Stage::router);
    fn(L, Stage::topk_idx);
    fn(L, Stage::topk_w);
    fn(L, Stage::mlp1);
    fn(L, Stage::swiglu);
    fn(L, Stage::mlp2);
    fn(L, Stage::moe_out);
    fn(L, Stage::resid_ffn);
  }
  for (Stage s : kEpilogue) fn(kModelLayer, s);
}

// The stage calls of one step, in order, as (layer, stage).
std::vector<std::pair<int, Stage>> stage_sequence(const Config& c);
// Execution order of (layer, stage) within one position: its index in stage_sequence.
int execution_order(const Config& c, int layer, Stage s);
int stages_per_position(const Config& c);

class Observer {
 public:
  virtual ~Observer() = default;
  virtual bool wants(int position, int layer, Stage s) const = 0;
  virtual void record(const StageKey& key, const StageData& data) = 0;
  // A tensor-parallel group's partial sum of rank `rank` before the all-reduce of the row `key`
  // names (Backend::partials); an observer that keeps none ignores it.
  virtual void record_partial(const StageKey& /*key*/, int /*rank*/, const StageData& /*data*/) {}
};

// Runs one step of the graph on one backend. `observer` and `injection` may be null: then the
// graph is only the list of backend calls and costs nothing more (the backend may run them as
// one, Backend::run_step). The observer sees the rows of sequence 0.
void forward(Backend& backend, const Batch& batch, Observer* observer = nullptr,
             const Injection* injection = nullptr);

}  // namespace parity
