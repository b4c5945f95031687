// The command-line tools as a CI engineer meets them: --version everywhere, one error line with
// the tool's name for any bad command line, no file replaced that is not a regular file, one run
// per output directory, no partial output, and aliases and limits checked before any work.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/error.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(Tools, EveryToolHasVersionAndOneLineErrors) {
  for (const char* tool : {"parity-trace", "parity-diff", "parity-golden", "parity-synth", "parity-bench"}) {
    auto v = test::run_tool(tool, "--version");
    EXPECT_EQ(v.exit_code, 0) << tool << ": " << v.output;
    EXPECT_NE(v.output.find(std::string(tool) + " "), std::string::npos) << v.output;
    EXPECT_NE(v.output.find("commit"), std::string::npos) << v.output;
    auto bad = test::run_tool(tool, "--no-such-option 1");
    EXPECT_EQ(bad.exit_code, 2) << tool << ": " << bad.output;
    EXPECT_EQ(lines(bad.output), 1u) << tool << ": " << bad.output;
    EXPECT_EQ(bad.output.rfind(std::string(tool) + ": error: ", 0), 0u) << bad.output;
  }
}

TEST(Tools, ErrorsStayOneLineWhateverTheyQuote) {
  const std::string out = test::temp_dir("one-line");
  const std::string tiny = test::tiny_model_dir();
  auto r = test::run_tool("parity-trace", "--model " + tiny + " --tokens 1 --candidate \"$(printf 'bad\\nname')\" --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  std::string huge(100000, '7');
  r = test::run_tool("parity-trace", "--model " + tiny + " --tokens " + huge + " --out " + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(lines(r.output), 1u);
  EXPECT_LT(r.output.size(), 2200u) << "an error line is capped";
}

TEST(Tools, DeviceBackendAliases) {
  const std::string tiny = test::tiny_model_dir();
  const auto hip = test::run_tool("parity-trace", "--model " + tiny + " --tokens 1,2 --candidate hip --out " +
                                                      test::temp_dir("alias-hip"));
  for (const char* alias : {"cuda", "gpu"}) {
    const auto r = test::run_tool("parity-trace", "--model " + tiny + " --tokens 1,2 --candidate " + alias +
                                                      " --out " + test::temp_dir("alias"));
    EXPECT_EQ(r.exit_code, hip.exit_code) << alias << ": " << r.output;
  }
}

TEST(Tools, OneRunPerOutputDirectory) {
  const std::string out = test::temp_dir("locked");
  const int fd = ::open((out + "/.parity-trace.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                    " --tokens 1,2 --candidate cpu-f32 --out " + out);
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("another parity-trace"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/reference.h5"));
}

TEST(Tools, ReportsReplaceOnlyRegularFiles) {
  const std::string dir = test::temp_dir("reports");
  const auto run = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                      " --tokens 1,2 --candidate cpu-f32 --out " + dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string a = dir + "/candidate.h5", b = dir + "/reference.h5";
  auto r = test::run_tool("parity-diff", a + " " + b + " -o /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
  r = test::run_tool("parity-diff", a + " " + b + " -o " + dir);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
  r = test::run_tool("parity-diff", a + " " + b + " -o " + dir + "/r.txt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// The two traces of one run share a run id: a reference left beside another run's candidate
// (a run killed between the two) is refused, not compared.
TEST(Tools, TracesOfDifferentRunsAreNotCompared) {
  const std::string one = test::temp_dir("run-one"), two = test::temp_dir("run-two");
  for (const std::string& dir : {one, two}) {
    const auto run = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                        " --tokens 1,2 --candidate cpu-f32 --out " + dir);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  auto r = test::run_tool("parity-diff", one + "/candidate.h5 " + one + "/reference.h5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_tool("parity-diff", one + "/candidate.h5 " + two + "/reference.h5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("different runs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--across-runs"), std::string::npos) << "the way past it is named: " << r.output;
}

// Two runs of one model, checkpoint and tokens (two machines, two days) are compared when asked
// for, the references of both included; a pair of two runs in one directory is still refused,
// and so are other tokens.
TEST(Tools, AcrossRunsComparesTwoRunsOfTheSameTokens) {
  const std::string one = test::temp_dir("across-one"), two = test::temp_dir("across-two"),
                    three = test::temp_dir("across-three");
  for (const auto& [dir, tokens] : {std::pair{one, "1,2"}, {two, "1,2"}, {three, "1,3"}}) {
    const auto run = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() + " --tokens " +
                                                        tokens + " --candidate cpu-f32 --out " + dir);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  auto r = test::run_tool("parity-diff", "--across-runs " + one + "/candidate.h5 " + two + "/reference.h5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
  r = test::run_tool("parity-diff", "--across-runs -q " + one + "/reference.h5 " + two + "/reference.h5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_tool("parity-diff", "--across-runs " + one + "/candidate.h5 " + three + "/reference.h5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("different tokens"), std::string::npos) << r.output;
  fs::copy_file(two + "/reference.h5", one + "/other-reference.h5");
  r = test::run_tool("parity-diff", "--across-runs " + one + "/candidate.h5 " + one + "/other-reference.h5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("lie in one directory"), std::string::npos) << r.output;
}

// A --junit (or -o) file that cannot be written is found before any work, and never replaces
// the error the JUnit file was to carry.
TEST(Tools, AJunitFileThatCannotBeWrittenNeverHidesTheError) {
  const std::string dir = test::temp_dir("junit-missing");
  const std::string missing = dir + "/no/such/dir/report.xml";
  auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                              " --candidate-trace " + dir + "/nothing.h5 --out " +
                                              dir + "/out --junit " + missing);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("--junit " + missing + ": no directory"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  r = test::run_tool("parity-diff", dir + "/a.h5 " + dir + "/b.h5 --report junit -o " + missing);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--output " + missing + ": no directory"), std::string::npos) << r.output;
  // When the JUnit file fails only at the end, the run's own error still comes first.
  try {
    write_junit_error_file(missing, "parity-trace", Error("capture.h5: no such file"));
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("capture.h5: no such file", 0), 0u) << what;
    EXPECT_NE(what.find("JUnit file could not be written"), std::string::npos) << what;
  }
  // A writable one carries the error line.
  r = test::run_tool("parity-diff", dir + "/a.h5 " + dir + "/b.h5 --report junit -o " + dir + "/r.xml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::ifstream in(dir + "/r.xml");
  const std::string xml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(xml.find("a.h5"), std::string::npos) << xml;
}

// parity-diff compares what it is asked to, as h5diff does: object paths, --stage, --layer,
// --position, --exclude; the first divergence is the first among the selected datasets, and the
// report says what was left out.
TEST(Tools, DiffSelectsStagesLayersPositionsAndPaths) {
  const std::string dir = test::temp_dir("select");
  const auto run = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                      " --tokens 1,2,3 --candidate cpu-f32 --inject qkv:1 --out " + dir);
  ASSERT_EQ(run.exit_code, 1) << run.output;
  const std::string pair = dir + "/candidate.h5 " + dir + "/reference.h5 -q";
  const auto first = [](const std::string& out) {  // "position 0, layer 1, stage qkv"
    const std::string tag = "first divergence at ";
    const auto at = out.find(tag);
    return at == std::string::npos ? std::string() : out.substr(at + tag.size(), out.find(':', at) - at - tag.size());
  };
  auto r = test::run_tool("parity-diff", pair);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(first(r.output), "position 0, layer 1, stage qkv") << r.output;
  r = test::run_tool("parity-diff", pair + " --layer 0,model");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_tool("parity-diff", pair + " --stage qkv --position 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(first(r.output), "position 2, layer 1, stage qkv") << r.output;
  r = test::run_tool("parity-diff", pair + " /pos_1/");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(first(r.output), "position 1, layer 1, stage qkv") << r.output;
  r = test::run_tool("parity-diff", pair + " --exclude /pos_0 --exclude /pos_1/layer_1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(first(r.output), "position 2, layer 1, stage qkv") << r.output;
  r = test::run_tool("parity-diff", pair + " --exclude /pos_0/layer_1/qkv --exclude /pos_1 --exclude /pos_2");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // The report says what was compared.
  r = test::run_tool("parity-diff", dir + "/candidate.h5 " + dir + "/reference.h5 --stage qkv --layer 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("3 datasets compared"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("selected: stage qkv; layer 1;"), std::string::npos) << r.output;

  for (const char* bad : {"--stage nope", "--layer x", "--layer -3", "pos_1", "--exclude layer_1",
                          "--position 99", "--position -1"}) {
    r = test::run_tool("parity-diff", pair + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1u) << bad << ": " << r.output;
  }
}

// --tokens: an empty value is an error, not a token 0; a value out of int32 is an error, not
// wrapped; ids are decimal ("051" is 51, not octal 41).
TEST(Tools, TokenListsRefuseEmptyAndOutOfRangeValues) {
  for (const char* bad : {"1,,2", "1 '' 3", "1,2,", "4294967297", "-2147483649", "1,x", "0x10", "+-1", "1e3"}) {
    const auto r = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                      " --candidate cpu-f32 --tokens " + bad +
                                                      " --out " + test::temp_dir("tokens"));
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1u) << bad << ": " << r.output;
  }
  const std::string dir = test::temp_dir("tokens-decimal");
  const auto ok = test::run_tool("parity-trace", "--model " + test::tiny_model_dir() +
                                                     " --candidate cpu-f32 --tokens 051,3 --out " + dir);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(TraceReader(dir + "/reference.h5").meta().tokens, (std::vector<int32_t>{51, 3}));
}

TEST(Tools, GoldenCompareNeedsNumbers) {
  const std::string dir = test::temp_dir("golden-empty");
  std::ofstream(dir + "/a.txt").close();
  std::ofstream(dir + "/b.txt").close();
  auto r = test::run_tool("parity-golden", "compare " + dir + "/a.txt " + dir + "/b.txt --atol 0 --rtol 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds no numbers"), std::string::npos) << r.output;
  std::ofstream(dir + "/c.txt") << "1.5\n2\n";
  std::ofstream(dir + "/d.txt") << "1.5\nabc\n";
  r = test::run_tool("parity-golden", "compare " + dir + "/c.txt " + dir + "/d.txt --atol 0 --rtol 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("d.txt:2"), std::string::npos) << r.output;
  r = test::run_tool("parity-golden", "compare " + dir + "/c.txt " + dir + "/c.txt --atol 0 --rtol 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Tools, GoldenReadsH5dumpAndSeveralValuesPerLine) {
  const std::string dir = test::temp_dir("golden-formats");
  std::ofstream(dir + "/dump.txt") << "HDF5 \"t.h5\" {\nDATASET \"/pos_0/model/logits\" {\n"
                                      "   DATATYPE  H5T_IEEE_F64LE\n"
                                      "   DATASPACE  SIMPLE { ( 4 ) / ( 4 ) }\n"
                                      "   DATA {\n   (0): 1.5, 2, -0.25,\n   (3): 7\n   }\n}\n}\n";
  std::ofstream(dir + "/plain.txt") << "1.5 2\n-0.25, 7\n";
  auto r = test::run_tool("parity-golden", "compare " + dir + "/dump.txt " + dir + "/plain.txt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS: 4 elements"), std::string::npos) << r.output;
  std::ofstream(dir + "/off.txt") << "1.5 2 -0.25 8\n";
  r = test::run_tool("parity-golden", "compare " + dir + "/dump.txt " + dir + "/off.txt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST(Tools, GoldenGatesAnyBackend) {
  const std::string args = "check --model " + test::tiny_model_dir() + " --name tiny --golden-dir " +
                           std::string(PARITY_SOURCE_DIR) + "/golden";
  auto r = test::run_tool("parity-golden", args + " --backend cpu-f32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("backend cpu-f32"), std::string::npos) << r.output;
  r = test::run_tool("parity-golden", args + " --backend cpu-f32 --atol 0 --rtol 0");
  EXPECT_EQ(r.exit_code, 1) << "float32 logits are not the float64 golden ones bit for bit";
}

TEST(Tools, BenchDecodesBatchesAndCountsTheSelectedExperts) {
  const std::string tiny = "--model " + test::tiny_model_dir() + " --backend cpu-f32";
  auto r = test::run_tool("parity-bench", tiny + " --batch 3 --start 4 --positions 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("batch 3: median "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at positions 4..5"), std::string::npos) << r.output;
  // Three rows of k = 4 over 8 experts select between 4 and 8 of them in each layer.
  const size_t at = r.output.find(" of 8 experts per layer selected");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double selected = std::stod(r.output.substr(r.output.rfind(' ', at - 1) + 1));
  EXPECT_GE(selected, 4.0) << r.output;
  EXPECT_LE(selected, 8.0) << r.output;
  r = test::run_tool("parity-bench", tiny + " --batch 2 --start 4090 --positions 16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("exceed the model's context 4096"), std::string::npos) << r.output;
  r = test::run_tool("parity-bench", tiny + " --batch 2 --start 2147483647");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--start"), std::string::npos) << r.output;
}

// --precision (run, parity-trace --candidate, parity-bench): the device backend's precision of
// the products. An unknown name is one line naming the choices, bf16 with a host backend is one
// line naming the device backend, both before any work; fp32 with a host backend runs (cpu-f32
// computes in float32).
TEST(Tools, PrecisionIsTheDeviceBackendsAndCheckedFirst) {
  const std::string tiny = test::tiny_model_dir();
  const std::string out = test::temp_dir("precision") + "/trace";
  const std::vector<std::pair<std::string, std::string>> host_runs = {
      {"run", tiny + " -i hi --backend cpu-f32"},
      {"parity-trace", "--model " + tiny + " --tokens 1,2 --candidate cpu-f32 --out " + out},
      {"parity-bench", "--model " + tiny + " --backend cpu-f32"}};
  for (const auto& [tool, args] : host_runs) {
    for (const char* bad : {"fp16", "''", "BF16"}) {
      const auto r = test::run_tool(tool, args + " --precision " + bad);
      EXPECT_EQ(r.exit_code, 2) << tool << " " << bad << ": " << r.output;
      EXPECT_EQ(lines(r.output), 1u) << tool << " " << bad << ": " << r.output;
      EXPECT_EQ(r.output.rfind(tool + ": error: --precision ", 0), 0u) << r.output;
      EXPECT_NE(r.output.find(": not a precision (fp32, bf16)"), std::string::npos) << r.output;
    }
    const auto r = test::run_tool(tool, args + " --precision bf16");
    EXPECT_EQ(r.exit_code, 2) << tool << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1u) << tool << ": " << r.output;
    EXPECT_EQ(r.output.rfind(tool + ": error: --precision ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(tool == "parity-trace" ? "--candidate hip" : "--backend hip"),
              std::string::npos)
        << "the way out is named: " << r.output;
    EXPECT_NE(r.output.find("cpu-f32"), std::string::npos) << r.output;
  }
  // parity-trace's --precision has a second use, and the refusal names both.
  const auto trace = test::run_tool("parity-trace", host_runs[1].second + " --precision bf16");
  EXPECT_NE(trace.output.find("--candidate-trace"), std::string::npos) << trace.output;
  EXPECT_FALSE(fs::exists(out)) << "nothing written before the check";

  auto r = test::run_tool("run", host_runs[0].second + " -n 2 --precision fp32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(0 failed)"), std::string::npos) << r.output;
  r = test::run_tool("parity-bench", host_runs[2].second + " -q --precision fp32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("backend cpu-f32"), std::string::npos) << r.output;
}

TEST(Tools, SynthChecksItsLimitsBeforeWriting) {
  const std::string out = test::temp_dir("synth-limits");
  auto r = test::run_tool("parity-synth", "--preset tiny --stats-positions 2147483647 --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--stats-positions"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(out)) << "nothing written before the check";
}

}  // namespace
}  // namespace parity
