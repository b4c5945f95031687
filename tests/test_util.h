// Shared helpers for the test binary: a process-wide tiny synthetic model, temp directories,
// and running the built tools.
#pragma once
#include <string>

#include "model/config.h"

namespace parity::test {

// A valid two-layer config (one sliding, one full layer) for trace and differ tests.
Config small_config(int hidden = 8);

// Directory of the tiny preset, synthesized once per test process into a temp directory.
const std::string& tiny_model_dir();

// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);

// Why candidate backend `name` cannot run in this build and on this machine ("hip" without a
// device backend or a GPU), or "" when it can: the reason a device test skips with.
std::string candidate_unavailable(const std::string& name);

struct ToolResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs build/bin/<tool> with the given argument string through the shell.
ToolResult run_tool(const std::string& tool, const std::string& args);

}  // namespace parity::test
