#include "model/untrusted.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>

#include "model/error.h"

namespace parity {

std::string Quoted::operator()(std::string_view s, size_t cap) const {
  // The cap is on what is shown: an escaped byte counts as the characters it takes.
  std::string body;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::string piece;
    switch (c) {
      case '\n': piece = "\\n"; break;
      case '\r': piece = "\\r"; break;
      case '\t': piece = "\\t"; break;
      case '"': piece = "\\\""; break;
      case '\\': piece = "\\\\"; break;
      default:
        piece = c < 0x20 || c >= 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
    }
    if (body.size() + piece.size() > cap) break;
    body += piece;
  }
  std::string out = "\"" + body + "\"";
  if (i < s.size()) out += fmt::format("... ({} more bytes)", s.size() - i);
  return out;
}

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

// Untrusted bytes as printable UTF-8: C0 and C1 controls, DEL and the bytes of invalid UTF-8 as
// \xNN; newline and tab kept when `keep_lines`, else newline and carriage return as \n and \r.
std::string escape_untrusted(std::string_view s, bool keep_lines) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 1 && !keep_lines && (c == '\n' || c == '\r')) {
      out += c == '\n' ? "\\n" : "\\r";
      ++i;
      continue;
    }
    // C1 controls (U+0080..U+009F) are two bytes, C2 80..C2 9F: a terminal reads U+009B as CSI.
    const bool kept_control = keep_lines && (c == '\n' || c == '\t');
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
    const bool control = n == 1 ? (c < 0x20 && !kept_control) || c == 0x7f : c1;
    const size_t take = n == 0 ? 1 : n;
    if (n == 0 || control) {
      for (size_t k = 0; k < take; ++k)
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i + k]));
    } else {
      out.append(s.substr(i, n));
    }
    i += take;
  }
  return out;
}

}  // namespace

std::string printable_text(std::string_view bytes) { return escape_untrusted(bytes, true); }

std::string one_line(std::string_view m, size_t cap) {
  const size_t n = std::min(m.size(), cap);
  std::string out = escape_untrusted(m.substr(0, n), false);
  if (m.size() > n) out += fmt::format("... ({} more bytes)", m.size() - n);
  return out;
}

uint64_t require_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    struct stat link {};
    if (error == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      fail("{}: a symbolic link to a file that does not exist (the {})", path, what);
    if (error == ENOENT) fail("{}: no such file (the {})", path, what);
    errno = error;
    fail("{}: cannot access the {} ({})", path, what, std::strerror(errno));
  }
  const bool named_file = what.size() >= 4 && what.substr(what.size() - 4) == "file";
  if (S_ISDIR(st.st_mode))
    fail("{}: is a directory, not the {}{}", path, what, named_file ? "" : " file");
  if (!S_ISREG(st.st_mode))
    fail("{}: is not a regular file (a FIFO, socket or device), so it cannot be the {}", path,
         what);
  const uint64_t size = uint64_t(st.st_size);
  if (size > max_bytes)
    fail("{}: {} bytes, larger than any {} can be ({} bytes at most)", path, size, what, max_bytes);
  return size;
}

std::string read_small_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  const uint64_t size = require_regular_file(path, max_bytes, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the {} ({})", path, what, std::strerror(errno));
  std::string text(size, '\0');
  in.read(text.data(), std::streamsize(size));
  if (!in || uint64_t(in.gcount()) != size)
    fail("{}: reading the {} failed after {} of {} bytes", path, what, in.gcount(), size);
  return text;
}

std::string json_excerpt(const nlohmann::json& v) {
  if (v.is_string()) return quoted(v.get_ref<const std::string&>(), 60);
  if (v.is_structured() && v.size() > 16)
    return fmt::format("{} of {} elements", v.type_name(), v.size());
  return quoted(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 60);
}

namespace {
// The deepest nesting of arrays and objects in `text`, stopping as soon as it passes max_depth;
// brackets inside strings do not count. Linear, and no recursion: what it refuses never reaches
// the parser.
bool nesting_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}
}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth) {
  // nlohmann's lexer takes a NUL byte for the end of the input, so "{}\0garbage" would pass as
  // "{}"; JSON text holds no NUL anywhere (not even inside a string), so one is refused here.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail("{}: not valid JSON (byte {}: a NUL byte{})", source, nul + 1,
         nul + 1 == text.size() ? " at the end" : ", with more bytes after it");
  // The depth is checked by a scan of its own before parsing, not by a parser callback: with a
  // callback, nlohmann's DOM parser looks through the enclosing container for discarded values
  // at the end of every object, which made an array of n objects O(n^2) (100,000 added tokens
  // of a tokenizer.json took 10 s).
  if (!nesting_within(text, max_depth))
    fail("{}: JSON nested deeper than {} levels", source, max_depth);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON (byte {}: {})", source, e.byte, quoted(e.what(), 120));
  } catch (const nlohmann::json::out_of_range& e) {
    fail("{}: a number in the JSON is out of range ({})", source, quoted(e.what(), 120));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot read the JSON ({})", source, quoted(e.what(), 120));
  }
}

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  // std::from_chars, not strtoull: no leading space, no sign (strtoull reads " -5" as 2^64 - 5).
  static constexpr std::string_view kSuffixes = "KMGkmg";
  std::string_view digits = text;
  uint64_t scale = 1;
  if (!digits.empty()) {
    if (const size_t s = kSuffixes.find(digits.back()); s != std::string_view::npos) {
      scale = uint64_t(1) << (10 * (s % 3 + 1));
      digits.remove_suffix(1);
    }
  }
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  uint64_t bytes = 0;
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value == 0 ||
      __builtin_mul_overflow(value, scale, &bytes))
    fail(
        "{} {}: not a positive number of bytes (digits with an optional K, M or G suffix, below "
        "2^64 bytes)",
        what, quoted(text, 40));
  return bytes;
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: {} x {} does not fit in 64 bits", what, a, b);
  return r;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: {} + {} does not fit in 64 bits", what, a, b);
  return r;
}

}  // namespace parity
