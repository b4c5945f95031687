#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include "tokenizer/utf8.h"
#include "model/error.h"
#include "model/untrusted.h"

namespace parity {
namespace {

struct CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataFree {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextFree {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};
struct JitStackFree {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  if (pcre2_get_error_message(code, buf.data(), buf.size()) < 0)
    return fmt::format("code {}", code);
  return reinterpret_cast<const char*>(buf.data());
}

}  // namespace

struct PreTokenizer::Impl {
  std::string source;
  std::unique_ptr<pcre2_code, CodeFree> code;
  bool jit = false;
};

PreTokenizer::PreTokenizer(std::string_view pattern, bool literal, const std::string& source)
    : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  const std::string compiled = literal ? std::string(pattern) : with_nel_as_space(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                  literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP,
                                  &error, &offset, nullptr));
  if (!impl_->code)
    fail("{}: the regex {} does not compile with PCRE2 (at offset {}: {})", source,
         quoted(pattern, 120), offset, pcre2_message(error));
  impl_->jit = pcre2_jit_compile(impl_->code.get(), PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

bool PreTokenizer::jit() const {
  return impl_->jit;
}

// Every match a piece, and the text between matches; an empty match makes none.
std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  pcre2_code* regex = impl_->code.get();
  std::unique_ptr<pcre2_match_data, MatchDataFree> md(
      pcre2_match_data_create_from_pattern(regex, nullptr));
  if (!md) fail("{}: out of memory for the regex match data", impl_->source);
  // PCRE2's JIT starts with a 32 KiB stack; an input that needs more gets a larger one.
  std::unique_ptr<pcre2_match_context, MatchContextFree> context;
  std::unique_ptr<pcre2_jit_stack, JitStackFree> stack;
  const auto match_at = [&](size_t pos) {
    return pcre2_match(regex, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                       PCRE2_NO_UTF_CHECK, md.get(), context.get());
  };
  std::vector<std::string_view> pieces;
  size_t pos = 0, emitted = 0;
  while (pos < text.size()) {
    int rc = match_at(pos);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !stack) {
      context.reset(pcre2_match_context_create(nullptr));
      stack.reset(pcre2_jit_stack_create(size_t(32) << 10, size_t(64) << 20, nullptr));
      if (!context || !stack) fail("{}: out of memory for the regex stack", impl_->source);
      pcre2_jit_stack_assign(context.get(), nullptr, stack.get());
      rc = match_at(pos);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      fail("{}: the pre-tokenizer regex failed at byte {} of a {}-byte text ({})", impl_->source,
           pos, text.size(), pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
    const size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match: step over one character
      pos = start + utf8_step(text.substr(start)).length;
      continue;
    }
    if (start > emitted) pieces.push_back(text.substr(emitted, start - emitted));
    pieces.push_back(text.substr(start, end - start));
    emitted = pos = end;
  }
  if (emitted < text.size()) pieces.push_back(text.substr(emitted));
  return pieces;
}

std::string with_nel_as_space(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (e == 'Q') {  // \Q...\E: literal text, copied as it is
        const size_t end = p.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out += p.substr(i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out += p.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace parity
