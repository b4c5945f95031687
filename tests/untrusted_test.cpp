// The readers of untrusted input: quoting for error lines, regular files only, bounded JSON,
// checked size arithmetic.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "model/error.h"
#include "model/untrusted.h"
#include "tests/test_util.h"

namespace parity {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Untrusted, QuotedEscapesAndCaps) {
  EXPECT_EQ(quoted("abc"), "\"abc\"");
  EXPECT_EQ(quoted("a\nb\x1b"), "\"a\\nb\\x1b\"");
  EXPECT_EQ(quoted(std::string(100, 'x'), 10), "\"xxxxxxxxxx\"... (90 more bytes)");
  EXPECT_EQ(quoted("\xc3\xa9"), "\"\\xc3\\xa9\"");
  EXPECT_EQ(quoted(std::string(100, '\x01'), 10), "\"\\x01\\x01\"... (98 more bytes)")
      << "the cap counts escapes as shown";
}

TEST(Untrusted, OneLineEscapesControlCharactersOnly) {
  EXPECT_EQ(one_line("a.h5: bad\nline \"x\" \xc3\x97"), "a.h5: bad\\nline \"x\" \xc3\x97");
  EXPECT_EQ(one_line(std::string(10, 'y'), 4), "yyyy... (6 more bytes)");
}

TEST(Untrusted, RegularFilesOnly) {
  const std::string dir = test::temp_dir("untrusted");
  const std::string file = dir + "/f.json", fifo = dir + "/fifo";
  std::ofstream(file) << "{\"a\": 1}";
  EXPECT_EQ(read_small_file(file, 100, "config"), "{\"a\": 1}");
  EXPECT_NE(error_of([&] { read_small_file(file, 3, "config"); }).find("larger than"), std::string::npos);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e = error_of([&] { read_small_file(fifo, 100, "config"); });
  EXPECT_NE(e.find(fifo), std::string::npos) << e;
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { read_small_file("/dev/zero", 100, "config"); }).find("not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_small_file(dir, 100, "config"); }).find("directory"), std::string::npos);
  EXPECT_NE(error_of([&] { read_small_file(dir + "/none", 100, "config"); }).find("no such file"),
            std::string::npos);
}

TEST(Untrusted, JsonIsBoundedAndNamesItsSource) {
  EXPECT_EQ(parse_json("{\"a\": [1, 2]}", "src")["a"][1], 2);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string e = error_of([&] { parse_json(deep, "deep.json"); });
  EXPECT_NE(e.find("deep.json"), std::string::npos) << e;
  EXPECT_NE(e.find("deeper than"), std::string::npos) << e;
  EXPECT_LT(e.size(), 200u);
  EXPECT_NO_THROW(parse_json(std::string(64, '[') + std::string(64, ']'), "ok"));
  e = error_of([&] { parse_json("{\"x\": 1e400}", "big.json"); });
  EXPECT_NE(e.find("big.json"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of([&] { parse_json("{\"x\": ", "cut.json"); });
  EXPECT_NE(e.find("cut.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
}

TEST(Untrusted, CheckedSizeArithmetic) {
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20, "n"), int64_t(1) << 40);
  EXPECT_NE(error_of([] { checked_mul(int64_t(1) << 40, int64_t(1) << 40, "elements"); }).find("elements"),
            std::string::npos);
  EXPECT_NE(error_of([] { checked_add(INT64_MAX, 1, "bytes"); }).find("bytes"), std::string::npos);
}

}  // namespace
}  // namespace parity
