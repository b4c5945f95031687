#include "model/untrusted.h"

#include <sys/stat.h>

#include <cerrno>
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

std::string one_line(std::string_view m, size_t cap) {
  std::string out;
  const size_t n = std::min(m.size(), cap);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(m[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  if (m.size() > n) out += fmt::format("... ({} more bytes)", m.size() - n);
  return out;
}

uint64_t require_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail("{}: no such file (the {})", path, what);
    fail("{}: cannot access the {} ({})", path, what, std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not the {} file", path, what);
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

nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth) {
  // The callback sees every nesting level as it opens; refusing there keeps the parser's own
  // recursion (and the later destruction) shallow.
  const nlohmann::json::parser_callback_t limit = [&](int d, nlohmann::json::parse_event_t e,
                                                      nlohmann::json&) {
    if ((e == nlohmann::json::parse_event_t::object_start ||
         e == nlohmann::json::parse_event_t::array_start) &&
        d + 1 > max_depth)
      throw std::length_error("depth");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit);
  } catch (const std::length_error&) {
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON (byte {}: {})", source, e.byte, quoted(e.what(), 120));
  } catch (const nlohmann::json::out_of_range& e) {
    fail("{}: a number in the JSON is out of range ({})", source, quoted(e.what(), 120));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot read the JSON ({})", source, quoted(e.what(), 120));
  }
  fail("{}: JSON nested deeper than {} levels", source, max_depth);
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
