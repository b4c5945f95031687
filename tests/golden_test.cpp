// The golden gate: the shipped golden logits of the tiny preset pass, and a perturbed weight
// fails; `compare` reports mismatches in the checkers' format.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

const std::string kGolden = std::string(PARITY_SOURCE_DIR) + "/golden";

TEST(Golden, TinyGoldenLogitsPass) {
  auto r = test::run_tool("parity-golden", "check --model " + test::tiny_model_dir() +
                                               " --name tiny --golden-dir " + kGolden);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
}

TEST(Golden, FailsWhenOneWeightIsPerturbed) {
  const std::string dir = test::temp_dir("golden-perturbed");
  fs::copy(test::tiny_model_dir(), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  // Find lm_head's bytes and flip one BF16 element's mantissa bit.
  // Locate lm_head.weight's first byte from the safetensors header of the shard holding it.
  const std::string file = TensorStore(dir).get("lm_head.weight").file;
  std::ifstream in(file, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, ' ');
  in.read(header.data(), long(header_len));
  in.close();
  const auto j = nlohmann::json::parse(header);
  const size_t offset = 8 + header_len + j["lm_head.weight"]["data_offsets"][0].get<size_t>();
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(long(offset) + 1);
    char c = 0;
    io.read(&c, 1);
    c = char(c ^ 0x40);  // bf16 high byte: a change of the exponent's low bit
    io.seekp(long(offset) + 1);
    io.write(&c, 1);
  }
  auto r = test::run_tool("parity-golden", "check --model " + dir + " --name tiny --golden-dir " + kGolden);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Mismatch at element"), std::string::npos) << r.output;
}

TEST(Golden, CompareReportsMismatchesLikeCheckers) {
  const std::string dir = test::temp_dir("golden-compare");
  std::ofstream(dir + "/a.txt") << "1.0\n2.0\n3.0\n";
  std::ofstream(dir + "/b.txt") << "1.0\n2.5\n3.0\n";
  std::ofstream(dir + "/bad.txt") << "1.0\nabc\n";
  auto same = test::run_tool("parity-golden", "compare " + dir + "/a.txt " + dir + "/a.txt");
  EXPECT_EQ(same.exit_code, 0) << same.output;
  auto diff = test::run_tool("parity-golden", "compare " + dir + "/a.txt " + dir + "/b.txt --atol 1e-3 --rtol 0");
  EXPECT_EQ(diff.exit_code, 1);
  EXPECT_NE(diff.output.find("Mismatch at element 1: got=2 vs ans=2.5 (diff 0.5)"), std::string::npos)
      << diff.output;
  auto bad = test::run_tool("parity-golden", "compare " + dir + "/a.txt " + dir + "/bad.txt");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("bad.txt:2"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace parity
