// Shared helpers for the test binary: a process-wide tiny synthetic model, temp directories,
// and running the built tools.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/error.h"

namespace parity::test {

// A valid two-layer config (one sliding, one full layer) for trace and differ tests.
Config small_config(int hidden = 8);

// Directory of the tiny preset, synthesized once per test process into a temp directory.
const std::string& tiny_model_dir();

// The tiny preset loaded once per test process (tiny_model_dir()).
const Model& tiny_model();

// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);

// A fresh empty directory under the system temp dir (parity-test-tmp-<tag>-<pid>-<n>), removed
// with the object: for tests that count what is left in it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "dir");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t count() const;  // the entries in it

 private:
  std::filesystem::path path_;
};

// Expects body to throw parity::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected parity::Error";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// Runs `load`, which must throw a parity::Error naming `where` with every fragment
// (expect_message), on another thread, and fails if it has not returned within 5 s: a reader
// blocked on the FIFO `fifo` ("" when the file is no FIFO). Then it opens the FIFO for writing and
// closes it, so the blocked reader sees end of file and the test ends rather than hanging until
// ctest's timeout.
void expect_prompt_refusal(const std::function<void()>& load, const std::string& fifo,
                           const std::string& where, std::initializer_list<std::string> fragments);

// `depth` nested arrays around 1: deep enough to overflow the stack of a recursive parser,
// dumper or comparison.
std::string nested_arrays(int depth);

// A JSON file parsed.
nlohmann::json read_json(const std::filesystem::path& p);

// A stage's values as float.
std::vector<float> as_float(const StageData& d);

// Why candidate backend `name` cannot run in this build and on this machine ("hip" without a
// device backend or a GPU), or "" when it can: the reason a device test skips with.
// The candidates are backend names, and "hip-bf16": the device backend in its bf16 precision.
std::string candidate_unavailable(const std::string& name);
// The candidate's parity-trace arguments ("--candidate hip --precision bf16" for hip-bf16).
std::string candidate_flags(const std::string& name);
// The candidate's backend on `model` (tools' make_backend; hip-bf16 from the environment's device
// options with the precision bf16).
std::unique_ptr<Backend> make_candidate(const std::string& name, const Model& model);
// A name usable in a test's name ("cpu_f32", "hip_bf16").
std::string candidate_test_name(const std::string& name);

// A test decorator's base: every call forwarded to `inner`, so that a decorator overrides only
// what it changes (a stage it spoils, what it declares) -- all but run_step(): a decorator sees
// each stage's run(), so the whole-step path stays the Backend's default (none).
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string precision() const override { return inner_->precision(); }
  PrecisionPolicy precision_policy() const override { return inner_->precision_policy(); }
  nlohmann::json facts() const override { return inner_->facts(); }
  const Config& config() const override { return inner_->config(); }
  void begin_step(const Batch& b) override { inner_->begin_step(b); }
  void run(Stage s, int layer) override { inner_->run(s, layer); }
  StageData read(Stage s, int layer, int row) override { return inner_->read(s, layer, row); }
  void write(Stage s, int layer, int row, const StageData& d) override {
    inner_->write(s, layer, row, d);
  }
  bool writable(Stage s) const override { return inner_->writable(s); }
  std::optional<StageData> magnitude(Stage s, int layer, int row) override {
    return inner_->magnitude(s, layer, row);
  }
  std::optional<StageData> bias(Stage s, int layer, int row) override {
    return inner_->bias(s, layer, row);
  }
  std::optional<KvRows> cache_rows(int seq, int layer, int first, int count) override {
    return inner_->cache_rows(seq, layer, first, count);
  }
  void load_cache(int seq, int layer, const KvRows& rows) override {
    inner_->load_cache(seq, layer, rows);
  }
  std::vector<StageData> partials(Stage s, int layer, int row) override {
    return inner_->partials(s, layer, row);
  }
  bool replays(Stage s, int layer) const override { return inner_->replays(s, layer); }
  std::optional<std::pair<StageData, StageData>> recompute_row(Stage s, int layer, int position,
                                                               const std::vector<StageData>& inputs,
                                                               const KvRows& cache) override {
    return inner_->recompute_row(s, layer, position, inputs, cache);
  }
  void reset() override { inner_->reset(); }

 protected:
  Backend& inner() { return *inner_; }
  const Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

// Expects an error message of the house form: one line of bounded length (an untrusted value is
// never echoed whole), naming `where` (the file), holding every fragment.
void expect_message(const std::string& msg, const std::string& where,
                    std::initializer_list<std::string> fragments);

// The regularized upper incomplete gamma function Q(a, x) (series / continued fraction, as
// Numerical Recipes' gammq): the chi-square survival function of statistic x2 with df degrees of
// freedom is Q(df / 2, x2 / 2). The sampler tests' p-values.
double upper_gamma_q(double a, double x);

struct ToolResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs build/bin/<tool> with the given argument string through the shell.
ToolResult run_tool(const std::string& tool, const std::string& args);
// Runs a shell command line, its standard error with its output.
ToolResult run_command(const std::string& command);

}  // namespace parity::test
