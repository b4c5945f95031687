// UTF-8 as the tokenizer needs it: one step of a strict decoder (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), a validator that names the first bad byte, and the lossy
// conversion that the streaming decoder uses for bytes that can never become text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace parity {

enum class Utf8Status {
  ok,          // a whole, valid sequence of `length` bytes
  incomplete,  // the bytes so far are a valid start, but the input ends before the sequence does
  invalid,     // `length` bytes (at least 1) that no valid sequence starts with: the maximal
               // subpart, as the Unicode standard's "U+FFFD substitution of maximal subparts"
};

struct Utf8Step {
  Utf8Status status;
  size_t length;
  char32_t code_point;  // when ok
};

// The sequence that starts at s[0] (s must not be empty).
Utf8Step utf8_step(std::string_view s);

// Byte offset of the first byte that is not part of valid UTF-8 (a truncated sequence at the end
// counts), or npos when all of `s` is valid.
size_t utf8_invalid_offset(std::string_view s);

// `s` with every invalid subpart (incomplete ones at the end included) replaced by U+FFFD.
std::string utf8_lossy(std::string_view s);

// Appends code point `c` (at most U+10FFFF) in UTF-8.
void append_utf8(std::string& out, char32_t c);

}  // namespace parity
