// One error mechanism for the whole project: every check that can fail on user input, on a
// file or on a library call throws parity::Error carrying what failed, where, and (where the
// user can act) a hint. Tools catch it, print one line, and exit 2.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace parity {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Generator behind every check macro: `statement` failed in `function` at `file:line`.
[[noreturn]] void fail_check(const char* statement, const char* function, const char* file,
                             int line, const std::string& message);

// Throw an Error whose message is formatted with fmt; the message should name the file or
// object at fault and what is wrong ("model/config.json: hidden_size must be positive").
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace parity

// PARITY_CHECK(cond, "file {}: what is wrong", path): on failure throws parity::Error with the
// message, plus the statement, function, file and line when PARITY_DEBUG_CHECKS is set.
#define PARITY_CHECK(cond, ...)                                                       \
  do {                                                                                \
    if (!(cond))                                                                      \
      ::parity::fail_check(#cond, __func__, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
