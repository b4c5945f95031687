#include "model/lockstep.h"

#include <algorithm>
#include <chrono>

#include "model/error.h"

namespace parity {
namespace {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), start_(Clock::now()) {}
  ~Stopwatch() { total_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double& total_;
  Clock::time_point start_;
};

// One step of the run: rows [first, first + n) of the token list.
class Step {
 public:
  Step(Backend& ref, Backend& cand, Observer* ref_obs, Observer* cand_obs,
       const LockstepOptions& o, LockstepResult& res)
      : ref_(ref), cand_(cand), ref_obs_(ref_obs), cand_obs_(cand_obs), o_(o), res_(res),
        c_(ref.config()) {}

  void run(const std::vector<int32_t>& tokens, int first, int n, const std::set<int>& traced) {
    Batch b;
    for (int i = first; i < first + n; ++i) {
      b.tokens.push_back(tokens[size_t(i)]);
      b.positions.push_back(i);
      b.seqs.push_back(0);
    }
    Batch cb = b;
    if (o_.replay) {
      for (int r = 0; r < n; ++r) {
        cb.tokens.push_back(b.tokens[size_t(r)]);
        cb.positions.push_back(b.positions[size_t(r)]);
        cb.seqs.push_back(kReplaySequence);
      }
    }
    rows_ = n;
    traced_.assign(size_t(n), false);
    bool any_traced = false;
    for (int r = 0; r < n; ++r) any_traced |= traced_[size_t(r)] = traced.contains(first + r);
    positions_ = b.positions;
    {
      Stopwatch t(res_.reference_seconds);
      ref_.begin_step(b);
    }
    {
      Stopwatch t(res_.candidate_seconds);
      cand_.begin_step(cb);
    }
    walk_graph(c_, [&](int layer, Stage s) {
      // Nothing reads the head at positions that are not traced: it runs only where traced.
      if (!any_traced && layer == kModelLayer && s != Stage::embedding) return;
      stage(layer, s);
    });
  }

  // The sampled token of the step's last row, from the reference or the candidate's free row.
  int32_t last_sampled(bool candidate) {
    Backend& b = candidate ? cand_ : ref_;
    return b.read(Stage::sampled, kModelLayer, rows_ - 1).i32.at(0);
  }

 private:
  void stage(int layer, Stage s) {
    const int order = execution_order(c_, layer, s);
    {
      Stopwatch t(res_.reference_seconds);
      ref_.run(s, layer);
    }
    if (ref_obs_ != nullptr) {
      Stopwatch t(res_.tracing_seconds);
      for (int r = 0; r < rows_; ++r) {
        if (!traced_[size_t(r)] || !ref_obs_->wants(positions_[size_t(r)], layer, s)) continue;
        const StageKey key{positions_[size_t(r)], layer, s, order, Series::output};
        ref_obs_->record(key, ref_.read(s, layer, r));
        if (auto m = ref_.magnitude(s, layer, r)) {
          StageKey mk = key;
          mk.series = Series::magnitude;
          ref_obs_->record(mk, *m);
        }
      }
    }
    if (o_.replay) force_inputs(layer, s);
    {
      Stopwatch t(res_.candidate_seconds);
      cand_.run(s, layer);
    }
    const Injection* inj = o_.injection;
    if (inj != nullptr && inj->stage == s && inj->layer == layer) {
      for (int r = 0; r < (o_.replay ? 2 : 1) * rows_; ++r) {
        StageData row = cand_.read(s, layer, r);
        apply_injection(*inj, c_, row);
        cand_.write(s, layer, r, row);
      }
    }
    if (o_.replay && ref_obs_ != nullptr && !cand_.replays(s, layer))
      recompute_own(layer, s, order);
    if (cand_obs_ != nullptr) {
      Stopwatch t(res_.tracing_seconds);
      for (int r = 0; r < rows_; ++r) {
        if (!traced_[size_t(r)] || !cand_obs_->wants(positions_[size_t(r)], layer, s)) continue;
        const StageKey key{positions_[size_t(r)], layer, s, order, Series::output};
        cand_obs_->record(key, cand_.read(s, layer, r));
        const std::vector<StageData> partials = cand_.partials(s, layer, r);
        for (size_t rank = 0; rank < partials.size(); ++rank)
          cand_obs_->record_partial(key, int(rank), partials[rank]);
        if (o_.replay) {
          StageKey rk = key;
          rk.series = Series::replay;
          cand_obs_->record(rk, cand_.read(s, layer, rows_ + r));
        }
      }
    }
  }

