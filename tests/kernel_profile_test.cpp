// scripts/kernel_profile.py, which sums one step of an Nsight Compute CSV by kernel (the device
// check's profile step): its sums, its step split at the sampling kernel, its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace parity {
namespace {

test::ToolResult kernel_profile(const std::string& args) {
  return test::run_command("python3 " + std::string(PARITY_SOURCE_DIR) +
                           "/scripts/kernel_profile.py " + args);
}

// ncu's raw CSV: a row per kernel and metric, as `ncu --csv --print-units base` writes it.
std::string row(int id, const std::string& kernel, const std::string& grid,
                const std::string& metric, const std::string& value) {
  return "\"" + std::to_string(id) + "\",\"1\",\"run\",\"127.0.0.1\",\"" + kernel +
         "\",\"1\",\"13\",\"(128, 1, 1)\",\"" + grid +
         "\",\"0\",\"9.0\",\"Command line profiler "
         "metrics\",\"" +
         metric + "\",\"\",\"" + value + "\"\n";
}

std::string kernel(int id, const std::string& name, const std::string& grid, const std::string& ns,
                   const std::string& read_bytes) {
  return row(id, name, grid, "gpu__time_duration.sum", ns) +
         row(id, name, grid, "dram__bytes_read.sum", read_bytes) +
         row(id, name, grid, "launch__registers_per_thread", "64");
}

std::string profile_csv() {
  const std::string header =
      "==PROF== Connected to process 1\n\"ID\",\"Process ID\",\"Process Name\",\"Host Name\","
      "\"Kernel Name\",\"Context\",\"Stream\",\"Block Size\",\"Grid Size\",\"Device\",\"CC\","
      "\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n";
  const std::string gemv =
      "void (anonymous namespace)::f32_bf16w_mma<1, 1>(MmaArgs, const uint4 *)";
  const std::string argmax = "(anonymous namespace)::f32_argmax(const float *, int, bool, int *)";
  // Step 0: one projection and the sampler; step 1: the projection twice on one grid, once on
  // another (a row each), then the sampler.
  return header + kernel(0, gemv, "(1, 320, 1)", "9,000", "1,000,000") +
         kernel(1, argmax, "(1, 1, 1)", "1000", "0") +
         kernel(2, gemv, "(1, 320, 1)", "10000", "20000000") +
         kernel(3, gemv, "(1, 320, 1)", "30000", "60000000") +
         kernel(4, gemv, "(1, 180, 1)", "5000", "5000000") +
         kernel(5, argmax, "(1, 1, 1)", "2000", "0");
}

TEST(KernelProfile, SumsTheLastStepByKernelAndGrid) {
  const std::string dir = test::temp_dir("kernel-profile");
  std::ofstream(dir + "/p.csv") << profile_csv();
  const auto r = kernel_profile(dir + "/p.csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 47 us in all, 85 MB read: 1809 GB/s; the two launches on one grid 40 us, 80 MB (2000 GB/s).
  EXPECT_NE(r.output.find("step 1 of 2: 4 kernels, 47.0 us of kernel time, 85.0 MB read from "
                          "DRAM (1809 GB/s"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("f32_bf16w_mma<1, 1>"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   2      40.0    20.00      80.0   2000"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("   1       5.0     5.00       5.0   1000"), std::string::npos)
      << r.output;
  const auto first = kernel_profile(dir + "/p.csv --step 0");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("step 0 of 2: 2 kernels, 10.0 us"), std::string::npos)
      << first.output;
}

TEST(KernelProfile, RefusesWhatItCannotSumInOneLine) {
  const std::string dir = test::temp_dir("kernel-profile-bad");
  std::ofstream(dir + "/p.csv") << profile_csv();
  std::ofstream(dir + "/text.csv") << "no csv here\n";
  const std::string csv = profile_csv();
  std::ofstream(dir + "/onestep.csv") << csv.substr(0, csv.find("\n\"5\",") + 1);
  std::ofstream(dir + "/nosampler.csv") << csv.substr(0, csv.find("\n\"1\",") + 1);
  const std::pair<std::string, std::string> cases[] = {
      {dir + "/missing.csv", "cannot read it"},
      {dir + "/text.csv", "not ncu's raw CSV"},
      {dir + "/nosampler.csv", "no sampling kernel (f32_argmax, f32_sample*) ends a step"},
      {dir + "/onestep.csv --step 1", "--step 1: it holds steps 0 to 0"},
      {dir + "/p.csv --step 2", "--step 2: it holds steps 0 to 1"},
  };
  for (const auto& [args, why] : cases) {
    const auto r = kernel_profile(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("kernel_profile: '" + args.substr(0, args.find(' ')) + "': " + why),
              std::string::npos)
        << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

}  // namespace
}  // namespace parity
