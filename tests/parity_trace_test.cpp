// End to end through the built tools: parity-trace on the tiny model passes with cpu-f32 past
// the sliding window, localizes an injected fault to exactly its stage and layer for every
// stage of the list, and refuses bad input with exit 2 and no output files.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "model/stages.h"
#include "tests/test_util.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#endif

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::read_json;

// 20 positions: past twice the tiny model's sliding window of 8.
const char* kTokens = "1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900";

// The candidates traced end to end: the CPU float32 control everywhere, the device backend in its
// two precisions where this build has one and a GPU is present (the same assertions, not weaker
// ones: bf16 is judged by the bounds its declared precision derives).
const std::vector<std::string> kCandidates = {"cpu-f32", "hip", "hip-bf16"};


class CandidateTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CandidateTest, TinyPassesUnderDerivedBoundsPastTwiceTheWindow) {
  const std::string out = test::temp_dir("trace-pass");
  auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() + " --tokens " +
                                              kTokens + " " + test::candidate_flags(GetParam()) +
                                              " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"reference.h5", "candidate.h5", "report.txt", "report.json"})
    EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  auto j = read_json(fs::path(out) / "report.json");
  EXPECT_EQ(j["verdict"], "pass");
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_EQ(j["judged"], "local");
  EXPECT_EQ(j["criterion"]["kind"], "derived");
  // Every stage of every layer at every position was compared, locally and accumulated.
  EXPECT_EQ(j["datasets"].size(), size_t(20 * (4 + 19 * 4)));
  for (const auto& d : j["datasets"]) {
    ASSERT_FALSE(d["local"].is_null()) << d["path"];
    ASSERT_FALSE(d["accumulated"].is_null()) << d["path"];
  }
  EXPECT_EQ(j["candidate_backend"], GetParam() == "hip-bf16" ? "hip" : GetParam());
}

// The fixed fp32 profile passes the float32 candidates; BF16 operands (hip-bf16) lie outside it,
// and the first divergence is a product stage's: no fixed profile judges bf16 products fairly (the
// bf16 profile, made for BF16 storage, misses mlp1's cancellations near zero by 1.33x), the
// derived bounds of its declared precision do (TinyPassesUnderDerivedBoundsPastTwiceTheWindow).
TEST_P(CandidateTest, TinyUnderTheFixedFp32Profile) {
  const std::string out = test::temp_dir("trace-fixed");
  auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() + " --tokens " +
                                              kTokens + " " + test::candidate_flags(GetParam()) +
                                              " --profile fp32 --out " + out);
  const auto j = read_json(fs::path(out) / "report.json");
  EXPECT_EQ(j["criterion"]["kind"], "fixed");
  if (GetParam() != "hip-bf16") {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return;
  }
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const std::string stage = j["first_divergence"]["stage"];
  EXPECT_TRUE(stage == "qkv" || stage == "o_proj" || stage == "mlp1" || stage == "mlp2" ||
              stage == "logits")
      << j["first_divergence"].dump();
}

TEST_P(CandidateTest, GenerationTracesTheSampledTokenAsADecision) {
  for (const char* mode : {"", " --free-run"}) {
    const std::string out = test::temp_dir("trace-gen");
    auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                " --tokens 1,17,300,42,999 --generate 4" + mode +
                                                " " + test::candidate_flags(GetParam()) + " --out " +
                                                out);
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.output;
    auto j = read_json(fs::path(out) / "report.json");
    ASSERT_EQ(j["generated"].size(), 4u) << mode;
    ASSERT_EQ(j["tokens"].size(), 9u) << mode;
    size_t sampled = 0;
    for (const auto& d : j["datasets"])
      if (d["stage"] == "sampled") {
        ++sampled;
        EXPECT_EQ(d["status"], "pass") << d.dump();
      }
    EXPECT_EQ(sampled, 9u) << mode;  // every position: prompt and generated
    EXPECT_NE(r.output.find("generated ("), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Candidates, CandidateTest, ::testing::ValuesIn(kCandidates),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return test::candidate_test_name(i.param);
                         });

TEST(ParityTrace, WithoutReplayTheAccumulatedErrorIsJudgedAndSaidSo) {
  const std::string out = test::temp_dir("trace-noreplay");
  auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                              " --tokens 1,17,300 --no-replay --candidate cpu-f32 "
                                              "--out " + out);
  ASSERT_LE(r.exit_code, 1) << r.output;
  auto j = read_json(fs::path(out) / "report.json");
  EXPECT_EQ(j["judged"], "accumulated");
  EXPECT_FALSE(j["a"]["replay"].get<bool>());
  std::ifstream in(fs::path(out) / "report.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("A has no replay datasets"), std::string::npos) << text;
}

TEST(ParityTrace, TokenAtPositionAfterPrefixTracesOnlyThatPosition) {
  const std::string out = test::temp_dir("trace-pos");
  auto r =
      test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                         " --token 5 --pos 12 --candidate cpu-f32 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = read_json(fs::path(out) / "report.json");
  for (const auto& d : j["datasets"]) EXPECT_EQ(d["position"], 12);
}

class InjectionTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    if (const std::string why = test::candidate_unavailable(std::get<0>(GetParam())); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(InjectionTest, FirstDivergenceIsExactlyTheInjectedStageAndLayer) {
  const std::string candidate = std::get<0>(GetParam());
  const Stage s = static_cast<Stage>(std::get<1>(GetParam()));
  const bool model_scope = is_model_scope(s);
  for (int layer : model_scope ? std::vector<int>{-1} : std::vector<int>{0, 3}) {
    const std::string spec =
        std::string(name(s)) + (model_scope ? "" : ":" + std::to_string(layer));
    const std::string out = test::temp_dir("inject");
    auto r =
        test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                           " --tokens 1,17,300,42,999,5,77,128,256,3 " +
                                           test::candidate_flags(candidate) + " --inject " + spec +
                                           " --out " + out);
    ASSERT_EQ(r.exit_code, 1) << spec << "\n" << r.output;
    const auto j = read_json(fs::path(out) / "report.json");
    auto fd = j["first_divergence"];
    ASSERT_FALSE(fd.is_null()) << spec;
    EXPECT_EQ(fd["stage"], std::string(name(s))) << spec << "\n" << fd.dump();
    EXPECT_EQ(fd["position"], 0) << spec;
    if (model_scope)
      EXPECT_TRUE(fd["layer"].is_null()) << spec;
    else
      EXPECT_EQ(fd["layer"], layer) << spec;
    // Judged by local error, the injected stage is the only one that fails: no victims.
    for (const auto& d : j["datasets"])
      if (d["status"] != "pass") {
        EXPECT_EQ(d["stage"], std::string(name(s))) << spec << ": " << d["path"];
        if (!model_scope) {
          EXPECT_EQ(d["layer"], layer) << spec << ": " << d["path"];
        }
      }
    // One bug, one red JUnit testcase.
    auto junit = test::run_tool("parity-diff", (fs::path(out) / "candidate.h5").string() + " " +
                                                   (fs::path(out) / "reference.h5").string() +
                                                   " --report junit");
    EXPECT_EQ(junit.exit_code, 1) << junit.output;
    size_t failures = 0;
    for (size_t p = junit.output.find("<failure "); p != std::string::npos;
         p = junit.output.find("<failure ", p + 1))
      ++failures;
    EXPECT_EQ(failures, 1u) << spec << "\n" << junit.output.substr(0, 2000);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStage, InjectionTest,
                         ::testing::Combine(::testing::ValuesIn(kCandidates),
                                            ::testing::Range(0, kNumStages)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           const std::string c = std::get<0>(i.param);
                           return test::candidate_test_name(c) + "_" +
                                  std::string(name(static_cast<Stage>(std::get<1>(i.param))));
                         });

TEST(ParityTrace, BadInputExitsTwoWithOneLineAndNoOutputFiles) {
  struct Case {
    std::string args, expect;
  };
  const std::string tiny = test::tiny_model_dir();
  const std::vector<Case> cases = {
      {"--model " + tiny + " --tokens 1,2,99999", "out of range"},
      {"--model " + tiny + " --token 1 --pos 5000", "past the context"},
      {"--model /nonexistent/dir --tokens 1", "/nonexistent/dir"},
      {"--model " + tiny + " --tokens 1 --inject nosuchstage:0", "unknown stage"},
      {"--model " + tiny + " --tokens 1 --inject qkv:99", "out of range"},
      {"--model " + tiny + " --tokens 1 --candidate nosuch", "unknown backend"},
      {"--model " + tiny + " --token 1 --pos 4090 --generate 10", "past the model's context"},
      {"--model " + tiny + " --tokens 1 --no-replay --judge local", "--no-replay"},
      {"--model " + tiny + " --tokens 1 --lambda 0", "--lambda"},
      {"--model " + tiny + " --tokens 4294967297", "--tokens: \"4294967297\" is not a token id"},
  };
  for (const auto& c : cases) {
    const std::string out = test::temp_dir("bad");
    auto r = test::run_tool("parity-trace", c.args + " --out " + out);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_TRUE(fs::is_empty(out)) << c.args << ": output left behind";
  }
}


// A capture of naive_port on the tiny model at positions 0 and 1.
std::string naive_capture(const std::string& dir) {
  const std::string capture = dir + "/port.h5";
  const auto port = test::run_tool("naive_port", test::tiny_model_dir() + " --tokens 1,2 --capture " + capture);
  EXPECT_EQ(port.exit_code, 0) << port.output;
  return capture;
}

std::string entries_of(const std::string& dir) {
  std::string names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names += " " + e.path().filename().string();
  return names;
}

// A capture that is not one -- a junk dataset, a series parity-trace computes, a row whose
// order is not its stage's, empty position groups -- is one line naming the file and the object,
// exit 2, before anything is written: --out is not even created.
TEST(ParityTrace, ACaptureWithForeignObjectsIsRefusedBeforeAnythingIsWritten) {
  const std::string dir = test::temp_dir("capture-foreign");
  const std::string good = naive_capture(dir);
  struct Case {
    std::string tag, object;
    void (*edit)(hid_t);
  };
  const std::vector<Case> cases = {
      {"junk", "/junk",
       [](hid_t f) {
         const hsize_t n = 1;
         const hid_t space = H5Screate_simple(1, &n, nullptr);
         H5Dclose(H5Dcreate2(f, "/junk", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
         H5Sclose(space);
       }},
      {"magnitude", "/magnitude",
       [](hid_t f) {
         const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
         H5Pset_create_intermediate_group(lcpl, 1);
         H5Ocopy(f, "/pos_0/layer_0/qkv", f, "/magnitude/pos_0/layer_0/qkv", H5P_DEFAULT, lcpl);
         H5Pclose(lcpl);
       }},
      {"order", "/pos_1/layer_0/qkv",
       [](hid_t f) {
         const int32_t order = 0;
         const char* qkv = "/pos_1/layer_0/qkv";
         H5Adelete_by_name(f, qkv, "order", H5P_DEFAULT);
         const hid_t scalar = H5Screate(H5S_SCALAR);
         const hid_t a = H5Acreate_by_name(f, qkv, "order", H5T_STD_I32LE, scalar, H5P_DEFAULT,
                                           H5P_DEFAULT, H5P_DEFAULT);
         H5Awrite(a, H5T_NATIVE_INT32, &order);
         H5Aclose(a);
         H5Sclose(scalar);
       }},
      {"empty", "/pos_",
       [](hid_t f) {
         for (int p = 2; p < 2002; ++p)
           H5Gclose(H5Gcreate2(f, ("/pos_" + std::to_string(p)).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
       }},
  };
  for (const Case& c : cases) {
    const std::string capture = dir + "/" + c.tag + ".h5", out = dir + "/out-" + c.tag;
    fs::copy_file(good, capture);
    const hid_t f = H5Fopen(capture.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    c.edit(f);
    ASSERT_GE(H5Fclose(f), 0);
    const auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                      " --candidate-trace " + capture + " --out " + out);
    EXPECT_EQ(r.exit_code, 2) << c.tag << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(capture + ": " + c.object), std::string::npos) << c.tag << ": " << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.tag << ": left behind:" << entries_of(out);
  }
}

// An error after the reference trace is written (here: a capture row whose compressed data is
// damaged, found when the diff reads it) removes what the run wrote, and only that: a file of
// the user's in --out stays.
TEST(ParityTrace, AnErrorLeavesNoHalfOfARunInOut) {
  const std::string dir = test::temp_dir("capture-damaged");
  const std::string capture = naive_capture(dir);
  {
    const hid_t f = H5Fopen(capture.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    // /pos_1/model/sampled again, as one deflated chunk whose bytes are not deflate data.
    const char* path = "/pos_1/model/sampled";
    const hid_t old = H5Dopen2(f, path, H5P_DEFAULT);
    ASSERT_GE(old, 0);
    int32_t attrs[3] = {0, 0, 0};
    const char* names[3] = {"layer", "position", "order"};
    for (int i = 0; i < 3; ++i) {
      const hid_t a = H5Aopen(old, names[i], H5P_DEFAULT);
      H5Aread(a, H5T_NATIVE_INT32, &attrs[i]);
      H5Aclose(a);
    }
    H5Dclose(old);
    ASSERT_GE(H5Ldelete(f, path, H5P_DEFAULT), 0);
    const hsize_t n = 1;
    const hid_t space = H5Screate_simple(1, &n, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &n);
    H5Pset_deflate(dcpl, 6);
    const hid_t ds = H5Dcreate2(f, path, H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    const hsize_t origin = 0;
    const unsigned char garbage[8] = {0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef};
    ASSERT_GE(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, &origin, sizeof garbage, garbage), 0);
    const hid_t scalar = H5Screate(H5S_SCALAR), str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 8);
    const hid_t sa = H5Acreate2(ds, "stage", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(sa, str, "sampled");
    H5Aclose(sa);
    for (int i = 0; i < 3; ++i) {
      const hid_t a = H5Acreate2(ds, names[i], H5T_STD_I32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT32, &attrs[i]);
      H5Aclose(a);
    }
    H5Tclose(str);
    H5Sclose(scalar);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    ASSERT_GE(H5Fclose(f), 0);
  }
  const std::string out = dir + "/out";
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "mine\n";
  const auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                    " --candidate-trace " + capture + " --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/pos_1/model/sampled"), std::string::npos) << r.output;
  EXPECT_EQ(entries_of(out), " notes.txt") << r.output;
}
}  // namespace
}  // namespace parity
