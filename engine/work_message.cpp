#include "engine/work_message.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/byte_message.h"
#include "model/error.h"

namespace parity {
namespace {

void check_tokens(const std::vector<TokenId>& ids, const char* what) {
  for (const TokenId id : ids)
    PARITY_CHECK(id >= 0 && id < kMaxTokenId, "MPI message: {} token id {}", what, id);
}

void check_time(double seconds, const char* what) {
  PARITY_CHECK(std::isfinite(seconds) && seconds >= 0, "MPI message: {} of {} s", what, seconds);
}

void check_done(const ByteReader& r) {
  PARITY_CHECK(r.done(), "MPI message: bytes left over");
}

}  // namespace

std::string encode_work_item(const WorkItem& item) {
  ByteWriter w;
  w.put(uint64_t(item.index)).put(item.request.id).put_vector(item.request.prompt);
  w.put(int32_t(item.request.max_tokens)).put(uint8_t(item.request.ignore_eos ? 1 : 0));
  return w.bytes();
}

WorkItem decode_work_item(std::string_view bytes) {
  ByteReader r(bytes);
  WorkItem item;
  item.index = size_t(r.get<uint64_t>());
  item.request.id = r.get<uint64_t>();
  item.request.prompt = r.get_vector<TokenId>();
  check_tokens(item.request.prompt, "a prompt");
  item.request.max_tokens = r.get<int32_t>();
  PARITY_CHECK(item.request.max_tokens >= 0, "MPI message: max_tokens {}", item.request.max_tokens);
  const uint8_t ignore_eos = r.get<uint8_t>();
  PARITY_CHECK(ignore_eos <= 1, "MPI message: ignore_eos {}", ignore_eos);
  item.request.ignore_eos = ignore_eos == 1;
  check_done(r);
  return item;
}

std::string encode_work_result(size_t index, const EngineResult& result) {
  ByteWriter w;
  w.put(uint64_t(index)).put(int32_t(result.finish)).put(int32_t(result.worker));
  w.put(result.ttft_seconds).put_vector(result.generated).put_string(result.error);
  return w.bytes();
}

std::pair<size_t, EngineResult> decode_work_result(std::string_view bytes) {
  ByteReader r(bytes);
  const size_t index = size_t(r.get<uint64_t>());
  EngineResult result;
  const int32_t finish = r.get<int32_t>();
  PARITY_CHECK(finish >= 0 && finish <= int32_t(FinishReason::error), "MPI message: finish {}",
               finish);
  result.finish = FinishReason(finish);
  result.worker = r.get<int32_t>();
  PARITY_CHECK(result.worker >= 0, "MPI message: worker {}", result.worker);
  result.ttft_seconds = r.get<double>();
  check_time(result.ttft_seconds, "a time to first token");
  result.generated = r.get_vector<TokenId>();
  check_tokens(result.generated, "a generated");
  result.error = r.get_string();
  check_done(r);
  return {index, std::move(result)};
}

std::string encode_work_stats(const EngineStats& s) {
  ByteWriter w;
  w.put(uint64_t(s.requests)).put(uint64_t(s.failed)).put(s.prompt_tokens).put(s.generated_tokens);
  w.put(s.prefill_rows).put(s.decode_rows).put(s.steps).put(s.wall_seconds);
  w.put(s.prefill_seconds).put(s.decode_seconds).put_vector(s.ttft_seconds);
  w.put_vector(s.tpot_seconds);
  return w.bytes();
}

EngineStats decode_work_stats(std::string_view bytes) {
  ByteReader r(bytes);
  EngineStats s;
  s.requests = size_t(r.get<uint64_t>());
  s.failed = size_t(r.get<uint64_t>());
  PARITY_CHECK(s.failed <= s.requests, "MPI message: {} of {} requests failed", s.failed,
               s.requests);
  for (int64_t* count :
       {&s.prompt_tokens, &s.generated_tokens, &s.prefill_rows, &s.decode_rows, &s.steps}) {
    *count = r.get<int64_t>();
    PARITY_CHECK(*count >= 0, "MPI message: a count of {}", *count);
  }
  for (double* seconds : {&s.wall_seconds, &s.prefill_seconds, &s.decode_seconds}) {
    *seconds = r.get<double>();
    check_time(*seconds, "a time");
  }
  s.ttft_seconds = r.get_vector<double>();
  s.tpot_seconds = r.get_vector<double>();
  for (const std::vector<double>* times : {&s.ttft_seconds, &s.tpot_seconds})
    for (const double t : *times) check_time(t, "a request's time");
  check_done(r);
  return s;
}

}  // namespace parity
