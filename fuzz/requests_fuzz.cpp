// Fuzzes the getp request file (engine/requests.h): parse_requests over any bytes, and the output
// line of each request.
//
// Beyond "no crash": one RequestLine per line of the file, numbered 1, 2, ... in order; a line
// is either a prompt (non-empty, no error) or an error whose text is one line; escape_text of a
// prompt holds no control byte; an output line (format_outcome) holds no newline, so the output
// keeps one line per request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/requests.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<parity::RequestLine> lines = parity::parse_requests(text);
  int expected = 1;
  for (const auto& r : lines) {
    FUZZ_REQUIRE(r.line == expected++);
    if (r.error.empty()) {
      FUZZ_REQUIRE(!r.prompt.empty());
      // The output's escaped text holds no control byte: one line, whatever the prompt held.
      for (char c : parity::escape_text(r.prompt)) FUZZ_REQUIRE(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    } else {
      FUZZ_REQUIRE(r.error.find('\n') == std::string::npos);
    }
    parity::RequestOutcome outcome;
    outcome.line = r.line;
    outcome.error = r.error;
    outcome.text = r.prompt;
    outcome.tokens = {1, 2, 3};
    FUZZ_REQUIRE(parity::format_outcome(outcome, true).find('\n') == std::string::npos);
  }
  return 0;
}
