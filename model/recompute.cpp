#include "model/recompute.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <map>
#include <tuple>

#include "model/error.h"

namespace parity {

std::string MissingInput::describe() const {
  if (ref.layer == kModelLayer) return fmt::format("{} at position {}", name(ref.stage), position);
  return fmt::format("{} of layer {} at position {}", name(ref.stage), ref.layer, position);
}

RecomputeCoverage::RecomputeCoverage(const CandidateRows& rows, const Config& c, int last,
                                     int cache_given)
    : rows_(rows), c_(c), first_missing_cache_(size_t(c.num_hidden_layers), last + 1) {
  for (int layer = 0; layer < c.num_hidden_layers; ++layer)
    for (int p = cache_given; p <= last; ++p)
      if (!rows.has(p, layer, Stage::k_rope) || !rows.has(p, layer, Stage::v)) {
        first_missing_cache_[size_t(layer)] = p;
        break;
      }
}

std::optional<MissingInput> RecomputeCoverage::missing(int position, int layer, Stage s) const {
  for (const StageInput& in : info(s).inputs) {
    if (in.kind == InputKind::kv_cache) {
      const int first = first_missing_cache_[size_t(layer)];
      if (first < position) {
        const Stage lacking = rows_.has(first, layer, Stage::k_rope) ? Stage::v : Stage::k_rope;
        return MissingInput{first, {lacking, layer}};
      }
      continue;
    }
    const auto src = resolve_input(in, layer, c_.num_hidden_layers);
    if (src && !rows_.has(position, src->layer, src->stage)) return MissingInput{position, *src};
  }
  return std::nullopt;
}

namespace {

using Clock = std::chrono::steady_clock;

// One step: positions [first, first + n), as rows 0..n-1 (free) and n..2n-1 (recompute); the
// recompute rows alone (0..n-1) without free rows.
class RecomputeStep {
 public:
  RecomputeStep(Backend& ref, const CandidateRows& cand, Observer& obs, const RecomputeOptions& o,
                const RecomputeCoverage& coverage, RecomputeResult& res)
      : ref_(ref), cand_(cand), obs_(obs), o_(o), coverage_(coverage), res_(res),
        c_(ref.config()) {}

  void run(int first, int n) {
    Batch b;
    for (int seq : {0, kRecomputeSequence})
      for (int i = first; i < first + n; ++i) {
        if (seq == 0 && !o_.free_rows) continue;
        b.tokens.push_back(o_.tokens[size_t(i)]);
        b.positions.push_back(i);
        b.seqs.push_back(seq);
      }
    first_ = first;
    rows_ = n;
    free_ = o_.free_rows ? n : 0;
    rows_read_.clear();
    bool any_traced = false;
    for (int i = first; i < first + n; ++i) any_traced |= o_.traced.contains(i);
    ref_.begin_step(b);
    int cached_layer = kModelLayer;
    walk_graph(c_, [&](int layer, Stage s) {
      // Nothing reads the head at positions that are not traced: it runs only where traced.
      if (!any_traced && layer == kModelLayer && s != Stage::embedding) return;
      if (layer != cached_layer) rows_read_.clear();  // a layer's rows are read within it
      cached_layer = layer;
      write_inputs(layer, s);
      ref_.run(s, layer);
      trace(layer, s);
    });
  }

 private:
  bool traced(int r) const { return o_.traced.contains(first_ + r); }

  // The recompute rows' inputs of stage s become the candidate's, where it has them. Rows of
  // untraced positions only need their KV-cache rows (the inputs scores appends).
  void write_inputs(int layer, Stage s) {
    for (const StageInput& in : info(s).inputs) {
      const auto src = resolve_input(in, layer, c_.num_hidden_layers);
      if (!src) continue;
      for (int r = 0; r < rows_; ++r) {
        const int pos = first_ + r;
        if (!traced(r) && in.kind != InputKind::append) continue;
        if (!cand_.has(pos, src->layer, src->stage)) continue;
        ref_.write(src->stage, src->layer, free_ + r, stored(pos, *src));
      }
    }
  }

