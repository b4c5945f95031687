// The `run` tool: getp and generate on the tiny model, request errors, tokenize/detokenize.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "engine/engine.h"
#include "engine/progress.h"
#include "tokenizer/tiny_tokenizer.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"

namespace parity {
namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  return lines;
}

std::string ids_text(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

const std::vector<std::string> kPrompts = {
    "The quick brown fox",
    "def main():\\n    return 0",
    "a",
    "Numbers 12345 and more numbers 67890, then words again and again and again.",
    "Hello, world!",
    "x",
    "Once upon a time there was a tiny model that could not write poems but tried anyway.",
    "\\\\ backslash",
};

std::string request_file(const std::string& dir) {
  std::string text;
  for (const auto& p : kPrompts) text += p + "\n";
  const std::string path = dir + "/requests.txt";
  write(path, text);
  return path;
}

TEST(EngineRun, GetpGreedyEqualsTheReferenceDecode) {
  const std::string dir = test::temp_dir("engine-run");
  const std::string model = test::tiny_model_dir();
  const auto r =
      test::run_tool("run", model + " -m getp --backend reference -n 6 --max-batch 3 -i " +
                                request_file(dir) + " -o " + dir + "/out.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TTFT p50"), std::string::npos) << r.output;
  const auto out = lines_of(read(dir + "/out.txt"));
  ASSERT_EQ(out.size(), kPrompts.size());

  // The reference's own greedy decode through the graph, one row per step.
  const Tokenizer tok = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  const std::vector<TokenId> stops = model_stop_tokens(model, tok);
  auto m = Model::load(model);
  auto b = make_reference_backend(*m);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    std::string prompt;
    for (size_t c = 0; c < kPrompts[i].size(); ++c) {
      if (kPrompts[i][c] == '\\') {
        prompt += kPrompts[i][++c] == 'n' ? '\n' : '\\';
      } else {
        prompt += kPrompts[i][c];
      }
    }
    const std::vector<TokenId> ids = tok.encode(prompt, false);
    b->reset();
    for (size_t p = 0; p < ids.size(); ++p) forward(*b, Batch::single(ids[p], int32_t(p)));
    std::vector<TokenId> generated;
    for (int n = 0; n < 6; ++n) {
      generated.push_back(b->read(Stage::sampled, kModelLayer, 0).i32.at(0));
      if (std::find(stops.begin(), stops.end(), generated.back()) != stops.end()) break;
      forward(*b, Batch::single(generated.back(), int32_t(ids.size() + generated.size() - 1)));
    }
    EXPECT_EQ(out[i], ids_text(generated)) << "line " << i + 1;
  }
}

TEST(EngineRun, TheSummaryHasVllmBenchServesFigures) {
  EngineStats a;
  a.requests = 3;
  a.failed = 1;
  a.prompt_tokens = 300;
  a.generated_tokens = 100;
  a.wall_seconds = 2;
  a.decode_rows = 90;
  a.decode_seconds = 1.5;
  a.prefill_rows = 300;
  a.prefill_seconds = 0.25;
  a.ttft_seconds = {0.2, 0.1};
  a.tpot_seconds = {0.010, 0.030};
  EngineStats b = a;
  b.wall_seconds = 4;
  b.ttft_seconds = {0.4};
  b.tpot_seconds = {0.020};
  EngineStats total = a;
  total.merge(b);
  EXPECT_EQ(summary_text(a, {a}, {"engine 0"}),
            "run: 3 requests (1 failed), 300 prompt tokens, 100 generated, wall 2.000 s, total "
            "200.0 tokens/s, output 50.0 tokens/s, TTFT p50 100.0 ms p99 200.0 ms, TPOT p50 "
            "10.00 ms p99 30.00 ms, decode 60.0 tokens/s, prefill 1200.0 tokens/s\n");
  // Two workers: the run's wall time is the longer one, its percentiles over every request; its
  // decode and prefill rates the sum of the workers'.
  EXPECT_EQ(summary_text(total, {a, b}, {"rank 0", "rank 1"}),
            "run: 6 requests (2 failed), 600 prompt tokens, 200 generated, wall 4.000 s, total "
            "200.0 tokens/s, output 50.0 tokens/s, TTFT p50 200.0 ms p99 400.0 ms, TPOT p50 "
            "20.00 ms p99 30.00 ms, decode 120.0 tokens/s, prefill 2400.0 tokens/s\n"
            "run:   rank 0: 3 requests (1 failed), 300 prompt tokens, 100 generated, wall 2.000 s, "
            "total 200.0 tokens/s, output 50.0 tokens/s, TTFT p50 100.0 ms p99 200.0 ms, TPOT p50 "
            "10.00 ms p99 30.00 ms, decode 60.0 tokens/s, prefill 1200.0 tokens/s\n"
            "run:   rank 1: 3 requests (1 failed), 300 prompt tokens, 100 generated, wall 4.000 s, "
            "total 100.0 tokens/s, output 25.0 tokens/s, TTFT p50 400.0 ms p99 400.0 ms, TPOT p50 "
            "20.00 ms p99 20.00 ms, decode 60.0 tokens/s, prefill 1200.0 tokens/s\n");
}

