#include "tests/test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <vector>

#include "model/synth.h"
#include "tools/common.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#endif

namespace parity::test {

Config small_config(int hidden) {
  Config c;
  c.vocab_size = 16;
  c.hidden_size = hidden;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 4;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.sliding_window = 4;
  c.layer_is_sliding = {true, false};
  c.validate("small test config");
  return c;
}
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
  const fs::path p =
      fs::temp_directory_path() /
      ("parity-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  created().push_back(p.string());
  return p.string();
}

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = fs::temp_directory_path() / ("parity-test-tmp-" + tag + "-" + std::to_string(::getpid()) +
                                       "-" + std::to_string(counter++));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

size_t TempDir::count() const {
  return size_t(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
}

void expect_prompt_refusal(const std::function<void()>& load, const std::string& fifo,
                           const std::string& where, std::initializer_list<std::string> fragments) {
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      load();
      return "accepted";
    } catch (const Error& e) {
      return std::string("error: ") + e.what();
    }
  });
  if (result.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
    ADD_FAILURE() << "still blocked after 5 s (" << where << ")";
    // ENXIO until the reader's open() is under way; a few tries cover that race.
    for (int i = 0; !fifo.empty() && i < 500 &&
                    result.wait_for(std::chrono::milliseconds(10)) == std::future_status::timeout;
         ++i) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  const std::string got = result.get();
  ASSERT_EQ(got.rfind("error: ", 0), 0u) << got;
  expect_message(got, where, fragments);
}

std::string nested_arrays(int depth) {
  return std::string(size_t(depth), '[') + "1" + std::string(size_t(depth), ']');
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::vector<float> as_float(const StageData& d) {
  std::vector<float> v(d.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(d.at(i));
  return v;
}

const Model& tiny_model() {
  static std::unique_ptr<Model> m = Model::load(tiny_model_dir());
  return *m;
}

const std::string& tiny_model_dir() {
  static std::string dir = [] {
    std::string d = temp_dir("tiny");
    write_synthetic_checkpoint(synth_preset("tiny"), d, false);
    return d;
  }();
  return dir;
}

std::string candidate_unavailable(const std::string& name) {
  if (name != "hip" && name != "hip-bf16") return "";
#ifdef PARITY_HAVE_DEVICE
  return device_available() ? "" : "no GPU: " + device_unavailable_reason();
#else
  return "this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)";
#endif
}

std::string candidate_flags(const std::string& name) {
  return name == "hip-bf16" ? "--candidate hip --precision bf16" : "--candidate " + name;
}

std::unique_ptr<Backend> make_candidate(const std::string& name, const Model& model) {
#ifdef PARITY_HAVE_DEVICE
  if (name == "hip-bf16") {
    device::DeviceOptions o = device::device_options_from_environment();
    o.precision = device::Precision::bf16;
    return make_hip_backend(model, o);
  }
#endif
  return make_backend(name, model);
}

std::string candidate_test_name(const std::string& name) {
  std::string n = name;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

ToolResult run_tool(const std::string& tool, const std::string& args) {
  return run_command(std::string(PARITY_BIN_DIR) + "/" + tool + " " + args);
}

ToolResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
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

void expect_message(const std::string& msg, const std::string& where,
                    std::initializer_list<std::string> fragments) {
  constexpr size_t kMaxMessage = 300;
  EXPECT_NE(msg.find(where), std::string::npos) << "does not name " << where << ": " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  EXPECT_LT(msg.size(), kMaxMessage) << "too long: " << msg.substr(0, 1000);
  for (const auto& s : fragments)
    EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg.substr(0, 1000);
}

double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {  // series for P, then Q = 1 - P
    double sum = 1 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return 1 - sum * std::exp(log_prefix);
  }
  // Continued fraction for Q (modified Lentz).
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

}  // namespace parity::test
