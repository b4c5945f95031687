// Escaping of untrusted bytes for the reports (tracer/escape.h).
#include "tracer/escape.h"

#include <fmt/format.h>

namespace parity {
namespace {

// The length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when the bytes there
// are not one: a stray continuation byte, an overlong form, a surrogate, a code point past
// U+10FFFF, or a sequence cut short.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  return n;
}

void append_escaped(std::string& out, std::string_view bytes) {
  for (unsigned char c : bytes) out += fmt::format("\\x{:02x}", c);
}

}  // namespace

std::string printable_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    // C1 controls (U+0080..U+009F) are two bytes, C2 80..C2 9F: a terminal reads U+009B as CSI.
    const bool control = n == 1
                             ? (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f
                             : n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
    if (n == 0) {
      append_escaped(out, s.substr(i, 1));
      ++i;
    } else if (control) {
      append_escaped(out, s.substr(i, n));
      i += n;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string markup_text(std::string_view bytes) {
  std::string out;
  for (char c : printable_text(bytes)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace parity