TEST(EngineRun, SmallBatchKeepsOrderAndLosesNothing) {
  const std::string dir = test::temp_dir("engine-run");
  const std::string model = test::tiny_model_dir();
  std::string text;
  std::vector<std::string> prompts;
  for (int i = 0; i < 24; ++i) {
    std::string p = "request " + std::to_string(i);
    if (i % 3 == 0)
      for (int k = 0; k < 30; ++k) p += " and a longer tail " + std::to_string(k);
    prompts.push_back(p);
    text += p + "\n";
  }
  write(dir + "/requests.txt", text);
  const std::string common =
      model + " -m getp --backend cpu-f32 -n 5 -t 0.8 -s 7 --text -i " + dir + "/requests.txt";
  const auto batched =
      test::run_tool("run", common + " --max-batch 3 --step-tokens 16 -o " + dir + "/b.txt");
  ASSERT_EQ(batched.exit_code, 0) << batched.output;
  const auto alone = test::run_tool("run", common + " --max-batch 1 -o " + dir + "/a.txt");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const auto b = lines_of(read(dir + "/b.txt"));
  ASSERT_EQ(b.size(), prompts.size());
  EXPECT_EQ(b, lines_of(read(dir + "/a.txt")));
  for (const auto& line : b) {
    EXPECT_EQ(line.find("ERROR"), std::string::npos) << line;
    EXPECT_NE(line.find('\t'), std::string::npos) << line;
  }
  EXPECT_NE(batched.output.find("24 requests (0 failed)"), std::string::npos) << batched.output;
  // The limits the run took, and where they came from: the host backends keep modest defaults.
  EXPECT_NE(batched.output.find("run: limits: --max-batch 3, --step-tokens 16\n"),
            std::string::npos)
      << batched.output;
  EXPECT_NE(alone.output.find("run: limits: --max-batch 1, --step-tokens 256 (the host backends' "
                              "default)\n"),
            std::string::npos)
      << alone.output;
}

