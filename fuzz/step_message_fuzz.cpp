// Fuzzes the message a tensor-parallel group's leader sends its other MPI ranks for each call on
// its StepRunner (engine/step_message.h): the input is the message's bytes, as a rank receives
// them.
//
// Beyond "no crash, no unbounded allocation" (a vector's length is checked against the bytes
// left before anything is allocated): a refusal is one parity::Error line; an accepted message
// is what the replaying rank may act on -- a known kind, a step's tokens, positions and
// sequences of one length, every sample naming one of the step's rows, sampling values that
// validate, a released sequence that is not negative -- and its encoding is the input byte for
// byte (fixed-size fields, nothing optional: one message has one encoding).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/step_message.h"
#include "fuzz/fuzz_check.h"
#include "model/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  parity::StepMessage m;
  try {
    m = parity::decode_step_message(bytes);
  } catch (const parity::Error& e) {
    parity::fuzz::check_message(e);
    return 0;
  }
  // Accepted: from here on an Error is a bug, and escapes.
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
  return 0;
}
