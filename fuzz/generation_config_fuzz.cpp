// Fuzzes generation_config.json reading (engine/engine.h generation_config_stop_tokens): the
// input is the file's bytes, read as `run` reads them (parse_json: bounded nesting, numbers in
// range, no bytes after a NUL), then its eos_token_id.
//
// Beyond "no crash, no hang, no unbounded allocation": a refusal is one parity::Error line that
// names the file; an accepted file's stop tokens are token ids (0 <= id < kMaxTokenId), and the
// same bytes read twice give the same tokens.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "fuzz/fuzz_check.h"
#include "model/error.h"

namespace {
const std::string kSource = "fuzz/generation_config.json";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<parity::TokenId> ids;
  try {
    ids = parity::generation_config_stop_tokens(text, kSource);
  } catch (const parity::Error& e) {
    parity::fuzz::check_message(e);
    FUZZ_REQUIRE(std::string_view(e.what()).rfind(kSource + ": ", 0) == 0);
    return 0;
  }
  for (const parity::TokenId id : ids) FUZZ_REQUIRE(id >= 0 && id < parity::kMaxTokenId);
  FUZZ_REQUIRE(parity::generation_config_stop_tokens(text, kSource) == ids);
  return 0;
}
