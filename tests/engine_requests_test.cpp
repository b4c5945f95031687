// The getp request file and output lines (engine/requests.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "engine/requests.h"
#include "tokenizer/tiny_tokenizer.h"
#include "model/error.h"
#include "tests/test_util.h"

namespace parity {
namespace {

TEST(EngineRequests, LinesAreUnescapedAndNumbered) {
  const auto lines = parse_requests("hello\\nworld\r\na \\\\ b\nlast");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].line, 1);
  EXPECT_EQ(lines[0].prompt, "hello\nworld");
  EXPECT_EQ(lines[1].prompt, "a \\ b");
  EXPECT_EQ(lines[2].line, 3);
  EXPECT_EQ(lines[2].prompt, "last");
  for (const auto& l : lines) EXPECT_EQ(l.error, "");
}

TEST(EngineRequests, BadLinesAreErrorsOfTheirOwn) {
  const auto lines = parse_requests("ok\n\nbad \xff byte\nbad \\q escape\ntrailing \\\nfine\n");
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0].error, "");
  EXPECT_EQ(lines[1].error, "empty prompt");
  EXPECT_NE(lines[2].error.find("invalid UTF-8"), std::string::npos) << lines[2].error;
  EXPECT_NE(lines[3].error.find("unknown escape"), std::string::npos) << lines[3].error;
  EXPECT_NE(lines[4].error.find("lone backslash"), std::string::npos) << lines[4].error;
  EXPECT_EQ(lines[5].error, "");
  EXPECT_EQ(lines[5].prompt, "fine");
}

TEST(EngineRequests, UnreadableFileIsAnError) {
  EXPECT_THROW(read_request_file("/nonexistent/requests.txt"), std::exception);
}

TEST(EngineRequests, OnlyRegularFilesAreRead) {
  const std::string dir = test::temp_dir("requests-files");
  const auto error_of = [](const std::string& path) {
    try {
      read_request_file(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A directory read as empty (no lines, exit 0, an empty output); a FIFO blocked forever.
  EXPECT_NE(error_of(dir).find(dir + ": is a directory"), std::string::npos) << error_of(dir);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of(fifo).find(fifo + ": is not a regular file"), std::string::npos);
}

TEST(EngineRequests, TokenIdFilesNameTheFileAndLine) {
  const Tokenizer t = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny/tokenizer.json");
  EXPECT_EQ(decode_token_id_file("72 105\n\n33\n", "ids.txt", t), "Hi!");
  EXPECT_EQ(decode_token_id_file("", "ids.txt", t), "");
  const auto error_of = [&](const std::string& text) {
    try {
      decode_token_id_file(text, "ids.txt", t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Not ids: signs (-0 was read as 0), other bases, words.
  for (const std::string word : {"-0", "+1", "-5", "0x10", "1e3", "x3", "7,"})
    EXPECT_NE(error_of("72\n1 " + word + "\n")
                  .find("ids.txt: line 2: \"" + word + "\" is not a token id"),
              std::string::npos)
        << word << ": " << error_of("72\n1 " + word);
  // An id the tokenizer lacks is the ids file's fault, with its line, not the tokenizer's.
  for (const std::string id : {"1024", "2147483648", "99999999999999999999999"}) {
    const std::string e = error_of("1\n2\n3 " + id);
    EXPECT_EQ(e.rfind("ids.txt: line 3: token id \"" + id +
                          "\" is not in the vocabulary of "
                          "tiny/tokenizer.json (ids 0..1023)",
                      0),
              0u)
        << e;
  }
}

TEST(EngineRequests, OutputLines) {
  RequestOutcome ok{3, "", {5, 6, 7}, "a\tb\nc\\"};
  EXPECT_EQ(format_outcome(ok, false), "5 6 7");
  EXPECT_EQ(format_outcome(ok, true), "5 6 7\ta\\tb\\nc\\\\");
  RequestOutcome bad{4, "empty prompt", {}, ""};
  EXPECT_EQ(format_outcome(bad, true), "ERROR line 4: empty prompt");
  EXPECT_EQ(escape_text(std::string("x\x01y", 3)), "x\\x01y");
}

}  // namespace
}  // namespace parity
