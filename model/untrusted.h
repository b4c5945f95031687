// Reading what comes from outside: files, JSON, text in error messages. Every reader of user
// input goes through these, so that a hostile or broken input gets one clear line (naming the
// file and what is wrong) and never a hang, a crash or an unbounded allocation.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace parity {

// Untrusted text for an error line: control characters and non-ASCII bytes escaped (\n, \x1b,
// ...), at most `cap` characters shown (escapes included), then "... (N more bytes)"; in double
// quotes.
// A function object, not a function, so that a call with a std::string never finds std::quoted
// by argument-dependent lookup.
struct Quoted {
  std::string operator()(std::string_view untrusted, size_t cap = 80) const;
};
inline constexpr Quoted quoted{};

// A message as one line: control characters (newlines, escapes, C1 controls) and the bytes of
// invalid UTF-8 written as \n, \x1b, \xc2\x9b, \xff ...; longer than `cap` bytes, cut there with
// "... (N more bytes)". Printable text, valid UTF-8 included, is kept.
std::string one_line(std::string_view message, size_t cap = 4000);

// Untrusted bytes for a text report or a terminal: valid UTF-8 with no control character but
// newline and tab. Every other C0 or C1 control character (ESC, BEL, CSI, DEL, ...) and every
// byte of an invalid UTF-8 sequence is written as \xNN; everything else is kept. Idempotent.
// (tracer/escape.h builds the markup and JSON forms of the reports on it.)
std::string printable_text(std::string_view bytes);

// Throws parity::Error unless `path` names a regular file (not a directory, FIFO, socket or
// device; a symbolic link is followed) of at most max_bytes; `what` says what the file is for
// ("config", "shard", "trace"). Returns its size.
uint64_t require_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// The whole file, after require_regular_file; a read error is an Error naming the file.
std::string read_small_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// An untrusted JSON value for an error line: a string quoted, a large array or object by its
// size, anything else compactly dumped and quoted; at most 60 characters shown.
std::string json_excerpt(const nlohmann::json& value);

// JSON from untrusted text: nesting deeper than max_depth, a number out of double's range
// (1e400), invalid syntax or bytes after the value (a NUL among them) is one Error naming
// `source` and the byte offset; nothing is echoed whole. Linear in the text's size.
inline constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_json(std::string_view text, const std::string& source,
                          int max_depth = kMaxJsonDepth);

// A size in bytes as a user writes it: decimal digits with an optional K, M or G (powers of 1024)
// suffix, positive and below 2^64; anything else (a sign, a space, "1.5G") is one Error naming
// `what` (an option or variable) and the value.
uint64_t parse_byte_size(std::string_view text, std::string_view what);

// a * b and a + b for sizes, or an Error naming `what` when the result does not fit in int64.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
int64_t checked_add(int64_t a, int64_t b, std::string_view what);

}  // namespace parity
