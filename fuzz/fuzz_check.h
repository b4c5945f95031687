// What every fuzz target asserts beyond "no crash". A broken invariant traps, which libFuzzer
// saves as a crash input (scripts/fuzz.sh reports it as a finding).
#pragma once
#include <cstddef>
#include <string_view>

#include "model/error.h"

#define FUZZ_REQUIRE(cond)         \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

namespace parity::fuzz {

// A refusal is one line, and short: quoted() caps what an untrusted value contributes (escapes
// can make a capped value up to 4x longer than its cap, hence the margin).
inline void check_message(const parity::Error& e, size_t max_bytes = 1024) {
  const std::string_view m = e.what();
  FUZZ_REQUIRE(!m.empty() && m.size() < max_bytes);
  FUZZ_REQUIRE(m.find('\n') == std::string_view::npos);
}

}  // namespace parity::fuzz
