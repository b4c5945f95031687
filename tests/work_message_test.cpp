// The messages of the MPI work distribution (engine/work_message.h): each round-trips, and bytes
// that are not such a message are one line naming what is wrong, never a crash or a value the
// receiving rank would act on.
#include "engine/work_message.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "model/error.h"

namespace parity {
namespace {

WorkItem an_item() {
  WorkItem item;
  item.index = 41;
  item.request.id = 9001;
  item.request.prompt = {1, 17, 300, 199998};
  item.request.max_tokens = 128;
  item.request.ignore_eos = true;
  return item;
}

EngineResult a_result() {
  EngineResult r;
  r.generated = {5, 6, 7};
  r.finish = FinishReason::stop;
  r.ttft_seconds = 0.25;
  r.worker = 3;
  return r;
}

EngineStats some_stats() {
  EngineStats s;
  s.requests = 10, s.failed = 1;
  s.prompt_tokens = 1234, s.generated_tokens = 567;
  s.prefill_rows = 1300, s.decode_rows = 560, s.steps = 70;
  s.wall_seconds = 2.5, s.prefill_seconds = 1.0, s.decode_seconds = 1.25;
  s.ttft_seconds = {0.1, 0.2};
  s.tpot_seconds = {0.01};
  return s;
}

// `decode` refuses `bytes` with one line holding `fragment`.
void expect_refused(const std::function<void(std::string_view)>& decode, const std::string& bytes,
                    const std::string& fragment) {
  try {
    decode(bytes);
    ADD_FAILURE() << "accepted: " << fragment;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(fragment), std::string::npos) << m;
  }
}

TEST(WorkMessage, EachRoundTrips) {
  const WorkItem item = decode_work_item(encode_work_item(an_item()));
  EXPECT_EQ(item.index, 41u);
  EXPECT_EQ(item.request.id, 9001u);
  EXPECT_EQ(item.request.prompt, an_item().request.prompt);
  EXPECT_EQ(item.request.max_tokens, 128);
  EXPECT_TRUE(item.request.ignore_eos);

  EngineResult failed;
  failed.finish = FinishReason::error;
  failed.error = "prompt of 5000 tokens exceeds the context";
  for (const EngineResult& want : {a_result(), failed}) {
    const auto [index, got] = decode_work_result(encode_work_result(7, want));
    EXPECT_EQ(index, 7u);
    EXPECT_EQ(got.generated, want.generated);
    EXPECT_EQ(got.finish, want.finish);
    EXPECT_EQ(got.ttft_seconds, want.ttft_seconds);
    EXPECT_EQ(got.worker, want.worker);
    EXPECT_EQ(got.error, want.error);
  }

  const EngineStats s = decode_work_stats(encode_work_stats(some_stats()));
  EXPECT_EQ(s.requests, 10u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.prompt_tokens, 1234);
  EXPECT_EQ(s.generated_tokens, 567);
  EXPECT_EQ(s.prefill_rows, 1300);
  EXPECT_EQ(s.decode_rows, 560);
  EXPECT_EQ(s.steps, 70);
  EXPECT_EQ(s.wall_seconds, 2.5);
  EXPECT_EQ(s.prefill_seconds, 1.0);
  EXPECT_EQ(s.decode_seconds, 1.25);
  EXPECT_EQ(s.ttft_seconds, some_stats().ttft_seconds);
  EXPECT_EQ(s.tpot_seconds, some_stats().tpot_seconds);
}

TEST(WorkMessage, BytesThatAreNotAMessageAreOneLine) {
  const auto item = [](std::string_view b) { (void)decode_work_item(b); };
  const auto result = [](std::string_view b) { (void)decode_work_result(b); };
  const auto stats = [](std::string_view b) { (void)decode_work_stats(b); };
  const double nan = std::numeric_limits<double>::quiet_NaN();

  const std::string good_item = encode_work_item(an_item());
  for (size_t n = 0; n < good_item.size(); ++n)
    expect_refused(item, good_item.substr(0, n), "past its end");
  expect_refused(item, good_item + "x", "left over");
  WorkItem w = an_item();
  w.request.prompt[2] = -4;
  expect_refused(item, encode_work_item(w), "token id -4");
  w = an_item();
  w.request.max_tokens = -1;
  expect_refused(item, encode_work_item(w), "max_tokens -1");
  std::string flag = good_item;
  flag.back() = '\x02';
  expect_refused(item, flag, "ignore_eos 2");
  std::string huge = good_item;  // the prompt's length: bytes 16..23
  huge[16] = '\xff';
  huge[23] = '\x7f';
  expect_refused(item, huge, "past its end");

  const std::string good_result = encode_work_result(7, a_result());
  for (size_t n = 0; n < good_result.size(); ++n)
    expect_refused(result, good_result.substr(0, n), "past its end");
  expect_refused(result, good_result + "x", "left over");
  std::string finish = good_result;  // the finish reason: bytes 8..11
  finish[8] = '\x09';
  expect_refused(result, finish, "finish 9");
  EngineResult r = a_result();
  r.worker = -2;
  expect_refused(result, encode_work_result(7, r), "worker -2");
  r = a_result();
  r.ttft_seconds = nan;
  expect_refused(result, encode_work_result(7, r), "time to first token");
  r = a_result();
  r.ttft_seconds = -1;
  expect_refused(result, encode_work_result(7, r), "time to first token");
  r = a_result();
  r.generated.push_back(kMaxTokenId);
  expect_refused(result, encode_work_result(7, r), "generated token id");

  const std::string good_stats = encode_work_stats(some_stats());
  for (size_t n = 0; n < good_stats.size(); ++n)
    expect_refused(stats, good_stats.substr(0, n), "past its end");
  expect_refused(stats, good_stats + "x", "left over");
  EngineStats s = some_stats();
  s.failed = 11;
  expect_refused(stats, encode_work_stats(s), "11 of 10 requests failed");
  s = some_stats();
  s.steps = -1;
  expect_refused(stats, encode_work_stats(s), "a count of -1");
  s = some_stats();
  s.decode_seconds = std::numeric_limits<double>::infinity();
  expect_refused(stats, encode_work_stats(s), "a time");
  s = some_stats();
  s.tpot_seconds.push_back(nan);
  expect_refused(stats, encode_work_stats(s), "a request's time");
}

}  // namespace
}  // namespace parity
