// The o200k_harmony tokenizer of gpt-oss, read from a Hugging Face tokenizers `tokenizer.json`
// (the file the hub's openai/gpt-oss-20b ships, or one written by tools/tokenizer_oracle):
//
//   model          BPE, byte-level: `vocab` maps GPT-2 byte-to-unicode strings to ids, `merges`
//                  ("a b" strings or ["a", "b"] pairs) in priority order, `ignore_merges`
//   added_tokens   the special tokens (<|start|> 200006, <|end|> 200007, ...), matched literally
//   pre_tokenizer  Sequence[Split(Regex, "Isolated"), ByteLevel(use_regex false)], or a lone
//                  ByteLevel with use_regex (GPT-2's pattern); normalizer none; decoder ByteLevel
//
// Encoding is tiktoken's: split on the special tokens (when allowed), cut each span between them
// into pieces with the regex (PCRE2, UTF + UCP, JIT-compiled where PCRE2 has a JIT), then byte-pair
// merge each piece's bytes, always the adjacent pair of lowest merge rank, leftmost on a tie. A
// piece that is a whole token is that token when `ignore_merges` is set (o200k: it is).
//
// Where the regex engines differ (tokenizer/pretokenizer.h): U+0085 (NEL) is whitespace here as in
// tiktoken's Rust regex, not in PCRE2 alone. JavaScript (js-tiktoken, the oracle of
// tests/tokenizer_test.cpp) counts U+FEFF and not U+0085 as \s, and matches the contractions
// ('s, 't, ...) in ASCII only where tiktoken and PCRE2 fold case over Unicode ('ſ is 's): the
// oracle corpus avoids those few characters. Letters newer than PCRE2's Unicode tables (10.42:
// Unicode 14) are symbols to it.
//
// Every load error is one parity::Error naming the file and what is wrong. A Tokenizer is
// immutable after load; encode and decode may be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace parity {

using TokenId = int32_t;

// The largest tokenizer.json read: the real o200k_harmony one is about 27 MB.
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t(64) << 20;
// Ids are below this (o200k_harmony: 201088); a larger one in a file is an error, not an
// allocation.
inline constexpr TokenId kMaxTokenId = TokenId(1) << 24;

class Tokenizer {
 public:
  // A tokenizer.json file (a regular file of at most kMaxTokenizerJsonBytes).
  static Tokenizer load(const std::string& path);
  // The same from its text; `source` names it in errors.
  static Tokenizer parse(std::string_view json_text, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of UTF-8 `text`. allow_special: the added tokens marked special (<|start|>, ...)
  // in the text become their ids; otherwise they are ordinary text (as tiktoken's
  // encode_ordinary: what a user typed can never inject a control token). Invalid UTF-8 is an
  // Error naming the byte offset.
  std::vector<TokenId> encode(std::string_view text, bool allow_special) const;

  // The bytes of `ids` concatenated (special tokens as their text). A cut through a multi-byte
  // character leaves partial UTF-8: StreamingDecoder deals with that. An id that is not in the
  // vocabulary is an Error naming it and its index.
  std::string decode(std::span<const TokenId> ids) const;

  // The bytes of one token; an Error when `id` is not in the vocabulary.
  std::string_view token_bytes(TokenId id) const;
  bool contains(TokenId id) const;
  bool is_special(TokenId id) const;  // an added token marked special

  // The id of an added token by its text ("<|start|>"), if the file has it.
  std::optional<TokenId> find_added(std::string_view content) const;
  // The same, or an Error naming the file and the missing token.
  TokenId added(std::string_view content) const;

  // The regex pieces of `text` (no special-token handling): what BPE runs on.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  TokenId id_end() const;      // one past the largest id
  size_t token_count() const;  // ids in use
  size_t merge_count() const;
  bool regex_jit() const;  // whether PCRE2 JIT-compiled the pattern
  const std::string& source() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Text out of a stream of generated ids: push() returns what became complete text, holding back
// the bytes of a character whose tokens have not all arrived yet (an emoji's four bytes can come
// in two tokens). Bytes that can never become a character are replaced by U+FFFD, so the output
// is always valid UTF-8; finish() flushes what is held back (as U+FFFD). One per sequence; the
// tokenizer must outlive it.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(TokenId id);  // an Error on an id not in the vocabulary
  std::string finish();
  size_t held_back() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;  // the start of an incomplete character: at most 3 bytes
};

// `path` itself when it names a file, else <path>/tokenizer.json: a model directory as the hub
// has it, or a tokenizer-only directory (parity-synth --tokenizer-only). An Error with the way
// out when there is none.
std::string find_tokenizer_json(const std::string& path);

// The GPT-2 byte-to-unicode mapping of byte-level BPE: `bytes` as the string the vocab and the
// merges of tokenizer.json hold.
std::string byte_level_string(std::string_view bytes);

}  // namespace parity
