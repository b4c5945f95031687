// The messages of the MPI work distribution (engine/mpi_work.h) as bytes (engine/byte_message.h),
// checked on the way in: a request rank 0 hands a rank, a rank's result of one, a rank's stats at
// its end. The MPI calls stay in engine/mpi_work.cpp; these build without MPI, so that the tests
// and the fuzz target read them everywhere.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "engine/engine.h"
#include "engine/work_queue.h"

namespace parity {

std::string encode_work_item(const WorkItem& item);
// Throws parity::Error, one line, on bytes that are not such a message: a token id outside the
// tokenizer's range, a negative max_tokens, an ignore_eos flag other than 0 and 1, bytes cut short
// or left over.
WorkItem decode_work_item(std::string_view bytes);

std::string encode_work_result(size_t index, const EngineResult& result);
// Throws likewise on an unknown finish reason, a negative worker, a time to first token that is
// negative or not finite, a generated token id outside the range, bytes cut short or left over.
// (The index is checked against the requests by the queue that takes the result.)
std::pair<size_t, EngineResult> decode_work_result(std::string_view bytes);

std::string encode_work_stats(const EngineStats& stats);
// Throws likewise on a count that is negative or more failed requests than requests, a time that
// is negative or not finite, bytes cut short or left over.
EngineStats decode_work_stats(std::string_view bytes);

}  // namespace parity
