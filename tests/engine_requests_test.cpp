// The getp request file and output lines (engine/requests.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

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

TEST(EngineRequests, JsonLinesCarryTheirOwnLengths) {
  const auto lines = parse_jsonl_requests(
      "{\"prompt\": \"hello\\nworld\", \"max_tokens\": 200}\r\n"
      "{\"prompt_token_ids\": [1, 2, 16777215], \"ignore_eos\": true}\n"
      "  {\"max_tokens\": 1, \"prompt\": \"a\\\\n\", \"ignore_eos\": false}  \n"
      "{\"prompt_token_ids\": [0]}");
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& l : lines) EXPECT_EQ(l.error, "") << "line " << l.line;
  EXPECT_EQ(lines[0].prompt, "hello\nworld");  // JSON's escapes, not the text file's
  EXPECT_TRUE(lines[0].prompt_ids.empty());
  EXPECT_EQ(lines[0].max_tokens, 200);
  EXPECT_FALSE(lines[0].ignore_eos);
  EXPECT_EQ(lines[1].prompt, "");
  EXPECT_EQ(lines[1].prompt_ids, (std::vector<TokenId>{1, 2, 16777215}));
  EXPECT_EQ(lines[1].max_tokens, 0);  // the run's -n
  EXPECT_TRUE(lines[1].ignore_eos);
  EXPECT_EQ(lines[2].line, 3);
  EXPECT_EQ(lines[2].prompt, "a\\n");
  EXPECT_EQ(lines[2].max_tokens, 1);
  EXPECT_EQ(lines[3].prompt_ids, std::vector<TokenId>{0});
}

TEST(EngineRequests, BadJsonLinesFailAloneWithOneClearLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty line (a JSON object is expected)"},
      {"  \t", "empty line (a JSON object is expected)"},
      {"[1, 2]", "not a JSON object: \"[1,2]\""},
      {"\"text\"", "not a JSON object: \"text\""},
      {"{}", "no prompt: \"prompt\" (text) or \"prompt_token_ids\" (token ids) is required"},
      {"{\"max_tokens\": 3}", "no prompt: "},
      {"{\"prompt\": \"a\", \"prompt_token_ids\": [1]}",
       "both \"prompt\" and \"prompt_token_ids\": give one of them"},
      {"{\"prompt\": 5}", "\"prompt\" must be a string, not \"5\""},
      {"{\"prompt\": [\"a\"]}", "\"prompt\" must be a string, not \"[\\\"a\\\"]\""},
      {"{\"prompt\": \"\"}", "empty prompt"},
      {"{\"prompt_token_ids\": []}", "empty prompt (\"prompt_token_ids\" holds no id)"},
      {"{\"prompt_token_ids\": \"1 2\"}",
       "\"prompt_token_ids\" must be an array of token ids, not \"1 2\""},
      {"{\"prompt_token_ids\": [1, -1]}",
       "\"prompt_token_ids\"[1]: \"-1\" is not a token id (0 to 16777215)"},
      {"{\"prompt_token_ids\": [1.0]}", "\"prompt_token_ids\"[0]: \"1.0\" is not a token id"},
      {"{\"prompt_token_ids\": [16777216]}", "[0]: \"16777216\" is not a token id"},
      {"{\"prompt_token_ids\": [18446744073709551615]}", "is not a token id"},
      {"{\"prompt_token_ids\": [[1]]}", "[0]: \"[1]\" is not a token id"},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}",
       "\"max_tokens\" must be a whole number from 1 to 2147483647, not \"0\""},
      {"{\"prompt\": \"a\", \"max_tokens\": -5}", "must be a whole number from 1"},
      {"{\"prompt\": \"a\", \"max_tokens\": 2147483648}", "not \"2147483648\""},
      {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", "not \"2.5\""},
      {"{\"prompt\": \"a\", \"max_tokens\": \"9\"}", "not \"9\""},
      {"{\"prompt\": \"a\", \"ignore_eos\": 1}", "\"ignore_eos\" must be true or false, not \"1\""},
      {"{\"prompt\": \"a\", \"max_token\": 5}",
       "unknown key \"max_token\" (the keys are prompt, prompt_token_ids, max_tokens, "
       "ignore_eos)"},
      {"{\"prompt\": \"a\"} x", "not valid JSON (byte "},
      {"{\"prompt\": \"a\"}{}", "not valid JSON (byte "},
      {"{\"prompt\": \"a\"", "not valid JSON (byte "},
      {std::string("{\"prompt\": \"a\"}\0", 16), "a NUL byte at the end"},
      {std::string("{\"prompt\": \"a\0b\"}", 17), "a NUL byte, with more bytes after it"},
      {"{\"prompt\": \"a\", \"x\": " + std::string(100, '[') + std::string(100, ']') + "}",
       "JSON nested deeper than 64 levels"},
      {"{\"prompt\": \"caf\xc3\"}", "invalid UTF-8 at byte 16 of the line"},
      {"{\"prompt\": \"" + std::string(5000, 'x') + "\", \"max_tokens\": {}}", "not \"{}\""},
  };
  std::string text = "{\"prompt\": \"first\"}\n";
  for (const auto& c : cases) text += c.first + "\n";
  text += "{\"prompt\": \"last\"}";
  const auto lines = parse_jsonl_requests(text);
  ASSERT_EQ(lines.size(), cases.size() + 2);
  EXPECT_EQ(lines.front().error, "");
  EXPECT_EQ(lines.front().prompt, "first");
  EXPECT_EQ(lines.back().error, "");
  EXPECT_EQ(lines.back().prompt, "last");
  EXPECT_EQ(lines.back().line, int(cases.size()) + 2);
  for (size_t i = 0; i < cases.size(); ++i) {
    const RequestLine& l = lines[i + 1];
    const std::string& expected = cases[i].second;
    EXPECT_EQ(l.line, int(i) + 2);
    EXPECT_NE(l.error.find(expected), std::string::npos) << "line " << l.line << ": " << l.error;
    // One line of bounded length, and nothing of the request kept.
    EXPECT_EQ(l.error.find('\n'), std::string::npos) << l.error;
    EXPECT_LT(l.error.size(), 300u) << l.error;
    EXPECT_TRUE(l.prompt.empty() && l.prompt_ids.empty()) << "line " << l.line;
    EXPECT_EQ(l.max_tokens, 0) << "line " << l.line;
  }
}

TEST(EngineRequests, OnlyJsonlNamesAreJsonLines) {
  EXPECT_TRUE(is_jsonl_request_file("bench.jsonl"));
  EXPECT_TRUE(is_jsonl_request_file("/tmp/x.y/r.jsonl"));
  EXPECT_FALSE(is_jsonl_request_file("requests.txt"));
  EXPECT_FALSE(is_jsonl_request_file("requests.json"));
  EXPECT_FALSE(is_jsonl_request_file("jsonl"));
  EXPECT_FALSE(is_jsonl_request_file("r.jsonl.txt"));
  // A .txt file holding JSON is prompts of text; a .jsonl file is JSON.
  const std::string dir = test::temp_dir("requests-jsonl");
  const std::string line = "{\"prompt\": \"hi\", \"max_tokens\": 4}\n";
  for (const std::string name : {"/r.txt", "/r.jsonl"}) {
    std::ofstream(dir + name) << line;
    const auto lines = read_request_file(dir + name);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].error, "");
    EXPECT_EQ(lines[0].prompt, name == "/r.txt" ? line.substr(0, line.size() - 1) : "hi");
    EXPECT_EQ(lines[0].max_tokens, name == "/r.txt" ? 0 : 4);
  }
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
