// Fuzzes the token id files of `run -m detokenize` (engine/requests.h decode_token_id_file) with
// the tiny preset's tokenizer (built once): the input is the file's bytes.
//
// Beyond "no crash": a refusal is one parity::Error line naming the file and a line number
// within it; an accepted file holds only decimal digits and white space, and its text is the
// concatenation of its ids' bytes (each id decoded alone, in order).
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/requests.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "fuzz/fuzz_check.h"
#include "model/error.h"

namespace {

const std::string kSource = "fuzz/ids.txt";

const parity::Tokenizer& tiny() {
  static const parity::Tokenizer t =
      parity::Tokenizer::parse(parity::tiny_tokenizer_json(1024), "tiny");
  return t;
}

bool space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string decoded;
  try {
    decoded = parity::decode_token_id_file(text, kSource, tiny());
  } catch (const parity::Error& e) {
    parity::fuzz::check_message(e);
    FUZZ_REQUIRE(std::string_view(e.what()).rfind(kSource + ": line ", 0) == 0);
    return 0;
  }
  std::string expected;
  size_t i = 0;
  while (i < text.size()) {
    if (space(text[i])) {
      ++i;
      continue;
    }
    int id = 0;
    size_t digits = 0;
    for (; i < text.size() && !space(text[i]); ++i, ++digits) {
      FUZZ_REQUIRE(text[i] >= '0' && text[i] <= '9');
      id = id * 10 + (text[i] - '0');
      FUZZ_REQUIRE(id < tiny().id_end());  // an accepted id is in the vocabulary
    }
    FUZZ_REQUIRE(digits > 0);
    expected += tiny().token_bytes(id);
  }
  FUZZ_REQUIRE(decoded == expected);
  return 0;
}
