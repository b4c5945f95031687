#include "model/error.h"

#include <cstdlib>

namespace parity {

void fail_check(const char* statement, const char* function, const char* file, int line,
                const std::string& message) {
  // The user-facing line is the message; the source location is there for developers who ask.
  if (std::getenv("PARITY_DEBUG_CHECKS") != nullptr)
    throw Error(fmt::format("{} [check `{}` failed in {} at {}:{}]", message, statement,
                            function, file, line));
  throw Error(message);
}

}  // namespace parity
