// The getp request file and its output.
//
// Input, a text file (any name but *.jsonl): one prompt per line, UTF-8; `\n` in a line is a
// newline of the prompt, `\\` a backslash (any other backslash sequence is an error for that
// line). Every request generates up to the run's -n tokens. A final line without a newline counts;
// a trailing `\r` (a CRLF file) is dropped.
//
// Input, a JSON Lines file (a name ending in .jsonl): one JSON object per line, split and
// numbered as a text file's lines:
//   {"prompt": "text", "max_tokens": 200}
//   {"prompt_token_ids": [1, 2, 3], "max_tokens": 200, "ignore_eos": true}
// exactly one of prompt (a non-empty string, tokenized as a text line's prompt) and
// prompt_token_ids (a non-empty array of ids, run as they are); max_tokens (1 to 2^31 - 1) caps
// this request's generated tokens instead of -n; ignore_eos (true or false) keeps it generating
// past stop tokens up to max_tokens, as vLLM's benchmark does. No other key.
//
// Either way, a line that cannot run -- invalid UTF-8, a bad escape, an empty prompt, invalid
// JSON (a NUL byte, nesting deeper than kMaxJsonDepth, bytes after the object), a missing or
// doubled prompt, a value of the wrong type, an unknown key; and, found by the engine, a prompt
// longer than the context once tokenized, an id outside the model's vocabulary, max_tokens above
// the context -- is an error for that request alone, named by its line number (from 1); the other
// lines still run.
//
// Output: one line per request, in input order: its generated token ids separated by spaces (the
// stop token that ended it included), or `ERROR line N: reason`. With text, a tab and the
// decoded text, escaped (escape_text) follows the ids.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace parity {

struct RequestLine {
  int line = 0;  // 1-based line number in the file
  // When error is empty, exactly one of these is non-empty: the prompt as text (to tokenize), or
  // its token ids (a JSON line's prompt_token_ids, run as they are).
  std::string prompt;
  std::vector<TokenId> prompt_ids;
  int max_tokens = 0;       // generated tokens at most; 0: the run's -n
  bool ignore_eos = false;  // generate past stop tokens, up to the max_tokens
  std::string error;        // why this line cannot run, or empty
};

// The lines of a text request file (`text`, the whole file), each unescaped and checked (UTF-8,
// escapes, empty).
std::vector<RequestLine> parse_requests(std::string_view text);

// The lines of a JSON Lines request file (`text`, the whole file), each parsed as one request
// object and checked as above (the vocabulary and the context are the engine's to check).
std::vector<RequestLine> parse_jsonl_requests(std::string_view text);

// True for a JSON Lines request file: a name ending in .jsonl.
bool is_jsonl_request_file(std::string_view path);

// Reads and parses a request file, text or JSON Lines by its name: a regular file (a FIFO would
// block, a directory would read as empty) of at most kMaxRequestFileBytes; anything else is one
// parity::Error naming it.
inline constexpr uint64_t kMaxRequestFileBytes = uint64_t(1) << 30;
std::vector<RequestLine> read_request_file(const std::string& path);

// A token id file (run -m detokenize), decoded by `tokenizer`: decimal ids (no sign) separated
// by white space. A word that is not one, or an id the tokenizer lacks, is one parity::Error
// naming `source` and the line.
std::string decode_token_id_file(std::string_view text, const std::string& source,
                                 const Tokenizer& tokenizer);

// `\n` -> newline and `\\` -> backslash; false with `error` set on any other escape or a lone
// trailing backslash.
bool unescape_prompt(std::string_view line, std::string& out, std::string& error);

// Text for one output field: backslash, newline, tab and carriage return as \\ \n \t \r, other
// control bytes as \xHH; everything else as is.
std::string escape_text(std::string_view text);

// One output line (without its newline): the ids, or the error; `text` (already decoded) after a
// tab when with_text.
struct RequestOutcome {
  int line = 0;
  std::string error;
  std::vector<TokenId> tokens;
  std::string text;
};
std::string format_outcome(const RequestOutcome& outcome, bool with_text);

}  // namespace parity