TEST(EngineRun, BadLinesAreReportedWithTheirNumbers) {
  const std::string dir = test::temp_dir("engine-run");
  std::string long_line;
  for (int i = 0; i < 3000; ++i) long_line += "w" + std::to_string(i) + " ";
  write(dir + "/requests.txt",
        "good one\n\ninvalid \xc3\x28 utf8\nbad \\q escape\n" + long_line + "\nalso good\n");
  const auto r = test::run_tool("run", test::tiny_model_dir() + " -m getp --backend cpu-f32 -n 3 -i " + dir +
                                           "/requests.txt -o " + dir + "/out.txt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto out = lines_of(read(dir + "/out.txt"));
  ASSERT_EQ(out.size(), 6u) << read(dir + "/out.txt");
  EXPECT_EQ(out[0].find("ERROR"), std::string::npos);
  EXPECT_EQ(out[1], "ERROR line 2: empty prompt");
  EXPECT_EQ(out[2].rfind("ERROR line 3: invalid UTF-8", 0), 0u) << out[2];
  EXPECT_EQ(out[3].rfind("ERROR line 4: unknown escape", 0), 0u) << out[3];
  EXPECT_EQ(out[4].rfind("ERROR line 5: ", 0), 0u) << out[4];
  EXPECT_NE(out[4].find("longer than the context"), std::string::npos) << out[4];
  EXPECT_EQ(out[5].find("ERROR"), std::string::npos);
}

TEST(EngineRun, JsonLinesSetEachRequestsLengthAndFailAlone) {
  const std::string dir = test::temp_dir("engine-run-jsonl");
  const Tokenizer tok = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  const std::string ids = ids_text(tok.encode("The quick brown fox", false));
  std::string id_list;
  for (const char c : ids) id_list += c == ' ' ? std::string(", ") : std::string(1, c);
  const std::vector<std::string> lines = {
      R"({"prompt": "The quick brown fox", "max_tokens": 3})",
      R"({"prompt_token_ids": [)" + id_list + R"(], "max_tokens": 5, "ignore_eos": true})",
      R"({"prompt": "default length"})",
      R"({"prompt": "typo", "max_token": 5})",
      R"({"prompt_token_ids": [1, 5000]})",
      R"({"prompt": "too many", "max_tokens": 65})",
      R"({"prompt_token_ids": [)" + id_list + R"(], "max_tokens": 64})",
  };
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  write(dir + "/r.jsonl", text);
  const auto r = test::run_tool("run", test::tiny_model_dir() +
                                           " -m getp --backend cpu-f32 -t 0 -n 4 --context 64 -i " +
                                           dir + "/r.jsonl -o " + dir + "/out.txt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto out = lines_of(read(dir + "/out.txt"));
  ASSERT_EQ(out.size(), 7u) << read(dir + "/out.txt");
  const auto count = [](const std::string& line) {
    std::stringstream s(line);
    int n = 0;
    for (std::string id; s >> id;) ++n;
    return n;
  };
  EXPECT_EQ(count(out[0]), 3) << out[0];
  EXPECT_EQ(count(out[1]), 5) << out[1];
  // The ids of the first line's text: the same greedy tokens, as many as it asked for.
  EXPECT_EQ(out[1].rfind(out[0], 0), 0u) << out[0] << " / " << out[1];
  EXPECT_EQ(count(out[2]), 4) << out[2];  // -n
  EXPECT_EQ(out[3].rfind("ERROR line 4: unknown key \"max_token\"", 0), 0u) << out[3];
  EXPECT_EQ(out[4],
            "ERROR line 5: token 5000 at index 1 is outside the model's vocabulary of 1024");
  EXPECT_EQ(out[5], "ERROR line 6: max_tokens 65 is more than the context of 64 positions");
  // The context caps a request's max_tokens as it caps -n: it ends with the context full.
  EXPECT_EQ(count(out[6]), 64 - count(ids) + 1) << out[6];
  EXPECT_NE(r.output.find("run: line 6: max_tokens 65 is more than the context"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("run: 7 requests (3 failed)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", TPOT p50 "), std::string::npos) << r.output;
}

TEST(EngineRun, AJsonLinesFileThatCannotBeReadIsExitTwo) {
  const std::string dir = test::temp_dir("engine-run-jsonl-file");
  ASSERT_EQ(::mkfifo((dir + "/fifo.jsonl").c_str(), 0600), 0);
  std::filesystem::create_directory(dir + "/dir.jsonl");
  for (const std::string name : {"/fifo.jsonl", "/dir.jsonl", "/missing.jsonl"}) {
    const auto r = test::run_tool("run", test::tiny_model_dir() + " -m getp --backend cpu-f32 -i " +
                                             dir + name + " -o " + dir + "/out.txt");
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.output;
    EXPECT_NE(r.output.find("run: error: " + dir + name + ": "), std::string::npos)
        << name << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(std::ifstream(dir + "/out.txt").good()) << name;
  }
}

// scripts/bench_requests.py through the system's python3.
test::ToolResult bench_requests(const std::string& args) {
  return test::run_command("python3 " + std::string(PARITY_SOURCE_DIR) +
                           "/scripts/bench_requests.py " + args);
}

struct BenchFile {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> max_tokens;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

// A generated request file, each line checked to be what the generator promises.
BenchFile read_bench_file(const std::string& path) {
  BenchFile b;
  for (const std::string& line : lines_of(read(path))) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.size(), 3u) << line.substr(0, 200);
    EXPECT_EQ(j.at("ignore_eos"), true);
    b.prompts.push_back(j.at("prompt_token_ids").get<std::vector<int64_t>>());
    b.max_tokens.push_back(j.at("max_tokens").get<int64_t>());
    b.prompt_tokens += int64_t(b.prompts.back().size());
    b.output_tokens += b.max_tokens.back();
  }
  return b;
}

TEST(EngineRun, BenchRequestsShareGptMixHasVllmsTotals) {
  const std::string dir = test::temp_dir("bench-requests");
  const auto r = bench_requests("--mix sharegpt --seed 11 --out " + dir + "/sg.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const BenchFile b = read_bench_file(dir + "/sg.jsonl");
  ASSERT_EQ(b.prompts.size(), 1000u);
  // vLLM's benchmark_serving on ShareGPT, 1,000 requests: 217,396 prompt and 197,742 generated
  // tokens.
  EXPECT_NEAR(double(b.prompt_tokens), 217396.0, 0.03 * 217396.0);
  EXPECT_NEAR(double(b.output_tokens), 197742.0, 0.03 * 197742.0);
  EXPECT_NE(r.output.find(fmt::format("sharegpt: 1000 requests, {} prompt tokens, {} output tokens",
                                      b.prompt_tokens, b.output_tokens)),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(
                fmt::format("output share {:.3f}",
                            double(b.output_tokens) / double(b.prompt_tokens + b.output_tokens))),
            std::string::npos)
      << r.output;
  // vLLM's filter, and o200k's special tokens left out of the default vocabulary of 201,088.
  size_t long_prompts = 0, long_outputs = 0;
  for (size_t i = 0; i < b.prompts.size(); ++i) {
    const int64_t in = int64_t(b.prompts[i].size()), out = b.max_tokens[i];
    EXPECT_GE(in, 4);
    EXPECT_LE(in, 1024);
    EXPECT_GE(out, 4);
    EXPECT_LE(in + out, 2048);
    long_prompts += in > 512 ? 1 : 0;
    long_outputs += out > 512 ? 1 : 0;
    for (const int64_t id : b.prompts[i]) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 199998);
    }
  }
  // Lengths spread, not a constant: a long tail on both sides.
  EXPECT_GT(long_prompts, 10u);
  EXPECT_GT(long_outputs, 10u);
  // Seeded: the same seed writes the same file, another seed another.
  ASSERT_EQ(bench_requests("--mix sharegpt --seed 11 --out " + dir + "/again.jsonl").exit_code, 0);
  EXPECT_EQ(read(dir + "/again.jsonl"), read(dir + "/sg.jsonl"));
  ASSERT_EQ(bench_requests("--mix sharegpt --seed 12 --out " + dir + "/other.jsonl").exit_code, 0);
  EXPECT_NE(read(dir + "/other.jsonl"), read(dir + "/sg.jsonl"));
}

TEST(EngineRun, BenchRequestsFixedMixesAndRunReadsTheirFiles) {
  const std::string dir = test::temp_dir("bench-requests-run");
  for (const auto& [mix, in, out] :
       {std::tuple{"prefill-heavy", 4000, 200}, std::tuple{"decode-heavy", 128, 1024}}) {
    const auto r =
        bench_requests(std::string("--mix ") + mix + " --count 3 --out " + dir + "/f.jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const BenchFile b = read_bench_file(dir + "/f.jsonl");
    ASSERT_EQ(b.prompts.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(b.prompts[i].size(), size_t(in)) << mix;
      EXPECT_EQ(b.max_tokens[i], out) << mix;
    }
  }
  // A special range inside the vocabulary: ids on both sides of it, none in it.
  ASSERT_EQ(bench_requests("--mix decode-heavy --count 40 --vocab 100 --special 10-19 --out " +
                           dir + "/mid.jsonl")
                .exit_code,
            0);
  std::set<int64_t> seen;
  for (const auto& p : read_bench_file(dir + "/mid.jsonl").prompts) seen.insert(p.begin(), p.end());
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 99);
  for (int64_t id = 10; id <= 19; ++id) EXPECT_EQ(seen.count(id), 0u) << id;
  EXPECT_EQ(seen.size(), 90u);
  // Options it refuses: exit 2 with the reason.
  for (const std::string bad : {"--mix sharegpt --count 0", "--mix sharegpt --special 5",
                                "--mix sharegpt --vocab 10 --special 0-9", "--mix other"}) {
    const auto r = bench_requests(bad + " --out " + dir + "/bad.jsonl");
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
  }

  // `run` reads what it writes: the tiny model (its vocabulary of 1,024, specials from 1,003), each
  // request generating its own max_tokens in full.
  ASSERT_EQ(
      bench_requests("--mix sharegpt --count 6 --seed 3 --vocab 1024 --special 1003-1023 --out " +
                     dir + "/tiny.jsonl")
          .exit_code,
      0);
  const BenchFile b = read_bench_file(dir + "/tiny.jsonl");
  const auto r =
      test::run_tool("run", test::tiny_model_dir() + " -m getp --backend cpu-f32 -n 2 -i " + dir +
                                "/tiny.jsonl -o " + dir + "/out.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = lines_of(read(dir + "/out.txt"));
  ASSERT_EQ(out.size(), 6u);
  for (size_t i = 0; i < out.size(); ++i) {
    std::stringstream ids(out[i]);
    int64_t n = 0;
    for (std::string id; ids >> id;) ++n;
    EXPECT_EQ(n, b.max_tokens[i]) << "line " << i + 1;
  }
  EXPECT_NE(r.output.find(fmt::format("run: 6 requests (0 failed), {} prompt tokens, {} generated",
                                      b.prompt_tokens, b.output_tokens)),
            std::string::npos)
      << r.output;
}

TEST(EngineRun, ContextFlagLimitsPromptAndGeneration) {
  const std::string dir = test::temp_dir("engine-run");
  write(dir + "/requests.txt", "hi\none two three four five six seven eight nine ten eleven\n");
  const auto r = test::run_tool("run", test::tiny_model_dir() + " -m getp --backend cpu-f32 -n 50 --context 8 -i " +
                                           dir + "/requests.txt -o " + dir + "/out.txt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto out = lines_of(read(dir + "/out.txt"));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].rfind("ERROR line 2: ", 0), 0u) << out[1];
  EXPECT_NE(out[1].find("context of 8 positions"), std::string::npos) << out[1];
  // "hi" is one or two tokens: the rest of the 8 positions, plus the token sampled at the last.
  std::stringstream ids(out[0]);
  int n = 0;
  for (std::string id; ids >> id;) ++n;
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 8);
}

TEST(EngineRun, UnreadableRequestFileIsExitTwo) {
  const std::string dir = test::temp_dir("engine-run");
  const auto r = test::run_tool(
      "run", test::tiny_model_dir() + " -m getp -i " + dir + "/missing.txt -o " + dir + "/out.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run: error: " + dir + "/missing.txt: no such file (the request file)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::ifstream(dir + "/out.txt").good());
}

TEST(EngineRun, InputsThatAreNotRegularFilesAreExitTwo) {
  const std::string dir = test::temp_dir("engine-run-inputs");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string model = test::tiny_model_dir();
  // A directory read as an empty request file (exit 0, an empty output); a FIFO blocked forever.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-m getp --backend cpu-f32 -i " + dir, dir + ": is a directory"},
      {"-m getp --backend cpu-f32 -i " + fifo, fifo + ": is not a regular file"},
      {"-m tokenize -i " + fifo, fifo + ": is not a regular file"},
      {"-m detokenize -i " + dir, dir + ": is a directory"},
  };
  for (const auto& [flags, expected] : cases) {
    const auto r = test::run_tool("run", model + " " + flags + " -o " + dir + "/out.txt");
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_NE(r.output.find("run: error: " + expected), std::string::npos)
        << flags << ": " << r.output;
    EXPECT_FALSE(std::ifstream(dir + "/out.txt").good()) << flags;
  }
}

TEST(EngineRun, ModeFilesNameThemselvesInErrors) {
  const std::string dir = test::temp_dir("engine-run-modes");
  const std::string model = test::tiny_model_dir();
  write(dir + "/text.txt", "fine line\nbad \xff byte\n");
  auto r = test::run_tool("run", model + " -m tokenize -i " + dir + "/text.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run: error: " + dir + "/text.txt: invalid UTF-8 at byte 15 (line 2)"),
            std::string::npos)
      << r.output;
  write(dir + "/ids.txt", "72 105\n9999999\n");
  r = test::run_tool("run", model + " -m detokenize -i " + dir + "/ids.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run: error: " + dir +
                          "/ids.txt: line 2: token id \"9999999\" is not in "
                          "the vocabulary of "),
            std::string::npos)
      << r.output;
  write(dir + "/ids.txt", "72 -0\n");
  r = test::run_tool("run", model + " -m detokenize -i " + dir + "/ids.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("line 1: \"-0\" is not a token id"), std::string::npos) << r.output;
  // A config.json given for the model: the directory is its parent.
  r = test::run_tool("run", model + "/config.json -m getp -i " + dir + "/text.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(model + "/config.json: is a file; the model is the checkpoint directory "
                                  "that holds it"),
            std::string::npos)
      << r.output;
}

