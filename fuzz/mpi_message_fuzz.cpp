// Fuzzes the messages between MPI ranks, as a rank receives them: the input's first byte picks
// the decoder (modulo 4) and the rest is the message -- the step message a tensor-parallel
// group's leader sends its other ranks for each call on its StepRunner (engine/step_message.h),
// and the work distribution's request, result and stats (engine/work_message.h).
//
// Beyond "no crash, no unbounded allocation" (a vector's length is checked against the bytes
// left before anything is allocated): a refusal is one parity::Error line; an accepted message
// is what the receiving rank may act on -- a step's tokens, positions and sequences of one length,
// every sample naming one of its rows, sampling values that validate, a released sequence that is
// not negative; token ids in the tokenizer's range, counts and times neither negative nor NaN --
// and its encoding is the message byte for byte (fixed-size fields, nothing optional: one message
// has one encoding).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/step_message.h"
#include "engine/work_message.h"
#include "fuzz/fuzz_check.h"
#include "model/error.h"

namespace {

// decode(bytes), or nothing when it refuses them (in one line). Only the decoding may refuse:
// an Error from the checks of an accepted message is a bug, and escapes.
template <class Decode>
auto decoded(Decode decode, std::string_view bytes) -> std::optional<decltype(decode(bytes))> {
  try {
    return decode(bytes);
  } catch (const parity::Error& e) {
    parity::fuzz::check_message(e);
    return std::nullopt;
  }
}

void check_step_message(std::string_view bytes) {
  const auto got = decoded(parity::decode_step_message, bytes);
  if (!got) return;
  const parity::StepMessage& m = *got;
  using Kind = parity::StepMessage::Kind;
  FUZZ_REQUIRE(m.kind == Kind::step || m.kind == Kind::release || m.kind == Kind::reset ||
               m.kind == Kind::stop);
  if (m.kind == Kind::step) {
    FUZZ_REQUIRE(m.batch.positions.size() == m.batch.tokens.size());
    FUZZ_REQUIRE(m.batch.seqs.size() == m.batch.tokens.size());
    for (const parity::RowSample& s : m.samples) FUZZ_REQUIRE(s.row >= 0 && s.row < m.batch.rows());
    m.sampling.validate();
  } else {
    FUZZ_REQUIRE(m.batch.rows() == 0 && m.samples.empty());
  }
  if (m.kind == Kind::release) FUZZ_REQUIRE(m.seq >= 0);
  FUZZ_REQUIRE(parity::encode_step_message(m) == bytes);
}

bool token_ids(const std::vector<parity::TokenId>& ids) {
  for (const parity::TokenId id : ids)
    if (id < 0 || id >= parity::kMaxTokenId) return false;
  return true;
}

bool time(double t) {
  return std::isfinite(t) && t >= 0;
}

void check_work_item(std::string_view bytes) {
  const auto got = decoded(parity::decode_work_item, bytes);
  if (!got) return;
  const parity::WorkItem& item = *got;
  FUZZ_REQUIRE(token_ids(item.request.prompt) && item.request.max_tokens >= 0);
  FUZZ_REQUIRE(parity::encode_work_item(item) == bytes);
}

void check_work_result(std::string_view bytes) {
  const auto got = decoded(parity::decode_work_result, bytes);
  if (!got) return;
  const auto& [index, r] = *got;
  FUZZ_REQUIRE(r.finish >= parity::FinishReason::stop && r.finish <= parity::FinishReason::error);
  FUZZ_REQUIRE(r.worker >= 0 && time(r.ttft_seconds) && token_ids(r.generated));
  FUZZ_REQUIRE(parity::encode_work_result(index, r) == bytes);
}

void check_work_stats(std::string_view bytes) {
  const auto got = decoded(parity::decode_work_stats, bytes);
  if (!got) return;
  const parity::EngineStats& s = *got;
  FUZZ_REQUIRE(s.failed <= s.requests);
  for (const int64_t n :
       {s.prompt_tokens, s.generated_tokens, s.prefill_rows, s.decode_rows, s.steps})
    FUZZ_REQUIRE(n >= 0);
  for (const double t : {s.wall_seconds, s.prefill_seconds, s.decode_seconds})
    FUZZ_REQUIRE(time(t));
  for (const double t : s.ttft_seconds) FUZZ_REQUIRE(time(t));
  for (const double t : s.tpot_seconds) FUZZ_REQUIRE(time(t));
  FUZZ_REQUIRE(parity::encode_work_stats(s) == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_step_message(bytes);
      break;
    case 1:
      check_work_item(bytes);
      break;
    case 2:
      check_work_result(bytes);
      break;
    default:
      check_work_stats(bytes);
      break;
  }
  return 0;
}
