// What every fuzz target asserts beyond "no crash". A broken invariant traps, which libFuzzer
// saves as a crash input (scripts/fuzz.sh reports it as a finding).
#pragma once
#include <stdlib.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

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

// A fresh directory under the system temp dir (named `tag`-XXXXXX) for a target's scratch files,
// removed with its contents at process exit. Call it once per directory (fuzz targets run on one
// thread).
inline std::string process_temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  static std::vector<std::string> dirs;
  std::string dir = (fs::temp_directory_path() / (tag + "-XXXXXX")).string();
  if (::mkdtemp(dir.data()) == nullptr) std::abort();
  dirs.push_back(dir);
  if (dirs.size() == 1)
    std::atexit([] {
      for (const std::string& d : dirs) {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    });
  return dir;
}

}  // namespace parity::fuzz