TEST(EngineRun, ADanglingTokenizerLinkIsAnErrorNotTheTinyTokenizer) {
  // A model of the tiny layout without tokenizer.json gets the tiny tokenizer; a tokenizer.json
  // that is there but broken is an error naming it.
  const std::string dir = test::temp_dir("engine-run-link");
  std::filesystem::copy_file(test::tiny_model_dir() + "/config.json", dir + "/config.json");
  write(dir + "/text.txt", "hello");
  auto r = test::run_tool("run", dir + " -m tokenize -i " + dir + "/text.txt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(::symlink((dir + "/gone.json").c_str(), (dir + "/tokenizer.json").c_str()), 0);
  r = test::run_tool("run", dir + " -m tokenize -i " + dir + "/text.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run: error: " + dir +
                          "/tokenizer.json: a symbolic link to a file that does not exist"),
            std::string::npos)
      << r.output;
}

TEST(EngineRun, GenerationConfigIsReadStrictly) {
  const auto error_of = [](const std::string& text) {
    try {
      generation_config_stop_tokens(text, "gen.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(generation_config_stop_tokens(R"({"eos_token_id": [200002, 199999]})", "g"),
            (std::vector<TokenId>{200002, 199999}));
  EXPECT_EQ(generation_config_stop_tokens(R"({"eos_token_id": 7})", "g"), std::vector<TokenId>{7});
  EXPECT_TRUE(generation_config_stop_tokens(R"({"eos_token_id": null})", "g").empty());
  EXPECT_TRUE(generation_config_stop_tokens(R"({"do_sample": true})", "g").empty());
  // 10,000 levels deep: the JSON library's dump (for the message) overflowed the stack.
  const std::string deep =
      R"({"eos_token_id": )" + std::string(10000, '[') + std::string(10000, ']') + "}";
  std::string e = error_of(deep);
  EXPECT_NE(e.find("gen.json: JSON nested deeper than"), std::string::npos) << e;
  e = error_of(R"({"eos_token_id": [[[1]]]})");
  EXPECT_NE(e.find("gen.json: eos_token_id holds \"[[1]]\", not a token id"), std::string::npos)
      << e;
  e = error_of(R"({"eos_token_id": ")" + std::string(5000, 'x') + R"("})");
  EXPECT_NE(e.find("not a token id"), std::string::npos) << e;
  EXPECT_LT(e.size(), 200u) << e;
  EXPECT_NE(error_of(std::string("{\"eos_token_id\": 5}\0garbage", 27)).find("NUL byte"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"eos_token_id": -1})").find("not a token id"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("gen.json: not a JSON object"), std::string::npos);

  // Something there that is not a file is an error, not "no generation config".
  const std::string dir = test::temp_dir("engine-genconfig");
  const Tokenizer tok = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  std::filesystem::create_directory(dir + "/generation_config.json");
  e.clear();
  try {
    model_stop_tokens(dir, tok);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find(dir + "/generation_config.json: is a directory"), std::string::npos) << e;
}

TEST(EngineRun, GenerateStreamsText) {
  const auto r = test::run_tool(
      "run", test::tiny_model_dir() + " -m generate --backend cpu-f32 -i 'Hello there' -n 8 --harmony");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 requests (0 failed)"), std::string::npos) << r.output;
}

TEST(EngineRun, GenerateWithATooLongPromptIsExitOne) {
  std::string prompt;
  for (int i = 0; i < 3000; ++i) prompt += "w" + std::to_string(i) + " ";
  const auto r =
      test::run_tool("run", test::tiny_model_dir() + " -m generate --backend cpu-f32 -n 2 -i '" + prompt + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output.substr(0, 400);
  EXPECT_NE(r.output.find("run: request failed: "), std::string::npos) << r.output.substr(0, 400);
  EXPECT_NE(r.output.find("longer than the context"), std::string::npos);
}

TEST(EngineRun, BadSamplingValuesAreExitTwo) {
  for (const std::string flags : {"--top-p 0", "--top-p 1.5", "--top-k -2"}) {
    const auto r =
        test::run_tool("run", test::tiny_model_dir() + " -m generate --backend cpu-f32 -i hi -n 2 " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_NE(r.output.find("run: error: "), std::string::npos) << flags << ": " << r.output;
  }
}

TEST(EngineRun, BadEngineOptionsAreOneLineAndExitTwo) {
  const std::string dir = test::temp_dir("run-engine-options");
  const std::string requests = request_file(dir);
  const std::string base =
      test::tiny_model_dir() + " -m getp --backend cpu-f32 -n 2 -o " + dir + "/o.txt -i " + requests;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--gpus 0", "--gpus \"0\": `all` or a positive number"},
      {"--gpus two", "--gpus \"two\": `all` or a positive number"},
      {"--kv-memory 100", "less than one KV-cache block"},
      {"--kv-memory 12Q", "--kv-memory \"12Q\": not a positive number of bytes"},
      // Silently taken before: a sign after a space (read as 2^64 - 5), empty values meaning the
      // default, a negative temperature (greedy), a seed past 2^64 (saturated).
      {"--kv-memory ' -5'", "--kv-memory \" -5\": not a positive number of bytes"},
      {"--kv-memory ''", "--kv-memory: an empty value"},
      {"--gpus ''", "--gpus: an empty value"},
      {"--backend ''", "--backend: an empty value"},
      {"-t -1", "temperature -1: cannot be negative"},
      {"-s 18446744073709551616", "--seed: \"18446744073709551616\" is out of range"},
      {"-s -1", "--seed: \"-1\" is not a decimal integer"},
      {"--max-batch 0", "--max-batch: 0 is not a positive count"},
      {"--step-tokens 010x", "--step-tokens: \"010x\" is not a decimal integer"},
      {"--context -1", "--context: -1 is negative"},
      // Each slot is allocated up front: 2^31 - 1 of them asked for 120 GB.
      {"--max-batch 2147483647", "--max-batch: 2147483647 sequences at once, more than the 65536"},
      {"--step-tokens 2147483647", "--step-tokens: 2147483647 rows per step, more than the"},
      {"--kernel-times", "--kernel-times: the device backend's"},
      {"--no-graphs", "--no-graphs: the device backend's"},
      {"--tensor-parallel 2", "--tensor-parallel 2: the device backend's"},
      {"--tensor-parallel 0", "--tensor-parallel: 0 is not a positive count"},
      {"--all-reduce ring", "--all-reduce \"ring\": give peer (peer stores where"},
      {"--all-reduce nccl", "--all-reduce nccl: a tensor-parallel group's (--tensor-parallel 2"},
  };
  for (const auto& [flags, expected] : cases) {
    const auto r = test::run_tool("run", base + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << flags << ": " << r.output;
    EXPECT_NE(r.output.find("run: error: "), std::string::npos) << flags << ": " << r.output;
    EXPECT_FALSE(std::ifstream(dir + "/o.txt").good()) << flags << ": an output was written";
  }
  if (!test::candidate_unavailable("hip").empty()) {
    // No GPU (or no device build): the device engine is refused with the reason.
    const auto r = test::run_tool("run", test::tiny_model_dir() + " -m getp --backend hip -n 2 -o " +
                                              dir + "/o.txt -i " + requests);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("backend hip: "), std::string::npos) << r.output;
  }
}

TEST(EngineRun, SeveralHostEnginesAndASmallKvMemoryWriteTheSameOutput) {
  const std::string dir = test::temp_dir("run-engines");
  const std::string requests = request_file(dir);
  const std::string base = test::tiny_model_dir() +
                           " -m getp --backend cpu-f32 -n 12 -t 0.8 --top-p 0.9 -s 4 --text -i " +
                           requests + " -o ";
  const auto one = test::run_tool("run", base + dir + "/one.txt");
  const auto three = test::run_tool("run", base + dir + "/three.txt --gpus 3 --max-batch 2");
  const auto small = test::run_tool("run", base + dir + "/small.txt --kv-memory 300K");
  // `free`, the value the option's help offers, is the default.
  const auto free = test::run_tool("run", base + dir + "/free.txt --kv-memory free");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(three.exit_code, 0) << three.output;
  ASSERT_EQ(small.exit_code, 0) << small.output;
  EXPECT_EQ(read(dir + "/three.txt"), read(dir + "/one.txt"));
  EXPECT_EQ(read(dir + "/small.txt"), read(dir + "/one.txt"));
  ASSERT_EQ(free.exit_code, 0) << free.output;
  EXPECT_EQ(read(dir + "/free.txt"), read(dir + "/one.txt"));
  // The summary has a line per engine.
  EXPECT_NE(three.output.find("run:   engine 2: cpu-f32: "), std::string::npos) << three.output;
}

TEST(EngineRun, TheTinyPresetGetsItsTokenizerWritten) {
  const std::string models = test::temp_dir("engine-models");
  const auto r =
      test::run_tool("run", "tiny --models-dir " + models + " -m generate --backend cpu-f32 -i hello -n 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::ifstream(models + "/tiny/tokenizer.json").good());
  // The second run reads the written file and generates the same.
  const auto again =
      test::run_tool("run", "tiny --models-dir " + models + " -m generate --backend cpu-f32 -i hello -n 3");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(r.output.substr(0, r.output.find("run: ")),
            again.output.substr(0, again.output.find("run: ")));
}

TEST(EngineRun, TokenizeDetokenizeRoundTrip) {
  const std::string dir = test::temp_dir("engine-tok");
  const auto synth = test::run_tool("parity-synth", "--preset tiny --tokenizer-only --out " + dir);
  ASSERT_EQ(synth.exit_code, 0) << synth.output;
  const std::string text = "Round trip: caf\xc3\xa9, 42 numbers,\n\ttabs and \xf0\x9f\x99\x82.\n";
  write(dir + "/text.txt", text);
  const auto t =
      test::run_tool("run", dir + " -m tokenize -i " + dir + "/text.txt -o " + dir + "/ids.txt");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_FALSE(read(dir + "/ids.txt").empty());
  const auto d =
      test::run_tool("run", dir + " -m detokenize -i " + dir + "/ids.txt -o " + dir + "/back.txt");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_EQ(read(dir + "/back.txt"), text);
  write(dir + "/bad.txt", "1 2 x3");
  const auto bad = test::run_tool("run", dir + " -m detokenize -i " + dir + "/bad.txt");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

}  // namespace
}  // namespace parity
