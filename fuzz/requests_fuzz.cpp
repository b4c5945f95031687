// Fuzzes the getp request file (engine/requests.h) in both forms, on the same bytes: the text
// form (parse_requests) and the JSON Lines form (parse_jsonl_requests), and the output line of
// each request.
//
// Beyond "no crash": one RequestLine per line of the file, numbered 1, 2, ... in order, the same
// count in both forms; a line is either a request (exactly one non-empty prompt form, a valid
// max_tokens, no error) or an error whose text is one line and which keeps nothing else; a text
// line has no ids, no max_tokens and no ignore_eos; escape_text of a prompt holds no control
// byte; an output line (format_outcome) holds no newline, so the output keeps one line per
// request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/requests.h"
#include "fuzz/fuzz_check.h"

namespace {

void check_lines(const std::vector<parity::RequestLine>& lines, bool jsonl) {
  int expected = 1;
  for (const auto& r : lines) {
    FUZZ_REQUIRE(r.line == expected++);
    if (r.error.empty()) {
      FUZZ_REQUIRE(r.prompt.empty() != r.prompt_ids.empty());
      FUZZ_REQUIRE(r.max_tokens >= 0);
      for (const parity::TokenId id : r.prompt_ids)
        FUZZ_REQUIRE(id >= 0 && id < parity::kMaxTokenId);
      if (!jsonl) FUZZ_REQUIRE(r.prompt_ids.empty() && r.max_tokens == 0 && !r.ignore_eos);
      // The output's escaped text holds no control byte: one line, whatever the prompt held.
      for (char c : parity::escape_text(r.prompt))
        FUZZ_REQUIRE(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    } else {
      FUZZ_REQUIRE(r.error.find('\n') == std::string::npos);
      FUZZ_REQUIRE(r.prompt.empty() && r.prompt_ids.empty() && r.max_tokens == 0);
    }
    parity::RequestOutcome outcome;
    outcome.line = r.line;
    outcome.error = r.error;
    outcome.text = r.prompt;
    outcome.tokens = {1, 2, 3};
    FUZZ_REQUIRE(parity::format_outcome(outcome, true).find('\n') == std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<parity::RequestLine> lines = parity::parse_requests(text);
  const std::vector<parity::RequestLine> json_lines = parity::parse_jsonl_requests(text);
  FUZZ_REQUIRE(lines.size() == json_lines.size());
  check_lines(lines, false);
  check_lines(json_lines, true);
  return 0;
}
