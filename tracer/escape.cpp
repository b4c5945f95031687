// Escaping of untrusted bytes for the reports (tracer/escape.h).
#include "tracer/escape.h"

#include "model/untrusted.h"

namespace parity {

std::string markup_text(std::string_view bytes) {
  std::string out;
  for (char c : printable_text(bytes)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace parity
