#include "tokenizer/utf8.h"

namespace parity {

Utf8Step utf8_step(std::string_view s) {
  const auto byte = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) return {Utf8Status::ok, 1, char32_t(b0)};
  // Length and the valid range of the second byte (RFC 3629 table): E0 and F0 exclude overlong
  // forms, ED the surrogates, F4 everything above U+10FFFF.
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t c = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Status::invalid, 1, 0};  // a continuation byte, C0, C1 or F5..FF
  }
  for (size_t i = 1; i < n; ++i) {
    if (i >= s.size()) return {Utf8Status::incomplete, i, 0};
    const uint8_t b = byte(i);
    if (b < lo || b > hi) return {Utf8Status::invalid, i, 0};
    c = (c << 6) | (b & 0x3F);
    lo = 0x80;
    hi = 0xBF;
  }
  return {Utf8Status::ok, n, c};
}

size_t utf8_invalid_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {  // ASCII runs are the common case
      ++i;
      continue;
    }
    const Utf8Step step = utf8_step(s.substr(i));
    if (step.status != Utf8Status::ok) return i;
    i += step.length;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step step = utf8_step(s.substr(i));
    if (step.status == Utf8Status::ok)
      out.append(s.substr(i, step.length));
    else
      append_utf8(out, 0xFFFD);
    i += step.length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

}  // namespace parity
