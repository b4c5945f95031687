// The getp request file and its output.
//
// Input: one prompt per line, UTF-8; `\n` in a line is a newline of the prompt, `\\` a
// backslash (any other backslash sequence is an error for that line). A final line without a
// newline counts; a trailing `\r` (a CRLF file) is dropped. A line that cannot run -- invalid
// UTF-8, a bad escape, an empty prompt, a prompt longer than the context once tokenized -- is an
// error for that request alone, named by its line number (from 1); the other lines still run.
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
  int line = 0;        // 1-based line number in the file
  std::string prompt;  // the unescaped prompt, when error is empty
  std::string error;   // why this line cannot run, or empty
};

// The lines of `text` (the whole file), each unescaped and checked (UTF-8, escapes, empty).
std::vector<RequestLine> parse_requests(std::string_view text);

// Reads and parses a request file: a regular file (a FIFO would block, a directory would read
// as empty) of at most kMaxRequestFileBytes; anything else is one parity::Error naming it.
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
