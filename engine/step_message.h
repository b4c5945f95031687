// A tensor-parallel group whose ranks are MPI processes (engine/mpi_group.h): the leader runs the
// engine, and each call it makes on its StepRunner goes to the other ranks as one message, which
// they replay on theirs. This is that message as bytes (engine/byte_message.h), checked on the
// way in: a step's rows (tokens, positions, sequences), the rows to sample and how; a released
// sequence; a reset; the end.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "engine/step_runner.h"
#include "model/backend.h"

namespace parity {

struct StepMessage {
  enum class Kind : uint8_t { step = 1, release = 2, reset = 3, stop = 4 };
  Kind kind = Kind::stop;
  Batch batch;                     // step
  std::vector<RowSample> samples;  // step
  SamplingParams sampling;         // step
  int seq = -1;                    // release
};

std::string encode_step_message(const StepMessage& m);
// Throws parity::Error, one line, on bytes that are not such a message: an unknown kind, arrays
// of unequal rows, a sample of a row the step does not have, a bad sampling value, bytes left
// over.
StepMessage decode_step_message(std::string_view bytes);

}  // namespace parity
