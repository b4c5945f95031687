// The getp request file and output lines (engine/requests.h).
#include <gtest/gtest.h>

#include "engine/requests.h"

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
