// Bytes that came from a file or an argument (a trace's backend or precision attribute, a file
// name) on their way into a report or onto a terminal: one escaping function per output format,
// used by every report writer, so that no byte of a file reaches a report raw.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "model/untrusted.h"

namespace parity {

// Text for a text report or a terminal: printable_text, from model/untrusted.h (error lines use
// the same escaping through one_line).

// Text for HTML or XML element content and attribute values: printable_text, then & < > " '
// as entities. (XML 1.0 allows no control character but tab, newline and carriage return.)
std::string markup_text(std::string_view bytes);

// A JSON document as text that is always valid UTF-8: a string holding invalid UTF-8 has those
// bytes replaced by U+FFFD instead of making the dump throw. `indent` as json::dump's.
std::string json_text(const nlohmann::json& j, int indent = -1);

}  // namespace parity
