// The message a tensor-parallel group's leader sends its other MPI ranks for each call on its
// runner (engine/step_message.h): every kind round-trips, and bytes that are not such a message
// are one line, never a crash or a step with rows it does not have.
#include "engine/step_message.h"

#include <gtest/gtest.h>

#include <string>

#include "model/error.h"

namespace parity {
namespace {

StepMessage a_step() {
  StepMessage m;
  m.kind = StepMessage::Kind::step;
  m.batch = {{5, 17, 300}, {0, 1, 7}, {0, 0, 3}};
  m.samples = {{1, 42, 0}, {2, 7, 5}};
  m.sampling.temperature = 0.7;
  m.sampling.top_k = 40;
  m.sampling.top_p = 0.9;
  m.sampling.seed = 123456789;
  return m;
}

TEST(StepMessage, EveryKindRoundTrips) {
  const StepMessage m = a_step();
  const StepMessage back = decode_step_message(encode_step_message(m));
  EXPECT_EQ(back.kind, StepMessage::Kind::step);
  EXPECT_EQ(back.batch.tokens, m.batch.tokens);
  EXPECT_EQ(back.batch.positions, m.batch.positions);
  EXPECT_EQ(back.batch.seqs, m.batch.seqs);
  ASSERT_EQ(back.samples.size(), 2u);
  EXPECT_EQ(back.samples[1].row, 2);
  EXPECT_EQ(back.samples[1].request, 7u);
  EXPECT_EQ(back.samples[1].step, 5u);
  EXPECT_EQ(back.sampling.temperature, 0.7);
  EXPECT_EQ(back.sampling.top_k, 40);
  EXPECT_EQ(back.sampling.top_p, 0.9);
  EXPECT_EQ(back.sampling.seed, 123456789u);

  StepMessage release;
  release.kind = StepMessage::Kind::release;
  release.seq = 9;
  EXPECT_EQ(decode_step_message(encode_step_message(release)).seq, 9);
  for (const auto kind : {StepMessage::Kind::reset, StepMessage::Kind::stop}) {
    StepMessage m2;
    m2.kind = kind;
    EXPECT_EQ(decode_step_message(encode_step_message(m2)).kind, kind);
  }
}

void expect_refused(const std::string& bytes, const std::string& what) {
  try {
    (void)decode_step_message(bytes);
    ADD_FAILURE() << "accepted: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(StepMessage, BytesThatAreNotAMessageAreOneLine) {
  const std::string good = encode_step_message(a_step());
  expect_refused("", "nothing");
  expect_refused(std::string(1, '\x09'), "an unknown kind");
  for (size_t n = 1; n < good.size(); ++n) expect_refused(good.substr(0, n), "cut short");
  expect_refused(good + "x", "a byte left over");
  StepMessage m = a_step();
  m.samples.push_back({3, 1, 1});  // the step has rows 0..2
  expect_refused(encode_step_message(m), "a sample of a row the step lacks");
  m = a_step();
  m.batch.positions.pop_back();
  expect_refused(encode_step_message(m), "unequal arrays");
  m = a_step();
  m.sampling.top_p = 2;
  expect_refused(encode_step_message(m), "a bad sampling value");
  StepMessage release;
  release.kind = StepMessage::Kind::release;
  release.seq = -1;
  expect_refused(encode_step_message(release), "a negative sequence");
  // A vector whose length runs past the end.
  std::string huge = good;
  huge[1] = '\xff';
  huge[8] = '\x7f';
  expect_refused(huge, "a vector past the end");
}

}  // namespace
}  // namespace parity
