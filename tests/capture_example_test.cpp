// The worked example end to end: examples/naive_port (an independent float32 port instrumented
// with the capture API) traced on the tiny model passes; each of its porting bugs is named at its
// stage and layer; stages a capture lacks are listed as not captured; and parity-trace refuses a
// capture of another model, checkpoint or token list, or a damaged or foreign file, with exit 2
// and one line naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/synth.h"
#include "parity_capture.h"
#include "tests/test_util.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::read_json;

// 20 positions: past twice the tiny model's sliding window of 8.
const std::string kTokens = "1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900";

// naive_port's capture of the tiny model on kTokens (with `bug`, or none).
std::string naive_capture(const std::string& dir, const std::string& bug = "") {
  const std::string path = dir + "/port" + (bug.empty() ? "" : "-" + bug) + ".h5";
  const auto r =
      test::run_tool("naive_port", test::tiny_model_dir() + " --tokens " + kTokens + " --capture " +
                                       path + (bug.empty() ? "" : " --bug " + bug));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return path;
}

test::ToolResult trace_capture(const std::string& capture, const std::string& out,
                               const std::string& extra = "") {
  return test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                            " --candidate-trace " + capture + " --out " + out +
                                            " " + extra);
}

// The one error line of a refused run, and that nothing but it was printed.
void expect_one_error_line(const test::ToolResult& r, const std::vector<std::string>& words) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.rfind("parity-trace: error: ", 0), 0u) << r.output;
  for (const auto& w : words)
    EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' not in: " << r.output;
}

TEST(CaptureExample, NaivePortPassesOnTheTinyModel) {
  const std::string dir = test::temp_dir("naive");
  const std::string capture = naive_capture(dir);
  const auto r = trace_capture(capture, dir + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("PASS: ", 0), 0u) << r.output;
  const auto j = read_json(fs::path(dir) / "out" / "report.json");
  EXPECT_EQ(j["verdict"], "pass");
  // Judged by local error: the reference recomputed each stage from the port's own inputs.
  EXPECT_EQ(j["judged"], "local");
  EXPECT_EQ(j["local_source"], "recompute");
  EXPECT_EQ(j["criterion"]["kind"], "derived");
  EXPECT_EQ(j["candidate_precision_policy"]["name"], "float32");
  EXPECT_EQ(j["summary"]["not_captured"]["datasets"], 0);
  EXPECT_EQ(j["summary"]["judged_accumulated_for_lack_of_inputs"], 0);
  EXPECT_TRUE(j["warnings"].empty()) << j["warnings"];
  EXPECT_EQ(j["candidate_backend"], "naive_port");
  // Every stage of every layer at every position, the head included.
  EXPECT_EQ(j["datasets"].size(), size_t(20 * (4 + 19 * 4)));
  for (const auto& d : j["datasets"]) {
    ASSERT_EQ(d["status"], "pass") << d["path"];
    ASSERT_EQ(d["judged"], "local") << d["path"];
    ASSERT_TRUE(d["local_unavailable"].is_null()) << d["path"];
  }
  EXPECT_TRUE(fs::exists(fs::path(dir) / "out" / "reference.h5"));
  EXPECT_TRUE(fs::exists(capture)) << "the capture is left where it is";
}

