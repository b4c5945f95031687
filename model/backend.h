// The backend interface the forward graph runs over. A backend owns its activations, KV caches
// and weights (in whatever form it keeps them); the graph tells it which stage to run for which
// layer, and reads or writes single rows of a stage's output only when tracing or injecting.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/precision.h"
#include "model/row_shards.h"
#include "model/stages.h"

namespace parity {

// One decode/prefill step: row r is token tokens[r] at absolute position positions[r] of
// sequence seqs[r]. Rows of one sequence appear in increasing position order; each backend
// keeps one KV cache per sequence id.
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> seqs;
  int rows() const { return int(tokens.size()); }
  static Batch single(int32_t token, int32_t pos, int32_t seq = 0) {
    return {{token}, {pos}, {seq}};
  }
};

// Checks one step's rows before a backend touches its caches: equal lengths, token ids in the
// vocabulary, positions in [0, max_positions) (the model's context, or a smaller device cache),
// each sequence's rows contiguous, its first row at or before the length it has cached
// (`cached_length(seq)`; starting earlier truncates the cache there). Returns each sequence's
// first position in the step. Throws parity::Error, naming `cache` in the limit's hint.
struct SequenceStep {
  int first = 0;  // position of the sequence's first row in this step
  int end = 0;    // one past its last: the cached length after the step
};
std::map<int, SequenceStep> check_batch(const Batch& b, const Config& c, int max_positions,
                                        const std::function<int(int)>& cached_length);

// One row of one stage's output, on the host. Real stages are float64 (reference) or float32
// (every other backend); index stages are int32. dims follow the stage's shape rule.
struct StageData {
  enum class Type { F64, F32, I32 };
  Type type = Type::F64;
  std::vector<size_t> dims;
  std::vector<double> f64;
  std::vector<float> f32;
  std::vector<int32_t> i32;
  // A tensor-parallel group's row: how its ranks' rows made it (model/row_shards.h).
  std::optional<RowShards> shards;

  size_t size() const;
  double at(size_t i) const;         // any type as double
  void set(size_t i, double value);  // any type, converted
};

// Dimensions of one row of a stage at a given position (keys = pos + 1 for scores/att).
std::vector<size_t> stage_dims(const Config& c, Stage s, int pos);

// Rows of one layer's KV cache: k_rope and v of `count` consecutive positions, each
// [count, nKV, d] row-major.
struct KvRows {
  int count = 0;
  std::vector<double> k, v;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;       // "reference", "cpu-f32", "hip"
  virtual std::string precision() const = 0;  // human-readable precision policy
  virtual PrecisionPolicy precision_policy() const = 0;  // the same, as numbers
  virtual nlohmann::json facts() const { return nlohmann::json::object(); }  // device, versions
  virtual const Config& config() const = 0;

  // Validates the batch (token ids, positions, cache order) and makes it current.
  virtual void begin_step(const Batch& batch) = 0;
  // Runs one stage for every row of the current batch. Stage semantics, per row:
  //   scores also appends this step's k_rope and v rows to the sequence's KV cache, so that a
  //   fault injected into k_rope or v reaches the cache as it would in a real bug.
  virtual void run(Stage s, int layer) = 0;
  // The untraced step: every stage of the graph (walk_graph's order) with nothing read or
  // written between them, as one call, for a backend that can launch them faster together (the
  // `hip` backend: one captured graph). Afterwards read() sees what it would after run() of each
  // stage in turn: each stage's output of its last layer. Returns false, having done nothing,
  // where the backend has no such path; forward() then runs the stages one by one.
  virtual bool run_step() { return false; }
  // Host copy of one row's output of the stage last run for (s, layer) in this step.
  virtual StageData read(Stage s, int layer, int row) = 0;
  // Overwrites one row's output (fault injection, replay). A later stage that reads it sees
  // the written row, as if the stage had produced it.
  virtual void write(Stage s, int layer, int row, const StageData& data) = 0;
  // Whether write() works for this stage, i.e. whether the stages reading it can be replayed
  // on another backend's values (teacher forcing).
  virtual bool writable(Stage) const { return true; }
  // For stages whose elements are sums of products (the projections, scores, attn_out): per
  // element, the sum of the absolute values of the terms, |bias| included -- the scale of the
  // rounding error of that sum. Computed from the row's own inputs, in float64, by backends
  // that keep float64 (the reference); nullopt for other stages and other backends.
  virtual std::optional<StageData> magnitude(Stage, int /*layer*/, int /*row*/) {
    return std::nullopt;
  }
  // For the projections with a bias (qkv, o_proj, router, mlp1, mlp2): per element, |bias| (for
  // mlp1 and mlp2 the bias of the expert in each slot). By the reference; nullopt for other
  // stages and other backends.
  virtual std::optional<StageData> bias(Stage, int /*layer*/, int /*row*/) { return std::nullopt; }
  // The KV cache rows of sequence `seq` at `layer` for positions [first, first + count), as the
  // backend holds them (k_rope and v as its stages wrote them). Positions a sliding-window layer
  // has released (out of every window still to be read) come back as zeros. nullopt where the
  // backend cannot hand its cache over.
  virtual std::optional<KvRows> cache_rows(int /*seq*/, int /*layer*/, int /*first*/, int /*count*/) {
    return std::nullopt;
  }
  // Appends `rows` to the end of sequence `seq`'s cache at `layer`: a prefix another backend
  // computed, so that this one runs only the positions after it. Every layer must be given the
  // same number of rows before the sequence's next step. Throws where the backend cannot.
  virtual void load_cache(int /*seq*/, int /*layer*/, const KvRows& /*rows*/);
  // A tensor-parallel group's stages whose rows are sums of the ranks' partial sums (o_proj and
  // moe_out, all-reduced; mlp2 split by intermediate columns, gathered by the tracer): each
  // rank's partial sum of one row in rank order, read right after the stage ran. Empty for other
  // stages and other backends.
  virtual std::vector<StageData> partials(Stage, int /*layer*/, int /*row*/) { return {}; }
  // Whether a replay of stage s (its inputs written: model/lockstep.h) re-runs the arithmetic
  // that made its output: false where a fused kernel computes s from earlier stages' inputs, not
  // from its own (the `hip` backend's bf16 attention computes attn_out from q, k and v in one
  // kernel, never from att). Replaying s would then judge another kernel; the lockstep has the
  // reference recompute the candidate's own rows of s from the candidate's own inputs instead
  // (Series::recompute), and s is judged by that local error.
  virtual bool replays(Stage, int /*layer*/) const { return true; }
  // The output row of stage s at `position`, and its magnitude row, as this backend computes
  // them from another backend's values: `inputs` the rows of the stage's inputs that are stage
  // outputs (info(s).inputs' order), `cache` that backend's KV rows of the layer from position 0,
  // through `position` at least (later rows are not read: a step's rows share one read of the
  // cache). nullopt where the backend does not recompute s (the reference recomputes attn_out).
  virtual std::optional<std::pair<StageData, StageData>> recompute_row(
      Stage, int /*layer*/, int /*position*/, const std::vector<StageData>& /*inputs*/,
      const KvRows& /*cache*/) {
    return std::nullopt;
  }
  // Drops every sequence's KV cache.
  virtual void reset() = 0;
};

}  // namespace parity
