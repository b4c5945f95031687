// The capture library as another project sees it: installed into a temporary prefix, found with
// find_package(parity_capture) by a C project and with pkg-config by a bare compiler call, and
// run; parity_capture_device.h compiled by nvcc where one is installed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/test_util.h"
#include "tracer/trace_file.h"

// GCC says __SANITIZE_ADDRESS__ under -fsanitize=address; clang 14 says it by __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILT_WITH_CLANG 1
#endif
#endif
#ifndef ASAN_BUILT_WITH_CLANG
#define ASAN_BUILT_WITH_CLANG 0
#endif

namespace parity {
namespace {
namespace fs = std::filesystem;

int shell(const std::string& command, const std::string& log) {
  const int status = std::system((command + " > " + log + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(CapturePackage, InstalledLibraryIsFoundAndLinkedByAnotherProject) {
#if defined(__SANITIZE_ADDRESS__) || ASAN_BUILT_WITH_CLANG
  // An instrumented library needs the sanitizer runtime loaded first, which a consumer built
  // without it does not do; the package is checked by the plain build.
  GTEST_SKIP() << "sanitizer build: the installed library carries the sanitizer runtime";
#endif
  const std::string dir = test::temp_dir("capture-package"), prefix = dir + "/prefix",
                    log = dir + "/log";
  const std::string cmake = PARITY_CMAKE_COMMAND;
  ASSERT_EQ(
      shell(cmake + " --install " + PARITY_BUILD_DIR + " --component capture --prefix " + prefix,
            log),
      0)
      << slurp(log);
  // find_package from a C project.
  const std::string consumer = std::string(PARITY_SOURCE_DIR) + "/examples/capture_consumer";
  ASSERT_EQ(
      shell(cmake + " -S " + consumer + " -B " + dir + "/build -DCMAKE_PREFIX_PATH=" + prefix +
                " -DCMAKE_BUILD_TYPE=Release && " + cmake + " --build " + dir + "/build",
            log),
      0)
      << slurp(log);
  const std::string out = dir + "/consumer.h5";
  ASSERT_EQ(shell(dir + "/build/consumer " + test::tiny_model_dir() + " " + out + " 64", log), 0)
      << slurp(log);
  EXPECT_NE(slurp(log).find("refused as expected: capture " + out +
                            ": stage final_norm, position 0: 63 values"),
            std::string::npos)
      << slurp(log);
  const TraceReader r(out);
  EXPECT_EQ(r.meta().backend, "consumer");
  EXPECT_EQ(r.entries().size(), 2u);
  // pkg-config and a bare compiler call.
  fs::remove(out);
  const std::string libdir = fs::exists(prefix + "/lib/pkgconfig/parity_capture.pc")
                                 ? prefix + "/lib"
                                 : (fs::directory_iterator(prefix + "/lib")->path()).string();
  ASSERT_TRUE(fs::exists(libdir + "/pkgconfig/parity_capture.pc")) << libdir;
  ASSERT_EQ(shell("cc " + consumer + "/consumer.c $(PKG_CONFIG_PATH=" + libdir +
                      "/pkgconfig pkg-config --cflags --libs parity_capture) -Wl,-rpath," + libdir +
                      " -o " + dir + "/consumer-pc && " + dir + "/consumer-pc " +
                      test::tiny_model_dir() + " " + out + " 64",
                  log),
            0)
      << slurp(log);
  EXPECT_TRUE(fs::exists(out));
  // Only the C API leaves the library.
  ASSERT_EQ(shell("nm -D --defined-only " + libdir + "/libparity_capture.so", log), 0)
      << slurp(log);
  const std::string symbols = slurp(log);
  EXPECT_NE(symbols.find("parity_capture_record_copy"), std::string::npos) << symbols;
  EXPECT_EQ(symbols.find("_ZN6parity"), std::string::npos) << "C++ symbols of the project leak:\n"
                                                           << symbols;
  // The Python twin is installed beside it.
  EXPECT_TRUE(fs::exists(prefix + "/share/gpt-oss-parity/python/parity_capture/__init__.py"));
  EXPECT_TRUE(fs::exists(prefix + "/share/gpt-oss-parity/python/parity_capture/hf.py"));
}

TEST(CapturePackage, DeviceHeaderCompilesWithNvcc) {
  // nvcc on PATH, else where the CUDA toolkit installs it (as the build looks for it).
  std::string nvcc = "nvcc";
  if (std::system("command -v nvcc > /dev/null 2>&1") != 0) {
    nvcc = "/usr/local/cuda/bin/nvcc";
    if (!fs::exists(nvcc)) GTEST_SKIP() << "no nvcc (neither on PATH nor " << nvcc << ")";
  }
  const std::string dir = test::temp_dir("capture-nvcc"), log = dir + "/log";
  const std::string src = std::string(PARITY_SOURCE_DIR);
  ASSERT_EQ(shell(nvcc + " -c -I" + src + "/capture " + src +
                      "/examples/capture_consumer/device_record.cu -o " + dir + "/device_record.o",
                  log),
            0)
      << slurp(log);
}

}  // namespace
}  // namespace parity
