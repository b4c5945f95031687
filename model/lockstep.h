// A parity run: the reference and a candidate backend over the same tokens in lockstep, step by
// step and stage by stage, each traced through its own observer.
//
// Replay (teacher forcing), in the same run: every step, the candidate runs its rows twice, as
// two sequences. Sequence 0 runs free on its own values (its errors accumulate from stage to
// stage); in sequence 1 ("replay rows"), before each stage runs, the stage's inputs (the data
// in model/stages.h) are overwritten with the reference's values, so the stage's output there
// is its local result: what this stage alone does to exact inputs. At positions that are not
// traced only the KV-cache rows are forced (k_rope and v, the inputs scores appends), so the
// replay rows of traced positions attend over the reference's keys and values. A stage the
// candidate cannot replay (Backend::replays: a fused kernel that does not read the stage's own
// inputs) is recomputed instead: the reference computes the candidate's traced free rows of it
// from the candidate's own inputs (Backend::recompute_row), as its recompute series.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "model/forward.h"

namespace parity {

inline constexpr int kReplaySequence = 1;  // the candidate's sequence id of the replay rows

struct LockstepOptions {
  std::vector<int32_t> prompt;  // token ids at positions 0, 1, ...
  std::set<int> traced;         // prompt positions to trace; generated positions always are
  int step_rows = 64;           // prompt rows per step (the candidate runs twice as many)
  bool replay = true;
  int generate = 0;        // greedy decode steps after the prompt
  bool free_run = false;   // generated tokens follow the candidate's choice, not the reference's
  const Injection* injection = nullptr;  // perturbs the candidate (free and replay rows)
  // Called after every step with the positions done and the positions in all (prompt and
  // generation); a progress display, never part of the results.
  std::function<void(int done, int total)> progress;
};

struct LockstepResult {
  std::vector<int32_t> tokens;  // the prompt, then the generated tokens
  double reference_seconds = 0, candidate_seconds = 0;
  double forcing_seconds = 0;  // reading the reference's rows and writing them into the candidate
  double tracing_seconds = 0;  // reading traced rows and recording them
};

// Validates the options against the model (token ids, context, step size, replayable stages)
// before anything runs; throws parity::Error with one line naming what is wrong.
void check_lockstep(const LockstepOptions& options, const Backend& reference,
                    const Backend& candidate);

// Runs the prompt (and the generation) on both backends from empty caches. The reference's
// rows go to `reference_observer` (series output and magnitude, and recompute with its magnitude
// for the stages the candidate cannot replay, when options.replay), the candidate's to
// `candidate_observer` (series output, and replay when options.replay). Positions the options do
// not trace skip the model-scope head (final_norm, logits, sampled): nothing reads it there.
LockstepResult run_lockstep(Backend& reference, Backend& candidate, Observer* reference_observer,
                            Observer* candidate_observer, const LockstepOptions& options);

}  // namespace parity
