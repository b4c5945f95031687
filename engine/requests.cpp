#include "engine/requests.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/utf8.h"
#include "model/error.h"

namespace parity {

bool unescape_prompt(std::string_view line, std::string& out, std::string& error) {
  out.clear();
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\') {
      out.push_back(line[i]);
      continue;
    }
    if (i + 1 == line.size()) {
      error = fmt::format("a lone backslash at column {} (write \\\\ for a backslash)", i + 1);
      return false;
    }
    const char next = line[++i];
    if (next == 'n') {
      out.push_back('\n');
    } else if (next == '\\') {
      out.push_back('\\');
    } else {
      error = fmt::format("unknown escape at column {} (only \\n and \\\\)", i);
      return false;
    }
  }
  return true;
}

std::vector<RequestLine> parse_requests(std::string_view text) {
  std::vector<RequestLine> lines;
  size_t start = 0;
  int number = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(start, end - start);
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    RequestLine r;
    r.line = ++number;
    if (const size_t bad = utf8_invalid_offset(raw); bad != std::string_view::npos) {
      r.error = fmt::format("invalid UTF-8 at byte {} of the line", bad + 1);
    } else if (unescape_prompt(raw, r.prompt, r.error) && r.prompt.empty()) {
      r.error = "empty prompt";
    }
    if (!r.error.empty()) r.prompt.clear();
    lines.push_back(std::move(r));
    start = end + 1;
  }
  return lines;
}

std::vector<RequestLine> read_request_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read the request file {}: {}", path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("cannot read the request file {}: read error", path);
  return parse_requests(s.str());
}

std::string escape_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    switch (ch) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(ch));
        else
          out.push_back(ch);
    }
  }
  return out;
}

std::string format_outcome(const RequestOutcome& o, bool with_text) {
  if (!o.error.empty()) return fmt::format("ERROR line {}: {}", o.line, escape_text(o.error));
  std::string s = fmt::format("{}", fmt::join(o.tokens, " "));
  if (with_text) s += "\t" + escape_text(o.text);
  return s;
}

}  // namespace parity
