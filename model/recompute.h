// Recompute: the reference runs a candidate's stages on the candidate's own inputs. A candidate
// that cannot be replayed on the reference's inputs (a capture of the user's port, a run we do
// not control) still has a local error at every stage whose inputs it recorded: its output minus
// what the float64 reference computes from those same inputs. That error is the stage's own,
// free of everything it inherited (the other direction of replay, model/lockstep.h).
//
// The reference runs each step twice, as two sequences: sequence 0 free on the tokens (its
// output and magnitude rows, as any reference trace), and sequence 1 ("recompute rows"), where,
// before each stage runs, the stage's inputs (the data in model/stages.h) are overwritten with
// the candidate's rows, rounded to the storage the candidate declares for them. The KV cache of
// sequence 1 is the candidate's: scores appends the candidate's k_rope and v rows at every
// position that has them. A recompute row is traced (Series::recompute, with its magnitude and
// bias rows) only where every input came from the candidate: the stage's inputs at its position
// and, for scores and attn_out, the k_rope and v rows of every earlier position in that layer.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/forward.h"

namespace parity {

inline constexpr int kRecomputeSequence = 1;  // the reference's sequence id of the recompute rows

// The candidate's recorded rows, by (position, layer, stage).
class CandidateRows {
 public:
  virtual ~CandidateRows() = default;
  virtual bool has(int position, int layer, Stage s) const = 0;
  virtual StageData read(int position, int layer, Stage s) const = 0;
};

// An input a stage's recompute lacks: the stage output at `ref` of `position`.
struct MissingInput {
  int position = 0;
  StageRef ref;
  std::string describe() const;  // "qkv of layer 0 at position 3"
};

// Which stages of which positions the candidate's rows let the reference recompute.
class RecomputeCoverage {
 public:
  // Scans the rows of positions 0..last; the KV-cache rows of positions below `cache_given` are
  // the candidate's whatever the rows hold (handed to the reference directly: load_cache).
  RecomputeCoverage(const CandidateRows& rows, const Config& c, int last, int cache_given = 0);
  // The first input of (position, layer, s) the candidate lacks; nullopt when every input is
  // there (the stage can be judged by its local error).
  std::optional<MissingInput> missing(int position, int layer, Stage s) const;

 private:
  const CandidateRows& rows_;
  const Config& c_;
  // Per layer, the first position whose k_rope or v row is missing (last + 1 when none is).
  std::vector<int> first_missing_cache_;
};

struct RecomputeOptions {
  std::vector<int32_t> tokens;  // token ids at positions 0, 1, ...
  std::set<int> traced;         // positions traced (free and recompute rows); not empty
  int step_rows = 64;           // positions per step (the reference runs twice as many rows)
  PrecisionPolicy policy;       // the candidate's: its inputs are rounded to each stage's storage
  bool free_rows = true;        // also trace the free reference (output and magnitude rows)
  // The reference's recompute sequence already caches the candidate's KV rows of positions
  // 0..first_position-1 (Backend::load_cache): the run starts there, nothing is reset, and there
  // are no free rows (the free reference would need its own prefix).
  int first_position = 0;
};

struct RecomputeResult {
  double seconds = 0;             // the reference's steps, both sequences
  size_t input_values = 0;        // real values of the candidate's rows written as inputs
  size_t not_in_storage = 0;      // of those, values the declared storage format cannot hold
  std::string first_not_in_storage;  // "qkv of layer 0 at position 0"
  size_t bfloat16_values = 0;     // of those, values that are bfloat16 numbers
};

// Validates the options (tokens in the vocabulary and the context, traced positions among them,
// step size) and runs. Rows go to `observer`: the free rows as Series::output and magnitude,
// the recompute rows as Series::recompute, recompute_magnitude and recompute_bias. Throws
// parity::Error naming what is wrong.
RecomputeResult run_recompute(Backend& reference, const CandidateRows& candidate,
                              Observer& observer, const RecomputeOptions& options);

}  // namespace parity
