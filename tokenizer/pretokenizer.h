// The pre-tokenizer of byte-level BPE: a regex cuts text into the pieces BPE merges within. Run
// through PCRE2 (8-bit, UTF + UCP, JIT-compiled where PCRE2 has a JIT), never a matcher of our
// own. Each match is a piece, and so is any text between matches (Hugging Face's "Isolated"
// split; the o200k pattern matches every character, so there is none).
//
// \s: PCRE2 under UCP counts Unicode's Z category and \t\n\v\f\r; tiktoken's Rust regex (Unicode
// White_Space) and Hugging Face's Oniguruma also count U+0085 (NEL). The pattern is compiled with
// NEL added to \s and taken out of \S, so pieces are cut as tiktoken cuts them.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace parity {

class PreTokenizer {
 public:
  // `pattern`: a regex, or literal text when `literal`. A pattern PCRE2 does not compile is an
  // Error naming `source`, where it stops and why.
  PreTokenizer(std::string_view pattern, bool literal, const std::string& source);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // The pieces of valid UTF-8 `text`, in order, pointing into it (together they are all of it).
  // Safe to call from several threads at once.
  std::vector<std::string_view> split(std::string_view text) const;

  bool jit() const;  // whether PCRE2 JIT-compiled the pattern (else its interpreter runs)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `pattern` with U+0085 in \s and out of \S (outside character classes; \S inside one is left as
// it is: neither the o200k nor GPT-2's pattern has one).
std::string with_nel_as_space(std::string_view pattern);

}  // namespace parity
