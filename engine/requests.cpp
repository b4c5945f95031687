#include "engine/requests.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <charconv>

#include "tokenizer/utf8.h"
#include "model/error.h"
#include "model/untrusted.h"

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
  return parse_requests(read_small_file(path, kMaxRequestFileBytes, "request file"));
}

std::string decode_token_id_file(std::string_view text, const std::string& source,
                                 const Tokenizer& tokenizer) {
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<TokenId> ids;
  int line = 1;
  size_t i = 0;
  while (i < text.size()) {
    if (is_space(text[i])) {
      line += text[i++] == '\n' ? 1 : 0;
      continue;
    }
    size_t end = i;
    while (end < text.size() && !is_space(text[end])) ++end;
    const std::string_view word = text.substr(i, end - i);
    // Unsigned: std::from_chars takes no sign for it, so "-0" and "+1" are refused.
    uint64_t id = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ptr != word.data() + word.size() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range))
      fail("{}: line {}: {} is not a token id (a decimal number)", source, line, quoted(word, 40));
    if (ec != std::errc() || id >= uint64_t(tokenizer.id_end()) || !tokenizer.contains(TokenId(id)))
      fail("{}: line {}: token id {} is not in the vocabulary of {} (ids 0..{})", source, line,
           quoted(word, 24), tokenizer.source(), tokenizer.id_end() - 1);
    ids.push_back(TokenId(id));
    i = end;
  }
  return tokenizer.decode(ids);
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