  // The candidate's row, rounded to the storage it declares for that stage; read once per layer
  // of a step (ffn_norm feeds router and mlp1, topk_idx three stages).
  const StageData& stored(int pos, const StageRef& src) {
    const auto key = std::tuple{pos, src.layer, src.stage};
    if (const auto it = rows_read_.find(key); it != rows_read_.end()) return it->second;
    StageData& d = rows_read_.emplace(key, cand_.read(pos, src.layer, src.stage)).first->second;
    if (info(src.stage).kind != ValueKind::Real) return d;
    const double unit = o_.policy.at(src.stage).storage;
    // att's sink column is read by nothing (attn_out weighs the keys' values), and a port that
    // drops it (NO_SINK) has it as 1 - the keys' sum, in no format.
    const size_t sink_col = src.stage == Stage::att && d.dims.size() == 2 ? d.dims[1] - 1 : SIZE_MAX;
    for (size_t i = 0; i < d.size(); ++i) {
      const double x = d.at(i);
      if (!std::isfinite(x) || (sink_col != SIZE_MAX && i % d.dims[1] == sink_col)) continue;
      ++res_.input_values;
      const double r = round_to_storage(x, unit);
      if (round_to_storage(x, kUnitBfloat16) == x) ++res_.bfloat16_values;
      if (r == x) continue;
      if (res_.not_in_storage++ == 0)
        res_.first_not_in_storage = MissingInput{pos, src}.describe();
      d.set(i, r);
    }
    return d;
  }

  void trace(int layer, Stage s) {
    const int order = execution_order(c_, layer, s);
    for (int r = 0; r < rows_; ++r) {
      const int pos = first_ + r;
      if (!traced(r) || !obs_.wants(pos, layer, s)) continue;
      const StageKey key{pos, layer, s, order, Series::output};
      if (o_.free_rows) {
        obs_.record(key, ref_.read(s, layer, r));
        if (auto m = ref_.magnitude(s, layer, r)) obs_.record(with(key, Series::magnitude), *m);
      }
      if (coverage_.missing(pos, layer, s)) continue;
      const int row = free_ + r;
      obs_.record(with(key, Series::recompute), ref_.read(s, layer, row));
      if (auto m = ref_.magnitude(s, layer, row)) obs_.record(with(key, Series::recompute_magnitude), *m);
      // |bias| only where the candidate rounds its sum before the bias (its bound needs it).
      if (o_.policy.at(s).bias > 0)
        if (auto b = ref_.bias(s, layer, row)) obs_.record(with(key, Series::recompute_bias), *b);
    }
  }

  static StageKey with(StageKey k, Series s) {
    k.series = s;
    return k;
  }

  Backend& ref_;
  const CandidateRows& cand_;
  Observer& obs_;
  const RecomputeOptions& o_;
  const RecomputeCoverage& coverage_;
  RecomputeResult& res_;
  const Config& c_;
  int first_ = 0, rows_ = 0;
  int free_ = 0;  // rows of the free sequence in the step (0 without free rows)
  std::map<std::tuple<int, int, Stage>, StageData> rows_read_;  // this layer's candidate rows
};

}  // namespace

RecomputeResult run_recompute(Backend& reference, const CandidateRows& candidate,
                              Observer& observer, const RecomputeOptions& o) {
  const Config& c = reference.config();
  if (o.tokens.empty()) fail("recompute: no tokens");
  if (int64_t(o.tokens.size()) > c.max_position_embeddings)
    fail("recompute: {} tokens, past the model's context of {} positions", o.tokens.size(),
         c.max_position_embeddings);
  for (size_t i = 0; i < o.tokens.size(); ++i)
    if (o.tokens[i] < 0 || o.tokens[i] >= c.vocab_size)
      fail("recompute: token id {} at position {} is out of range (vocabulary 0..{})", o.tokens[i],
           i, c.vocab_size - 1);
  if (o.traced.empty()) fail("recompute: no position to trace");
  if (*o.traced.begin() < 0 || size_t(*o.traced.rbegin()) >= o.tokens.size())
    fail("recompute: traced position {} is not one of the {} token positions",
         *o.traced.begin() < 0 ? *o.traced.begin() : *o.traced.rbegin(), o.tokens.size());
  if (o.step_rows < 1) fail("recompute: step of {} rows: at least one row per step", o.step_rows);
  if (o.first_position < 0 || o.first_position > *o.traced.begin())
    fail("recompute: first position {} is past the first traced position {}", o.first_position,
         *o.traced.begin());
  if (o.first_position > 0 && o.free_rows)
    fail("recompute: the free reference has no prefix when the run starts at position {}",
         o.first_position);

  RecomputeResult res;
  const auto t0 = Clock::now();
  const int last = *o.traced.rbegin();
  const RecomputeCoverage coverage(candidate, c, last, o.first_position);
  if (o.first_position == 0) reference.reset();
  RecomputeStep step(reference, candidate, observer, o, coverage, res);
  for (int first = o.first_position; first <= last; first += o.step_rows)
    step.run(first, std::min(o.step_rows, last + 1 - first));
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

}  // namespace parity
