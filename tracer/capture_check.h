// What parity-trace --candidate-trace accepts as a capture of a model: the checks that decide,
// before anything is written, that a capture (a port's trace, read as TraceKind::capture) can be
// judged against the model the reference runs.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "tracer/trace_file.h"

namespace parity {

struct CaptureCheck {
  std::set<int> positions;  // the positions the capture holds stage rows of
  int cached = 0;           // its KV-cache rows cover positions 0..cached-1 (0: none)
};

// Throws parity::Error naming the capture when it is of another model (config) or checkpoint
// (fingerprint, when it records one), when its tokens are missing, out of the vocabulary, past
// the context or not `tokens_flag` (when given), when its positions are not 0, 1, ..., when a
// row lies at a position it has no token for or inside its KV-cache prefix, or when it holds no
// stage rows at all.
CaptureCheck check_capture(const TraceReader& capture, const Model& model,
                           const std::vector<int32_t>* tokens_flag);

}  // namespace parity