  // A stage the candidate computes from other inputs than its own (Backend::replays), in a run
  // with replay: the reference recomputes each traced row from the candidate's own inputs (its
  // free rows, and its KV cache of the layer), recorded as the reference trace's recompute rows,
  // by which the differ judges the stage's local error where replay cannot. (Without replay the
  // run is judged by its accumulated error, as before.)
  void recompute_own(int layer, Stage s, int order) {
    Stopwatch t(res_.tracing_seconds);
    std::vector<int> rows;
    for (int r = 0; r < rows_; ++r)
      if (traced_[size_t(r)] && ref_obs_->wants(positions_[size_t(r)], layer, s)) rows.push_back(r);
    if (rows.empty()) return;
    // The layer's cache once, up to the step's last traced position; each row reads its prefix.
    int last = 0;
    for (int r : rows) last = std::max(last, positions_[size_t(r)]);
    const std::optional<KvRows> cache = cand_.cache_rows(0, layer, 0, last + 1);
    if (!cache)
      fail("{}: stage {} of layer {} cannot be replayed, and its KV cache cannot be read",
           cand_.name(), name(s), layer);
    const size_t row_floats = size_t(c_.kv_dim());
    if (cache->count != last + 1 || cache->k.size() != size_t(last + 1) * row_floats ||
        cache->v.size() != cache->k.size())
      fail("{}: the KV cache rows of layer {} it handed over are not {} rows of {} values",
           cand_.name(), layer, last + 1, row_floats);
    for (int r : rows) {
      const int pos = positions_[size_t(r)];
      std::vector<StageData> inputs;
      for (const StageInput& in : info(s).inputs) {
        if (in.kind != InputKind::stage) continue;
        const auto src = resolve_input(in, layer, c_.num_hidden_layers);
        if (src) inputs.push_back(cand_.read(src->stage, src->layer, r));
      }
      auto row = ref_.recompute_row(s, layer, pos, inputs, *cache);
      if (!row)
        fail("{}: stage {} of layer {} cannot be replayed, and {} does not recompute it",
             cand_.name(), name(s), layer, ref_.name());
      const StageKey key{pos, layer, s, order, Series::recompute};
      ref_obs_->record(key, row->first);
      StageKey mk = key;
      mk.series = Series::recompute_magnitude;
      ref_obs_->record(mk, row->second);
    }
  }

  // Teacher forcing: the replay rows' inputs of stage s become the reference's values. Rows of
  // untraced positions only need their KV-cache rows forced.
  void force_inputs(int layer, Stage s) {
    Stopwatch t(res_.forcing_seconds);
    for (const StageInput& in : info(s).inputs) {
      const auto src = resolve_input(in, layer, c_.num_hidden_layers);
      if (!src) continue;
      for (int r = 0; r < rows_; ++r) {
        if (!traced_[size_t(r)] && in.kind != InputKind::append) continue;
        cand_.write(src->stage, src->layer, rows_ + r, ref_.read(src->stage, src->layer, r));
      }
    }
  }

  Backend& ref_;
  Backend& cand_;
  Observer* ref_obs_;
  Observer* cand_obs_;
  const LockstepOptions& o_;
  LockstepResult& res_;
  const Config& c_;
  int rows_ = 0;
  std::vector<bool> traced_;
  std::vector<int32_t> positions_;
};

}  // namespace

void check_lockstep(const LockstepOptions& o, const Backend& reference, const Backend& candidate) {
  const Config& c = reference.config();
  if (candidate.config().to_json() != c.to_json())
    fail("the reference and the candidate ({}) run different model configs", candidate.name());
  if (o.prompt.empty()) fail("no tokens to run");
  if (o.step_rows < 1) fail("step of {} rows: at least one row per step", o.step_rows);
  if (o.generate < 0) fail("--generate {}: the number of decode steps cannot be negative", o.generate);
  for (size_t i = 0; i < o.prompt.size(); ++i)
    if (o.prompt[i] < 0 || o.prompt[i] >= c.vocab_size)
      fail("token id {} at position {} is out of range (vocabulary 0..{})", o.prompt[i], i,
           c.vocab_size - 1);
  const int64_t positions = int64_t(o.prompt.size()) + o.generate;
  if (positions > c.max_position_embeddings) {
    if (o.generate > 0)
      fail("--generate {}: {} prompt positions and {} generated reach position {}, past the "
           "model's context of {} positions",
           o.generate, o.prompt.size(), o.generate, positions - 1, c.max_position_embeddings);
    fail("position {} is past the model's context of {} positions", positions - 1,
         c.max_position_embeddings);
  }
  for (int p : o.traced)
    if (p < 0 || size_t(p) >= o.prompt.size())
      fail("traced position {} is not a prompt position (0..{})", p, o.prompt.size() - 1);
  if (o.replay) {
    for (const auto& si : kStages)
      for (const StageInput& in : si.inputs) {
        const auto src = resolve_input(in, si.scope == Scope::Model ? kModelLayer : 0,
                                       c.num_hidden_layers);
        if (src && !candidate.writable(src->stage))
          fail("candidate {} cannot replay stage {}: it cannot take the output of {} from the "
               "reference (run without replay)",
               candidate.name(), si.name, name(src->stage));
      }
  }
}

LockstepResult run_lockstep(Backend& reference, Backend& candidate, Observer* reference_observer,
                            Observer* candidate_observer, const LockstepOptions& o) {
  check_lockstep(o, reference, candidate);
  LockstepResult res;
  res.tokens = o.prompt;
  std::set<int> traced = o.traced;
  const int prompt = int(o.prompt.size());
  if (o.generate > 0) traced.insert(prompt - 1);  // its sampled token starts the generation
  reference.reset();
  candidate.reset();
  Step step(reference, candidate, reference_observer, candidate_observer, o, res);
  const int total = prompt + o.generate;
  for (int first = 0; first < prompt; first += o.step_rows) {
    const int n = std::min(o.step_rows, prompt - first);
    step.run(res.tokens, first, n, traced);
    if (o.progress) o.progress(first + n, total);
  }
  for (int g = 0; g < o.generate; ++g) {
    res.tokens.push_back(step.last_sampled(o.free_run));
    const int pos = int(res.tokens.size()) - 1;
    traced.insert(pos);
    step.run(res.tokens, pos, 1, traced);
    if (o.progress) o.progress(pos + 1, total);
  }
  return res;
}

}  // namespace parity
