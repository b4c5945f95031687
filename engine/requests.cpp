#include "engine/requests.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <charconv>
#include <climits>
#include <optional>

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

namespace {

// Calls line(number, raw) for each line of `text` (numbered from 1; a final line without a
// newline counts; a trailing \r is dropped).
template <typename F>
void for_each_line(std::string_view text, F&& line) {
  size_t start = 0;
  int number = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(start, end - start);
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    line(++number, raw);
    start = end + 1;
  }
}

// v as an integer in [lo, hi], or nullopt: not an integer (1.0, "1", true) or out of range.
std::optional<int64_t> json_integer_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) return std::nullopt;
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

// The keys of a JSON request line.
constexpr std::string_view kJsonRequestKeys = "prompt, prompt_token_ids, max_tokens, ignore_eos";

// One JSON request line into r (r.error set when it cannot run).
void parse_json_request(std::string_view raw, RequestLine& r) {
  if (const size_t bad = utf8_invalid_offset(raw); bad != std::string_view::npos) {
    r.error = fmt::format("invalid UTF-8 at byte {} of the line", bad + 1);
    return;
  }
  if (raw.find_first_not_of(" \t") == std::string_view::npos) {
    r.error = "empty line (a JSON object is expected)";
    return;
  }
  static const std::string kSource = "request";
  nlohmann::json j;
  try {
    j = parse_json(raw, kSource);
  } catch (const Error& e) {
    // parse_json names its source first: the line's number says it here.
    std::string_view what = e.what();
    if (what.substr(0, kSource.size() + 2) == kSource + ": ")
      what.remove_prefix(kSource.size() + 2);
    r.error = std::string(what);
    return;
  }
  if (!j.is_object()) {
    r.error = fmt::format("not a JSON object: {}", json_excerpt(j));
    return;
  }
  for (const auto& [key, value] : j.items())
    if (key != "prompt" && key != "prompt_token_ids" && key != "max_tokens" &&
        key != "ignore_eos") {
      r.error = fmt::format("unknown key {} (the keys are {})", quoted(key, 40), kJsonRequestKeys);
      return;
    }
  const auto text = j.find("prompt");
  const auto ids = j.find("prompt_token_ids");
  if (text == j.end() && ids == j.end()) {
    r.error = "no prompt: \"prompt\" (text) or \"prompt_token_ids\" (token ids) is required";
    return;
  }
  if (text != j.end() && ids != j.end()) {
    r.error = "both \"prompt\" and \"prompt_token_ids\": give one of them";
    return;
  }
  if (text != j.end()) {
    if (!text->is_string()) {
      r.error = fmt::format("\"prompt\" must be a string, not {}", json_excerpt(*text));
      return;
    }
    r.prompt = text->get<std::string>();
    if (r.prompt.empty()) {
      r.error = "empty prompt";
      return;
    }
  } else {
    if (!ids->is_array()) {
      r.error = fmt::format("\"prompt_token_ids\" must be an array of token ids, not {}",
                            json_excerpt(*ids));
      return;
    }
    if (ids->empty()) {
      r.error = "empty prompt (\"prompt_token_ids\" holds no id)";
      return;
    }
    r.prompt_ids.reserve(ids->size());
    for (size_t i = 0; i < ids->size(); ++i) {
      const std::optional<int64_t> id = json_integer_in((*ids)[i], 0, kMaxTokenId - 1);
      if (!id) {
        r.error = fmt::format("\"prompt_token_ids\"[{}]: {} is not a token id (0 to {})", i,
                              json_excerpt((*ids)[i]), kMaxTokenId - 1);
        return;
      }
      r.prompt_ids.push_back(TokenId(*id));
    }
  }
  if (const auto n = j.find("max_tokens"); n != j.end()) {
    const std::optional<int64_t> count = json_integer_in(*n, 1, INT32_MAX);
    if (!count) {
      r.error = fmt::format("\"max_tokens\" must be a whole number from 1 to {}, not {}", INT32_MAX,
                            json_excerpt(*n));
      return;
    }
    r.max_tokens = int(*count);
  }
  if (const auto e = j.find("ignore_eos"); e != j.end()) {
    if (!e->is_boolean()) {
      r.error = fmt::format("\"ignore_eos\" must be true or false, not {}", json_excerpt(*e));
      return;
    }
    r.ignore_eos = e->get<bool>();
  }
}

}  // namespace

std::vector<RequestLine> parse_requests(std::string_view text) {
  std::vector<RequestLine> lines;
  for_each_line(text, [&](int number, std::string_view raw) {
    RequestLine r;
    r.line = number;
    if (const size_t bad = utf8_invalid_offset(raw); bad != std::string_view::npos) {
      r.error = fmt::format("invalid UTF-8 at byte {} of the line", bad + 1);
    } else if (unescape_prompt(raw, r.prompt, r.error) && r.prompt.empty()) {
      r.error = "empty prompt";
    }
    if (!r.error.empty()) r.prompt.clear();
    lines.push_back(std::move(r));
  });
  return lines;
}

std::vector<RequestLine> parse_jsonl_requests(std::string_view text) {
  std::vector<RequestLine> lines;
  for_each_line(text, [&](int number, std::string_view raw) {
    RequestLine r;
    r.line = number;
    parse_json_request(raw, r);
    if (!r.error.empty()) {  // nothing of a line that cannot run is kept but its error
      RequestLine failed;
      failed.line = number;
      failed.error = std::move(r.error);
      r = std::move(failed);
    }
    lines.push_back(std::move(r));
  });
  return lines;
}

bool is_jsonl_request_file(std::string_view path) {
  constexpr std::string_view kSuffix = ".jsonl";
  return path.size() >= kSuffix.size() && path.substr(path.size() - kSuffix.size()) == kSuffix;
}

std::vector<RequestLine> read_request_file(const std::string& path) {
  const std::string text = read_small_file(path, kMaxRequestFileBytes, "request file");
  return is_jsonl_request_file(path) ? parse_jsonl_requests(text) : parse_requests(text);
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
