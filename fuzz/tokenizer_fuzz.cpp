// Fuzzes the tokenizer (tokenizer/tokenizer.h): the tokenizer.json reader, and encoding and
// decoding of arbitrary text. An input that starts with '{' is a tokenizer.json; anything else
// is text for the tiny preset's tokenizer (built once).
//
// Beyond "no crash": a rejected file ends in parity::Error with one capped line; an accepted
// tokenizer encodes and decodes its own vocabulary's bytes back. For text: invalid UTF-8 is an
// Error and nothing else; valid text decodes back to itself from encode() with and without
// special tokens; every id is in the vocabulary; the streaming decoder, fed one id at a time,
// gives the same text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "model/error.h"

namespace {

using parity::fuzz::check_message;

const parity::Tokenizer& tiny() {
  static const parity::Tokenizer t = parity::Tokenizer::parse(parity::tiny_tokenizer_json(1024), "tiny");
  return t;
}

void round_trip(const parity::Tokenizer& tok, std::string_view text) {
  for (bool special : {false, true}) {
    std::vector<parity::TokenId> ids;
    try {
      ids = tok.encode(text, special);
    } catch (const parity::Error& e) {
      check_message(e, 2048);  // invalid UTF-8
      return;
    }
    for (parity::TokenId id : ids) FUZZ_REQUIRE(tok.contains(id));
    FUZZ_REQUIRE(tok.decode(ids) == text);
    parity::StreamingDecoder stream(tok);
    std::string streamed;
    for (parity::TokenId id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    FUZZ_REQUIRE(streamed == text);  // valid UTF-8 in, so nothing is replaced
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (size > 0 && input[0] == '{') {
    try {
      const parity::Tokenizer tok = parity::Tokenizer::parse(input, "fuzz/tokenizer.json");
      // Its own vocabulary decodes; a short text of its first tokens goes back and forth when it
      // is valid UTF-8 (byte-level BPE has a token for every byte).
      std::string text;
      for (parity::TokenId id = 0; id < tok.id_end() && text.size() < 64; ++id)
        if (tok.contains(id) && !tok.is_special(id)) text += tok.token_bytes(id);
      round_trip(tok, text);
    } catch (const parity::Error& e) {
      check_message(e, 2048);
    }
    return 0;
  }
  if (size > 4096) return -1;
  round_trip(tiny(), input);
  return 0;
}