// Each bug of the port is reported at the stage and layer where it is, not downstream.
class NaivePortBug : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(NaivePortBug, TheReportNamesItsStageAndLayer) {
  const auto& [bug, stage] = GetParam();
  const std::string dir = test::temp_dir("naive-bug");
  const auto r = trace_capture(naive_capture(dir, bug), dir + "/out");
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("first divergence at position 0, layer 0, stage " + stage),
            std::string::npos)
      << r.output;
  const auto j = read_json(fs::path(dir) / "out" / "report.json");
  EXPECT_EQ(j["verdict"], "diverged");
  EXPECT_EQ(j["first_divergence"]["stage"], stage);
  EXPECT_EQ(j["first_divergence"]["layer"], 0);
  EXPECT_EQ(j["first_divergence"]["position"], 0);
  // JUnit: the culprit's testcase fails.
  std::ifstream xml(fs::path(dir) / "out" / "report.xml");
  const std::string text((std::istreambuf_iterator<char>(xml)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("name=\"" + stage + "\""), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Bugs, NaivePortBug,
                         ::testing::Values(std::pair<std::string, std::string>{"sink", "att"},
                                           std::pair<std::string, std::string>{"clamp", "swiglu"}),
                         [](const auto& info) { return info.param.first; });

// A port that records a few stages: the rest are listed as not captured, not passed, and the
// first divergence is found among the captured ones.
TEST(CaptureExample, StagesNotCapturedAreListedNotPassed) {
  const std::string dir = test::temp_dir("partial");
  const std::string full = naive_capture(dir);
  const TraceReader port(full);
  const std::string path = dir + "/partial.h5";
  parity_capture* cap = nullptr;
  const std::vector<int32_t> tokens = port.meta().tokens;
  ASSERT_EQ(parity_capture_open(&cap, path.c_str(), test::tiny_model_dir().c_str(), tokens.data(),
                                tokens.size(), nullptr),
            0)
      << parity_capture_last_error();
  size_t recorded = 0;
  for (const auto& e : port.entries()) {
    if (e.key.stage != Stage::q_rope && e.key.stage != Stage::logits &&
        e.key.stage != Stage::moe_out)
      continue;
    StageData d = port.read(e.path);
    if (e.key.stage == Stage::moe_out && e.key.layer == 2 && e.key.position == 5)
      d.f32[7] += 0.25f;  // a fault
    ASSERT_EQ(parity_capture_record(cap, name(e.key.stage).data(), e.key.position, e.key.layer, -1,
                                    d.f32.data(), PARITY_CAPTURE_F32, d.f32.size(), 0),
              0)
        << parity_capture_last_error();
    ++recorded;
  }
  ASSERT_EQ(parity_capture_close(&cap), 0) << parity_capture_last_error();
  const auto r = trace_capture(path, dir + "/out");
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("first divergence at position 5, layer 2, stage moe_out"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("not captured: embedding (20 of 20)"), std::string::npos) << r.output;
  // Nothing the three stages read was captured: each is judged by its accumulated error against
  // the float32 profile, naming the input it lacks.
  EXPECT_NE(r.output.find("(no local error: topk_w of layer 2 at position 5 not captured; held to "
                          "profile fp32"),
            std::string::npos)
      << r.output;
  const auto j = read_json(fs::path(dir) / "out" / "report.json");
  const size_t all = 20 * (4 + 19 * 4);
  EXPECT_EQ(j["summary"]["not_captured"]["datasets"], all - recorded);
  EXPECT_EQ(j["fallback_tolerance"]["profile"], "fp32");
  size_t not_captured = 0, compared = 0;
  for (const auto& d : j["datasets"]) {
    if (d["status"] == "not_captured") {
      ++not_captured;
      EXPECT_TRUE(d["accumulated"].is_null());
    } else {
      ++compared;
      EXPECT_EQ(d["judged"], "accumulated") << d["path"];
      EXPECT_TRUE(d["fallback_tolerance"].get<bool>()) << d["path"];
      const std::string lacking = d["local_unavailable"].get<std::string>();
      const std::string want = d["stage"] == "q_rope"    ? "qkv of layer "
                               : d["stage"] == "moe_out" ? "topk_w of layer "
                                                         : "final_norm at position ";
      EXPECT_EQ(lacking.rfind(want, 0), 0u) << d["path"] << ": " << lacking;
    }
  }
  EXPECT_EQ(not_captured, all - recorded);
  EXPECT_EQ(compared, recorded);
  std::ifstream txt(fs::path(dir) / "out" / "report.txt");
  const std::string text((std::istreambuf_iterator<char>(txt)), std::istreambuf_iterator<char>());
  const size_t row = text.find("\nattn_norm ");
  ASSERT_NE(row, std::string::npos) << text;
  EXPECT_EQ(text.substr(row, text.find('\n', row + 1) - row).find("not captured (80 datasets)") ==
                std::string::npos,
            false)
      << text;
}

TEST(CaptureExample, ParityTraceRefusesBadCaptures) {
  const std::string dir = test::temp_dir("bad-capture");
  const std::string capture = naive_capture(dir);

  // Another model: the same weights under a config that differs in one field.
  const std::string other = dir + "/other-config";
  fs::copy(test::tiny_model_dir(), other, fs::copy_options::recursive);
  {
    std::ifstream in(other + "/config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    c["rms_norm_eps"] = 1e-6;
    std::ofstream(other + "/config.json") << c.dump(2);
  }
  expect_one_error_line(test::run_tool("parity-trace", "--model " + other + " --candidate-trace " +
                                                           capture + " --out " + dir + "/o1"),
                        {capture, "a capture of another model", "rms_norm_eps"});
  // Another checkpoint: the same config, other weights.
  const std::string reseeded = dir + "/other-seed";
  SynthSpec spec = synth_preset("tiny");
  spec.seed = 1;
  write_synthetic_checkpoint(spec, reseeded, false);
  expect_one_error_line(
      test::run_tool("parity-trace", "--model " + reseeded + " --candidate-trace " + capture +
                                         " --out " + dir + "/o2"),
      {capture, "another checkpoint", "fingerprint"});
  // Other tokens than the ones asked for.
  expect_one_error_line(trace_capture(capture, dir + "/o3", "--tokens 1,17,300,43"),
                        {capture, "other tokens", "position 3: 42 in the capture, 43 given"});
  // A truncated file, a foreign file, a missing one.
  const std::string truncated = dir + "/truncated.h5";
  fs::copy_file(capture, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  expect_one_error_line(trace_capture(truncated, dir + "/o4"), {truncated});
  const std::string foreign = dir + "/foreign.h5";
  std::ofstream(foreign) << "not an HDF5 file\n";
  expect_one_error_line(trace_capture(foreign, dir + "/o5"), {foreign});
  expect_one_error_line(trace_capture(dir + "/missing.h5", dir + "/o6"), {dir + "/missing.h5"});
  // Options that belong to a candidate run.
  expect_one_error_line(trace_capture(capture, dir + "/o7", "--inject qkv:0"),
                        {"--inject does not apply"});
  // A precision that is not a preset.
  expect_one_error_line(trace_capture(capture, dir + "/o8", "--precision bfloat17"),
                        {"precision bfloat17 is not a preset", "transformers-bf16"});
  for (const char* o : {"o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8"})
    EXPECT_FALSE(fs::exists(fs::path(dir) / o / "report.txt")) << o;
}

TEST(CaptureExample, NaivePortRunsWithoutACapture) {
  const auto r = test::run_tool("naive_port", test::tiny_model_dir() + " --tokens 1,2,3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("naive_port: 3 tokens; next token"), std::string::npos) << r.output;
  const auto bad =
      test::run_tool("naive_port", test::tiny_model_dir() + " --tokens 1,2,3 --bug nope");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

}  // namespace
}  // namespace parity
