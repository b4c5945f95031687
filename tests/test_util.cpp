#include "tests/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "model/synth.h"

namespace parity::test {
namespace fs = std::filesystem;

namespace {
std::vector<std::string>& created() {
  static std::vector<std::string> dirs;
  static bool registered = [] {
    std::atexit([] {
      for (const auto& d : created()) {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    });
    return true;
  }();
  (void)registered;
  return dirs;
}
}  // namespace

std::string temp_dir(const std::string& tag) {
  static int counter = 0;
  const fs::path p = fs::temp_directory_path() /
                     ("parity-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  created().push_back(p.string());
  return p.string();
}

const std::string& tiny_model_dir() {
  static std::string dir = [] {
    std::string d = temp_dir("tiny");
    write_synthetic_checkpoint(synth_preset("tiny"), d, false);
    return d;
  }();
  return dir;
}

ToolResult run_tool(const std::string& tool, const std::string& args) {
  const std::string cmd = std::string(PARITY_BIN_DIR) + "/" + tool + " " + args + " 2>&1";
  ToolResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace parity::test
