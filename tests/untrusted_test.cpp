// The readers of untrusted input: quoting for error lines, regular files only, bounded JSON,
// checked size arithmetic.
#include "model/untrusted.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "model/error.h"
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

TEST(Untrusted, OneLineEscapesControlCharactersAndInvalidUtf8Only) {
  EXPECT_EQ(one_line("a.h5: bad\nline \"x\" \xc3\x97"), "a.h5: bad\\nline \"x\" \xc3\x97");
  EXPECT_EQ(one_line(std::string(10, 'y'), 4), "yyyy... (6 more bytes)");
  // What a terminal would act on or cannot show: C1 controls (CSI), DEL, invalid UTF-8.
  EXPECT_EQ(one_line("a\xc2\x9b" "31mb\x7f\xff\xc3"), "a\\xc2\\x9b31mb\\x7f\\xff\\xc3");
  EXPECT_EQ(one_line("tab\there\r"), "tab\\x09here\\r");
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

TEST(Untrusted, DanglingSymlinkIsNamedAsOne) {
  const std::string dir = test::temp_dir("untrusted-link");
  const std::string link = dir + "/tokenizer.json";
  ASSERT_EQ(::symlink((dir + "/gone.json").c_str(), link.c_str()), 0);
  const std::string e = error_of([&] { read_small_file(link, 100, "tokenizer.json"); });
  EXPECT_NE(e.find(link), std::string::npos) << e;
  EXPECT_NE(e.find("symbolic link to a file that does not exist"), std::string::npos) << e;
}

TEST(Untrusted, JsonWithBytesAfterANulIsRefused) {
  // nlohmann's lexer ends the input at a NUL: without the check these parsed as their prefix.
  for (const std::string& text : {std::string("{\"a\": 1}\0garbage", 16), std::string("[1]\0", 4),
                                  std::string("{\"a\": \"x\0y\"}", 12)}) {
    const std::string e = error_of([&] { parse_json(text, "gen.json"); });
    EXPECT_NE(e.find("gen.json: not valid JSON"), std::string::npos) << e;
    EXPECT_NE(e.find("NUL byte"), std::string::npos) << e;
  }
  EXPECT_NE(error_of([] { parse_json("{\"a\": 1} x", "t.json"); }).find("not valid JSON"),
            std::string::npos);
}

TEST(Untrusted, JsonOfManyObjectsReadsWhole) {
  // 100,000 objects in an array (a tokenizer.json's added_tokens), in linear time: nlohmann's
  // callback parser, which the depth cap used, rescanned the array at the end of each object.
  constexpr int kCount = 100000;
  std::string text = "[";
  for (int i = 0; i < kCount; ++i)
    text += fmt::format("{}{{\"id\": {}, \"s\": \"[{{\"}}", i ? "," : "", i);
  text += "]";
  const nlohmann::json j = parse_json(text, "many.json");
  ASSERT_EQ(j.size(), size_t(kCount));
  EXPECT_EQ(j[0]["id"], 0);
  EXPECT_EQ(j[kCount - 1]["id"], kCount - 1);
  EXPECT_EQ(j[kCount / 2]["s"], "[{") << "brackets in strings are not nesting";
  // The nesting limit counts arrays and objects, not brackets inside strings.
  EXPECT_NO_THROW(parse_json("[\"" + std::string(1000, '[') + "\"]", "strings.json"));
  EXPECT_NO_THROW(parse_json("[\"\\\"[[[\"]", "escaped.json"));
  EXPECT_NE(error_of([] { parse_json(std::string(65, '{'), "x.json"); }).find("deeper than 64"),
            std::string::npos);
}

TEST(Untrusted, ByteSizesAreStrict) {
  EXPECT_EQ(parse_byte_size("4096", "--x"), 4096u);
  EXPECT_EQ(parse_byte_size("3K", "--x"), 3072u);
  EXPECT_EQ(parse_byte_size("2g", "--x"), uint64_t(2) << 30);
  EXPECT_EQ(parse_byte_size("5M", "--x"), uint64_t(5) << 20);
  for (const std::string bad : {"", " -5", "-5", " 5", "5 ", "+5", "0", "K", "1.5G", "0x10",
                                "18446744073709551616", "17179869184G", "free"}) {
    const std::string e = error_of([&] { parse_byte_size(bad, "--kv-memory"); });
    EXPECT_NE(e.find("--kv-memory \"" + bad + "\": not a positive number of bytes"),
              std::string::npos)
        << bad << ": " << e;
  }
}

TEST(Untrusted, CheckedSizeArithmetic) {
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20, "n"), int64_t(1) << 40);
  EXPECT_NE(error_of([] { checked_mul(int64_t(1) << 40, int64_t(1) << 40, "elements"); }).find("elements"),
            std::string::npos);
  EXPECT_NE(error_of([] { checked_add(INT64_MAX, 1, "bytes"); }).find("bytes"), std::string::npos);
}

}  // namespace
}  // namespace parity
