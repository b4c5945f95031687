// The o200k_harmony tokenizer (tokenizer/tokenizer.h): merge ranks, special tokens, the streaming
// decoder, invalid UTF-8 and bad files on small hand-made tokenizer.json files; the tiny model's
// tokenizer against a naive BPE; and the oracle test, zero mismatches against js-tiktoken's
// o200k_base encodings of tests/data/tokenizer_corpus.txt and of random texts
// (scripts/tokenizer_oracle.sh writes them; the test skips only when they are absent).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/harmony.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/utf8.h"
#include "model/error.h"
#include "model/untrusted.h"
#include "tests/test_util.h"

namespace parity {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<TokenId>;

// ---- a hand-made tokenizer.json -----------------------------------------------------------------
// Ids 0..255 the bytes, then the tokens below; merges in the order given (rank = index).
struct TinySpec {
  std::vector<std::string> tokens = {"ab", "bc", "abc", "cd", "aa", "xyz", "\xF0\x9F", "\x98\x80"};
  std::vector<std::pair<std::string, std::string>> merges = {
      {"b", "c"}, {"a", "b"}, {"a", "bc"}, {"c", "d"}, {"a", "a"}};
  json added = json::array({
      {{"id", 300}, {"content", "<|start|>"}, {"special", true}},
      {{"id", 301}, {"content", "<|end|>"}, {"special", true}},
      {{"id", 302}, {"content", "[A]"}, {"special", true}},
      {{"id", 303}, {"content", "[A][B]"}, {"special", true}},
      {{"id", 304}, {"content", "@@"}, {"special", false}},
  });
  bool ignore_merges = true;
  bool merges_as_pairs = false;
};

json tiny_json(const TinySpec& spec = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_string(std::string(1, char(b)))] = b;
  for (size_t i = 0; i < spec.tokens.size(); ++i)
    vocab[byte_level_string(spec.tokens[i])] = 256 + int(i);
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    if (spec.merges_as_pairs)
      merges.push_back({byte_level_string(a), byte_level_string(b)});
    else
      merges.push_back(byte_level_string(a) + " " + byte_level_string(b));
  }
  return {{"version", "1.0"},
          {"added_tokens", spec.added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", kO200kPattern}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

Tokenizer tiny(const TinySpec& spec = {}) {
  return Tokenizer::parse(tiny_json(spec).dump(), "tiny.json");
}

TokenId byte_id(char c) {
  return TokenId(uint8_t(c));
}

std::string read_all_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The message of the Error `f` throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no parity::Error thrown";
  return "";
}

std::string parse_error(const json& j) {
  return error_of([&] { Tokenizer::parse(j.dump(), "bad.json"); });
}

// ---- encoding -----------------------------------------------------------------------------------

TEST(Tokenizer, MergesApplyInRankOrderLeftmostFirst) {
  const Tokenizer t = tiny();
  // "abcd": (b,c) has rank 0, so a|bc|d; then (a,bc) rank 2 makes abc; (abc,d) is no merge.
  EXPECT_EQ(t.encode("abcd", false), (Ids{258, byte_id('d')}));
  // With (a,b) first, the same bytes become ab|cd.
  TinySpec swapped;
  swapped.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}, {"c", "d"}, {"a", "a"}};
  EXPECT_EQ(tiny(swapped).encode("abcd", false), (Ids{256, 259}));
  // A tie between equal pairs merges the leftmost: aaa -> aa|a, not a|aa.
  EXPECT_EQ(t.encode("aaa", false), (Ids{260, byte_id('a')}));
  EXPECT_EQ(t.encode("aaaa", false), (Ids{260, 260}));
  // Merges as ["a", "b"] pairs read the same.
  TinySpec pairs;
  pairs.merges_as_pairs = true;
  EXPECT_EQ(tiny(pairs).encode("abcd", false), (Ids{258, byte_id('d')}));
  EXPECT_EQ(t.merge_count(), 5u);
}

TEST(Tokenizer, WholePieceWinsWithIgnoreMerges) {
  // "xyz" is a token no merge reaches: a piece that is exactly it is that token only when
  // ignore_merges is set (tiktoken's rule, and the hub file's setting).
  EXPECT_EQ(tiny().encode("xyz", false), (Ids{261}));
  TinySpec strict;
  strict.ignore_merges = false;
  EXPECT_EQ(tiny(strict).encode("xyz", false), (Ids{byte_id('x'), byte_id('y'), byte_id('z')}));
}

TEST(Tokenizer, PiecesFollowTheO200kPattern) {
  const Tokenizer t = tiny();
  using V = std::vector<std::string>;
  EXPECT_EQ(t.pre_tokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(t.pre_tokenize("I'M here"), (V{"I'M", " here"}));
  EXPECT_EQ(t.pre_tokenize("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(t.pre_tokenize("a  \n\n b"), (V{"a", "  \n\n", " b"}));
  EXPECT_EQ(t.pre_tokenize("x   y"), (V{"x", "  ", " y"}));
  EXPECT_EQ(t.pre_tokenize("HTTPServer"), (V{"HTTPServer"}));
  EXPECT_EQ(t.pre_tokenize("end.   "), (V{"end", ".", "   "}));
  // U+0085 (NEL) is whitespace, as in tiktoken's Rust regex and Hugging Face's Oniguruma (PCRE2
  // alone would not count it): x NEL NEL y is cut as x | NEL | NEL y.
  EXPECT_EQ(t.pre_tokenize("x\u0085\u0085y"), (V{"x", "\u0085", "\u0085y"}));
  EXPECT_EQ(t.pre_tokenize("a \u0085b"), (V{"a", " ", "\u0085b"}));
  // Long runs stay linear and whole: a megabyte of spaces, of letters, of digits.
  EXPECT_EQ(t.pre_tokenize(std::string(1 << 20, ' ')).size(), 1u);
  EXPECT_EQ(t.pre_tokenize(std::string(1 << 20, 'q')).size(), 1u);
  EXPECT_EQ(t.pre_tokenize(std::string(3 << 18, '7')).size(), size_t(1) << 18);
}

TEST(Tokenizer, LongPiecesMergeInOneHeapPass) {
  // One piece of a million bytes: the heap merge is O(n log n), not the quadratic rescan.
  const Tokenizer t = tiny();
  const Ids ids = t.encode(std::string(1 << 20, 'a'), false);
  ASSERT_EQ(ids.size(), size_t(1) << 19);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 260), 1 << 19);
  // The cache keeps short pieces only; repeated and long ones give the same ids again.
  EXPECT_EQ(t.encode(std::string(1 << 20, 'a'), false), ids);
  EXPECT_EQ(t.encode("abcd abcd abcd", false), t.encode("abcd abcd abcd", false));
}

TEST(Tokenizer, NelJoinsWhitespaceOutsideAndInsideClasses) {
  EXPECT_EQ(with_nel_as_space(R"(\s+(?!\S)|\s+)"), R"([\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)");
  EXPECT_EQ(with_nel_as_space(R"( ?[^\s\p{L}\p{N}]+)"), R"( ?[^\s\x{85}\p{L}\p{N}]+)");
  // Literal text, a leading ']' and POSIX classes are not misread; \S in a class is left alone.
  EXPECT_EQ(with_nel_as_space(R"(\Q\s\E[]\s][[:space:]\S][\S])"),
            R"(\Q\s\E[]\s\x{85}][[:space:]\S][\S])");
  // Empty matches make no piece; unmatched text between matches is a piece of its own.
  const PreTokenizer digits("[0-9]*", false, "test");
  EXPECT_EQ(digits.split("ab12c3"), (std::vector<std::string_view>{"ab", "12", "c", "3"}));
  EXPECT_NE(error_of([] { PreTokenizer("a{2,1}", false, "test"); }).find("test: the regex"),
            std::string::npos);
  EXPECT_EQ(PreTokenizer("a.b", true, "test").split("xa.bya+b"),
            (std::vector<std::string_view>{"x", "a.b", "ya+b"}));
}

TEST(Tokenizer, SpecialTokensOnlyWhenAllowed) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("<|start|>aa<|end|>", true), (Ids{300, 260, 301}));
  // Not allowed: the same characters are text.
  const Ids as_text = t.encode("<|start|>aa<|end|>", false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 300), 0);
  EXPECT_EQ(t.decode(as_text), "<|start|>aa<|end|>");
  // The longest added token at a position wins; text around and between is encoded as usual.
  EXPECT_EQ(t.encode("[A][B]", true), (Ids{303}));
  EXPECT_EQ(t.encode("[A][C]", true), (Ids{302, byte_id('['), byte_id('C'), byte_id(']')}));
  EXPECT_EQ(t.encode("aa<|end|><|end|>", true), (Ids{260, 301, 301}));
  // An added token that is not special splits the text either way.
  EXPECT_EQ(t.encode("aa@@aa", false), (Ids{260, 304, 260}));
  // Lookups by text.
  EXPECT_EQ(t.added("<|end|>"), 301);
  EXPECT_FALSE(t.find_added("<|missing|>"));
  EXPECT_FALSE(t.find_added("<|end"));
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(304));
  EXPECT_FALSE(t.is_special(97));
  EXPECT_NE(error_of([&] { t.added("<|call|>"); }).find("tiny.json: has no added token"),
            std::string::npos);
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  const Tokenizer t = tiny();
  const std::pair<std::string, std::string> cases[] = {
      {std::string("ab\xC3(", 4), "at byte 2 of 4"},           // a lead byte, no continuation
      {std::string("\xC0\xAF", 2), "at byte 0 of 2"},          // overlong '/'
      {std::string("ok \xED\xA0\x80", 6), "at byte 3 of 6"},   // a UTF-16 surrogate
      {std::string("abc\xE2\x82", 5), "at byte 3 of 5"},       // cut at the end
      {std::string("\xF4\x90\x80\x80", 4), "at byte 0 of 4"},  // above U+10FFFF
      {std::string("z\x80", 2), "at byte 1 of 2"},             // a lone continuation byte
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { t.encode(c.first, true); });
    EXPECT_NE(e.find("invalid UTF-8 " + c.second), std::string::npos) << e;
  }
  EXPECT_EQ(t.decode(t.encode("\xF0\x9F\x98\x80 \xC3\xA9", false)), "\xF0\x9F\x98\x80 \xC3\xA9");
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.id_end(), 305);
  EXPECT_EQ(t.token_count(), 256u + 8u + 5u);
  EXPECT_EQ(t.decode(Ids{300, 258, 301}), "<|start|>abc<|end|>");
  for (const TokenId bad : {-1, 264, 305, 1 << 30}) {
    const std::string e = error_of([&] { t.decode(Ids{97, bad}); });
    EXPECT_NE(e.find(fmt::format("tiny.json: cannot decode token id {} (index 1 of 2)", bad)),
              std::string::npos)
        << e;
  }
  EXPECT_NE(error_of([&] { t.token_bytes(270); }).find("this one unused"), std::string::npos);
}

// ---- the streaming decoder ----------------------------------------------------------------------

TEST(TokenizerStreaming, HoldsBackAnIncompleteCharacter) {
  const Tokenizer t = tiny();
  StreamingDecoder d(t);
  // 😀 = F0 9F 98 80 in two tokens: nothing until the second arrives.
  EXPECT_EQ(d.push(byte_id('a')), "a");
  EXPECT_EQ(d.push(262), "");
  EXPECT_EQ(d.held_back(), 2u);
  EXPECT_EQ(d.push(263), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.held_back(), 0u);
  // Byte by byte, with a special token after.
  for (const char c : std::string("\xF0\x9F\x98")) EXPECT_EQ(d.push(byte_id(c)), "");
  EXPECT_EQ(d.push(byte_id('\x80')), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(301), "<|end|>");
  EXPECT_EQ(d.finish(), "");
}

TEST(TokenizerStreaming, ReplacesWhatCanNeverBeText) {
  const Tokenizer t = tiny();
  StreamingDecoder d(t);
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(d.push(0xFF), fffd);                // never valid
  EXPECT_EQ(d.push(262), "");                   // F0 9F: a start...
  EXPECT_EQ(d.push(byte_id('a')), fffd + "a");  // ...broken by 'a': one U+FFFD for both
  EXPECT_EQ(d.push(byte_id('\xE2')), "");
  EXPECT_EQ(d.finish(), fffd);  // cut off at the end
  EXPECT_EQ(d.held_back(), 0u);
  EXPECT_NE(error_of([&] { d.push(999); }).find("token id 999"), std::string::npos);
}

TEST(TokenizerStreaming, ConcatenationEqualsDecode) {
  const Tokenizer t = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  const std::string text =
      "Family: 👨‍👩‍👧‍👦, flags 🇯🇵🇫🇷, 日本語, नमस्ते, "
      "مرحبا\n\tdone. ";
  const Ids ids = t.encode(text, false);
  StreamingDecoder d(t);
  std::string streamed;
  for (const TokenId id : ids) {
    const std::string part = d.push(id);
    EXPECT_EQ(utf8_invalid_offset(part), std::string::npos);  // every part is whole characters
    streamed += part;
  }
  streamed += d.finish();
  EXPECT_EQ(streamed, text);
}

TEST(TokenizerFiles, ManyAddedTokensAllLoadAndMatch) {
  // 50,000 added tokens (their objects in one array): each is found, the longest match wins,
  // and they load in linear time (the JSON reader was quadratic in them: 100,000 took 10 s in
  // a release build).
  constexpr int kCount = 50000;
  json j = tiny_json();
  const TokenId first = TokenId(j["added_tokens"].size()) + 300;
  json& added = j["added_tokens"];
  for (int i = 0; i < kCount; ++i)
    added.push_back(
        {{"id", first + i}, {"content", fmt::format("<|r{}|>", i)}, {"special", i % 2 == 0}});
  const Tokenizer t = Tokenizer::parse(j.dump(), "many.json");
  EXPECT_EQ(t.id_end(), first + kCount);
  EXPECT_EQ(t.added("<|r0|>"), first);
  EXPECT_EQ(t.added("<|r49999|>"), first + 49999);
  EXPECT_TRUE(t.is_special(first + 20000));
  EXPECT_FALSE(t.is_special(first + 20001));
  const Ids ids = t.encode("a<|r12345|>b<|r777|>", true);
  EXPECT_EQ(ids, (Ids{byte_id('a'), first + 12345, byte_id('b'), first + 777}));
  // A special one is text without allow_special; an ordinary added token is matched anyway.
  EXPECT_EQ(t.encode("<|r20001|>", false), Ids{first + 20001});
  EXPECT_NE(t.encode("<|r20000|>", false), Ids{first + 20000});
}

// ---- bad files ----------------------------------------------------------------------------------

TEST(TokenizerFiles, MissingFifoDirectoryAndOversizedFilesAreOneError) {
  const std::string dir = test::temp_dir("tokenizer-files");
  const std::string missing = dir + "/missing.json";
  EXPECT_NE(error_of([&] { Tokenizer::load(missing); }).find(missing + ": no such file"),
            std::string::npos);
  const std::string fifo = dir + "/fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { Tokenizer::load(fifo); }).find(fifo + ": is not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::load(dir); }).find("is a directory"), std::string::npos);
  const std::string big = dir + "/big.json";
  { std::ofstream(big) << "{}"; }
  ASSERT_EQ(::truncate(big.c_str(), off_t(kMaxTokenizerJsonBytes) + 1), 0);  // sparse
  EXPECT_NE(error_of([&] { Tokenizer::load(big); }).find("larger than any tokenizer.json"),
            std::string::npos);
  const std::string malformed = dir + "/malformed.json";
  { std::ofstream(malformed) << R"({"model": {"vocab": {"a": 1,}})"; }
  EXPECT_NE(error_of([&] { Tokenizer::load(malformed); }).find(malformed + ": not valid JSON"),
            std::string::npos);
  // A good file loads from disk too.
  const std::string good = dir + "/tokenizer.json";
  { std::ofstream(good) << tiny_json().dump(); }
  EXPECT_EQ(Tokenizer::load(good).id_end(), 305);
}

TEST(TokenizerFiles, BadContentsNameTheFileAndTheFault) {
  std::vector<std::pair<json, std::string>> cases;
  const auto with = [&](auto&& edit, std::string expected) {
    json j = tiny_json();
    edit(j);
    cases.emplace_back(std::move(j), std::move(expected));
  };
  with([](json& j) { j = json::array(); }, "the top level is not a JSON object");
  with([](json& j) { j.erase("model"); }, "no \"model\" object");
  with([](json& j) { j["model"]["type"] = "WordPiece"; }, "type \"WordPiece\" is not supported");
  with([](json& j) { j["model"]["vocab"][byte_level_string("zz")] = 5; },
       "model.vocab gives id 5 to two tokens");
  with([](json& j) { j["model"]["vocab"]["q"] = -1; }, "id -1 is out of range");
  with([](json& j) { j["model"]["vocab"]["q"] = 1 << 30; }, "id 1073741824 is out of range");
  with([](json& j) { j["model"]["vocab"]["q"] = 2.5; }, "the id must be an integer");
  // Ids far past the tokens' count would make a few bytes allocate a dense table of millions.
  with([](json& j) { j["model"]["vocab"]["q"] = (1 << 24) - 1; },
       "model.vocab reaches id 16777215 with");
  with(
      [](json& j) {
        j["added_tokens"].push_back({{"id", 1 << 23}, {"content", "<x>"}});
      },
      "added_tokens reaches id 8388608 with");
  with([](json& j) { j["model"]["vocab"]["a b"] = 400; }, "not a byte-level string");
  with([](json& j) { j["model"]["vocab"].erase(byte_level_string("\n")); },
       "model.vocab has no token for the byte 0x0a");
  with([](json& j) { j["model"]["merges"].push_back("a zz"); },
       "model.merges[5]: \"zz\" is not a token of model.vocab");
  with([](json& j) { j["model"]["merges"].push_back("x y"); },
       "\"x\" + \"y\" makes \"xy\", which is not a token of model.vocab");
  with([](json& j) { j["model"]["merges"].push_back("b c"); },
       "model.merges[5]: repeats model.merges[0]");
  with([](json& j) { j["model"]["merges"].push_back("abc"); },
       "not two tokens separated by one space");
  with([](json& j) { j["model"]["merges"].push_back(json::array({"a"})); },
       "is neither \"a b\" nor [\"a\", \"b\"]");
  // Without merges the vocabulary's longer tokens are never made: refused, not read as none.
  with([](json& j) { j["model"].erase("merges"); },
       "model.merges must be an array of merges (it is missing)");
  with([](json& j) { j["model"]["merges"] = nullptr; },
       "model.merges must be an array of merges, not \"null\"");
  with([](json& j) { j["model"]["merges"] = "a b"; }, "model.merges must be an array");
  with(
      [](json& j) {
        j["added_tokens"].push_back({{"id", 97}, {"content", "<x>"}});
      },
      "id 97 is already the vocab token \"a\"");
  with(
      [](json& j) {
        j["added_tokens"].push_back({{"id", 300}, {"content", "<x>"}});
      },
      "id 300 is given to two added tokens");
  with(
      [](json& j) {
        j["added_tokens"].push_back({{"id", 310}, {"content", "<|end|>"}});
      },
      "the same text as added token id 301");
  with([](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip is not supported");
  with([](json& j) { j["added_tokens"][0]["content"] = ""; }, "empty content");
  with([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer");
  with([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder");
  with([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback is not supported");
  with([](json& j) { j["model"]["dropout"] = 0.1; }, "dropout \"0.1\" is not supported");
  with([](json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer: missing");
  with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       "does not compile with PCRE2");
  with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "behavior \"Removed\" is not supported");
  with([](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }, "no ByteLevel step");
  with([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "add_prefix_space is not supported");
  with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; },
       "type \"Whitespace\" is not supported");
  for (const auto& [j, expected] : cases) {
    const std::string e = parse_error(j);
    EXPECT_EQ(e.rfind("bad.json: ", 0), 0u) << e;
    EXPECT_NE(e.find(expected), std::string::npos) << "expected \"" << expected << "\" in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(TokenizerFiles, FindsTokenizerJsonInAModelDirectory) {
  const std::string dir = test::temp_dir("tokenizer-dir");
  EXPECT_NE(error_of([&] { find_tokenizer_json(dir); }).find(dir + ": no tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] { find_tokenizer_json(dir + "/nope"); }).find("no such file or directory"),
            std::string::npos);
  { std::ofstream(dir + "/tokenizer.json") << tiny_json().dump(); }
  EXPECT_EQ(find_tokenizer_json(dir), dir + "/tokenizer.json");
  EXPECT_EQ(find_tokenizer_json(dir + "/tokenizer.json"), dir + "/tokenizer.json");
  EXPECT_EQ(Tokenizer::load(find_tokenizer_json(dir)).id_end(), 305);
}

TEST(TokenizerFiles, GptTwoStyleByteLevelPreTokenizer) {
  // A lone ByteLevel with use_regex applies GPT-2's pattern (contractions before letters).
  json j = tiny_json();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const Tokenizer t = Tokenizer::parse(j.dump(), "gpt2.json");
  EXPECT_EQ(t.pre_tokenize("I'm 12345 ok"), (std::vector<std::string>{"I", "'m", " 12345", " ok"}));
}

// ---- harmony ------------------------------------------------------------------------------------

TEST(TokenizerHarmony, UserPromptAndStopTokens) {
  const Tokenizer t = Tokenizer::parse(tiny_tokenizer_json(1024), "tiny");
  const Ids prompt = harmony_user_prompt(t, "What is 2+2? <|end|>");
  // The header and the tail are the specials; the typed "<|end|>" stays text.
  ASSERT_GE(prompt.size(), 6u);
  EXPECT_EQ(prompt.front(), t.added("<|start|>"));
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), t.added("<|end|>")), 1);
  EXPECT_EQ(t.decode(prompt),
            "<|start|>user<|message|>What is 2+2? <|end|><|end|><|start|>assistant");
  const Ids expected =
      t.encode("<|start|>user<|message|>Hello<|end|><|start|>assistant", /*allow_special=*/true);
  EXPECT_EQ(harmony_user_prompt(t, "Hello"), expected);
  EXPECT_EQ(harmony_stop_tokens(t),
            (Ids{t.added("<|return|>"), t.added("<|call|>"), t.added("<|endoftext|>")}));
  EXPECT_NE(error_of([&] { harmony_user_prompt(tiny(), "x"); }).find("<|message|>"),
            std::string::npos);
}

// ---- the tiny model's tokenizer -----------------------------------------------------------------

std::vector<std::string> corpus_cases() {
  const std::string path = std::string(PARITY_SOURCE_DIR) + "/tests/data/tokenizer_corpus.txt";
  std::ifstream in(path);
  std::vector<std::string> cases;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') cases.push_back(json::parse(line).get<std::string>());
  std::string joined;
  for (size_t i = 0; i < cases.size(); ++i) joined += (i ? "\n" : "") + cases[i];
  cases.push_back(joined);
  return cases;
}

// BPE the slow, obvious way, from the file's own merges: the reference the heap version of
// tokenizer/tokenizer.cpp must agree with.
class NaiveBpe {
 public:
  explicit NaiveBpe(const json& j) {
    for (const auto& [text, id] : j["model"]["vocab"].items())
      id_of_[bytes_of(text)] = id.get<TokenId>();
    int rank = 0;
    for (const auto& m : j["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      rank_[{bytes_of(s.substr(0, space)), bytes_of(s.substr(space + 1))}] = rank++;
    }
  }
  Ids encode(const Tokenizer& splitter, const std::string& text) const {
    Ids out;
    for (const std::string& piece : splitter.pre_tokenize(text)) {
      if (const auto it = id_of_.find(piece); it != id_of_.end()) {  // ignore_merges
        out.push_back(it->second);
        continue;
      }
      std::vector<std::string> parts;
      for (const char c : piece) parts.emplace_back(1, c);
      for (;;) {
        int best = -1, best_rank = 0;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
          const auto it = rank_.find({parts[i], parts[i + 1]});
          if (it != rank_.end() && (best < 0 || it->second < best_rank)) {
            best = int(i);
            best_rank = it->second;
          }
        }
        if (best < 0) break;
        parts[size_t(best)] += parts[size_t(best) + 1];
        parts.erase(parts.begin() + best + 1);
      }
      for (const auto& p : parts) out.push_back(id_of_.at(p));
    }
    return out;
  }

 private:
  static std::string bytes_of(const std::string& byte_level) {
    // Inverse of byte_level_string, by search: the test's own, independent of the engine's table.
    static const std::map<std::string, char> inverse = [] {
      std::map<std::string, char> m;
      for (int b = 0; b < 256; ++b) m[byte_level_string(std::string(1, char(b)))] = char(b);
      return m;
    }();
    std::string out;
    for (size_t i = 0; i < byte_level.size();) {
      const size_t n = utf8_step(std::string_view(byte_level).substr(i)).length;
      out += inverse.at(byte_level.substr(i, n));
      i += n;
    }
    return out;
  }
  std::map<std::string, TokenId> id_of_;
  std::map<std::pair<std::string, std::string>, int> rank_;
};

TEST(TokenizerTiny, FillsTheVocabularyWithTheHarmonySpecialsOnTop) {
  const std::string text = tiny_tokenizer_json(1024);
  EXPECT_EQ(text, tiny_tokenizer_json(1024));  // deterministic
  const Tokenizer t = Tokenizer::parse(text, "tiny");
  EXPECT_EQ(t.id_end(), 1024);
  EXPECT_EQ(t.token_count(), 1024u);
  for (TokenId id = 0; id < 1024; ++id) EXPECT_TRUE(t.contains(id)) << id;
  EXPECT_EQ(t.added("<|startoftext|>"), 1003);
  EXPECT_EQ(t.added("<|endoftext|>"), 1004);
  EXPECT_EQ(t.added("<|return|>"), 1007);
  EXPECT_EQ(t.added("<|start|>"), 1011);
  EXPECT_EQ(t.added("<|end|>"), 1012);
  EXPECT_EQ(t.added("<|message|>"), 1013);
  EXPECT_EQ(t.added("<|call|>"), 1017);
  EXPECT_EQ(t.added("<|endofprompt|>"), 1023);
  EXPECT_EQ(t.merge_count(), size_t(1024 - 256 - kTinySpecialCount));
  RecordProperty("regex_jit", t.regex_jit() ? "yes" : "no");
  // It compresses the text it was made for.
  EXPECT_LT(t.encode("The assistant answers the user in the final channel.", false).size(), 20u);
  EXPECT_NE(error_of([] { tiny_tokenizer_json(kTinyMinVocab - 1); }).find("at least 278"),
            std::string::npos);
  EXPECT_EQ(Tokenizer::parse(tiny_tokenizer_json(kTinyMinVocab), "min").merge_count(), 1u);
  EXPECT_EQ(Tokenizer::parse(tiny_tokenizer_json(5000), "large").id_end(), 5000);
}

TEST(TokenizerTiny, HeapBpeEqualsNaiveBpeAndRoundTrips) {
  const std::string text = tiny_tokenizer_json(1024);
  const Tokenizer t = Tokenizer::parse(text, "tiny");
  const NaiveBpe naive(json::parse(text));
  std::vector<std::string> texts = corpus_cases();
  // Random texts from a small alphabet rich in merges, and multi-byte characters between.
  std::mt19937 rng(12345);
  const std::vector<std::string> alphabet = {"a",  "e",  "t", "h", "n", "s", " ", " ",  "th",
                                             "he", "in", "0", "1", "4", "2", "'", "\n", "\t",
                                             "é",  "日", "😀", "-", ".", "A", "T"};
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 40);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  for (const std::string& s : texts) {
    const Ids ids = t.encode(s, false);
    ASSERT_EQ(ids, naive.encode(t, s)) << quoted(s, 200);
    ASSERT_EQ(t.decode(ids), s) << quoted(s, 200);
  }
}

// ---- parity-synth writes the models' tokenizer.json
// ----------------------------------------------

TEST(TokenizerSynth, TinyPresetGetsItsOwnTokenizer) {
  const std::string out = test::temp_dir("synth-tokenizer") + "/tiny";
  auto r = test::run_tool("parity-synth", "--preset tiny --tokenizer-only --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(fs::directory_iterator(out)->path().filename(), "tokenizer.json");  // nothing else
  EXPECT_EQ(read_all_of(out + "/tokenizer.json"), tiny_tokenizer_json(1024));
  const Tokenizer t = Tokenizer::load(find_tokenizer_json(out));
  EXPECT_EQ(t.id_end(), 1024);
  // A directory with a checkpoint parity-synth did not write is left alone.
  const std::string foreign = test::temp_dir("synth-tokenizer-foreign");
  { std::ofstream(foreign + "/config.json") << R"({"model_type": "gpt_oss"})"; }
  r = test::run_tool("parity-synth", "--preset tiny --tokenizer-only --out " + foreign);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parity-synth did not write"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(foreign + "/tokenizer.json"));
}

TEST(TokenizerSynth, LargePresetsCopyTheO200kHarmonyFileOrSayHowToMakeIt) {
  const std::string dir = test::temp_dir("synth-tokenizer-20b");
  auto r = test::run_tool("parity-synth", "--preset 20b --tokenizer-only --tokenizer " + dir +
                                              "/absent.json --out " + dir + "/20b");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("scripts/tokenizer_oracle.sh"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/20b/tokenizer.json"));
  // Any valid harmony tokenizer.json is copied as it is (the tiny one stands in for o200k here;
  // the oracle test copies the real one).
  { std::ofstream(dir + "/harmony.json") << tiny_tokenizer_json(2048); }
  r = test::run_tool("parity-synth", "--preset 120b --tokenizer-only --tokenizer " + dir +
                                         "/harmony.json --out " + dir + "/120b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_all_of(dir + "/120b/tokenizer.json"), tiny_tokenizer_json(2048));
  // A file that is not a tokenizer is refused with its name.
  { std::ofstream(dir + "/bad.json") << "{\"model\": 1}"; }
  r = test::run_tool("parity-synth", "--preset 20b --tokenizer-only --tokenizer " + dir +
                                         "/bad.json --out " + dir + "/bad");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/bad.json: no \"model\" object"), std::string::npos) << r.output;
}

// ---- the oracle: js-tiktoken's o200k_base -------------------------------------------------------

// Where scripts/tokenizer_oracle.sh wrote its files: $PARITY_TOKENIZER_ORACLE_DIR, else the build
// directory's oracle/o200k_harmony.
std::string oracle_dir() {
  if (const char* env = std::getenv("PARITY_TOKENIZER_ORACLE_DIR"); env != nullptr && *env)
    return env;
  return std::string(PARITY_BUILD_DIR) + "/oracle/o200k_harmony";
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  return lines;
}

class TokenizerOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = oracle_dir();
    if (!fs::exists(dir_ + "/tokenizer.json")) return;
    const auto t0 = std::chrono::steady_clock::now();
    tokenizer_ = new Tokenizer(Tokenizer::load(dir_ + "/tokenizer.json"));
    load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ != nullptr) return;
    const char* no_npm = std::getenv("PARITY_NO_NPM");
    if (no_npm != nullptr && std::string(no_npm) == "1")
      GTEST_SKIP() << "PARITY_NO_NPM=1: the js-tiktoken oracle was not generated, so " << dir_
                   << " is absent";
    GTEST_SKIP() << "no tokenizer oracle at " << dir_
                 << " (scripts/tokenizer_oracle.sh writes it with node and npm; "
                    "PARITY_TOKENIZER_ORACLE_DIR points elsewhere)";
  }
  // The oracle's file, or a failure (not a skip: a partial oracle is a broken one).
  static std::vector<std::string> oracle_lines(const std::string& name) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(fs::exists(path)) << path << " is missing: rerun scripts/tokenizer_oracle.sh";
    return read_lines(path);
  }

  static inline std::string dir_;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline double load_seconds_ = 0;
};

// Mismatches between our ids and the oracle's, each reported with its text and the first
// differing position.
size_t compare(const Tokenizer& t, const std::vector<std::string>& texts,
               const std::vector<Ids>& expected, bool allow_special, const char* what) {
  size_t mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids got = t.encode(texts[i], allow_special);
    if (got == expected[i]) continue;
    ++mismatches;
    size_t at = 0;
    while (at < got.size() && at < expected[i].size() && got[at] == expected[i][at]) ++at;
    ADD_FAILURE() << what << " case " << i << " " << quoted(texts[i], 120) << ": token " << at
                  << " is " << (at < got.size() ? std::to_string(got[at]) : "(none)")
                  << ", js-tiktoken has "
                  << (at < expected[i].size() ? std::to_string(expected[i][at]) : "(none)") << " ("
                  << got.size() << " vs " << expected[i].size() << " tokens)";
  }
  return mismatches;
}

TEST_F(TokenizerOracle, LoadsTheO200kHarmonyLayout) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.id_end(), 201088);
  EXPECT_EQ(t.token_count(), 201088u);  // 199998 ranks, 1090 special tokens
  EXPECT_EQ(t.merge_count(), 199998u - 256u);
  const std::pair<const char*, TokenId> specials[] = {{"<|startoftext|>", 199998},
                                                      {"<|endoftext|>", 199999},
                                                      {"<|return|>", 200002},
                                                      {"<|constrain|>", 200003},
                                                      {"<|channel|>", 200005},
                                                      {"<|start|>", 200006},
                                                      {"<|end|>", 200007},
                                                      {"<|message|>", 200008},
                                                      {"<|call|>", 200012},
                                                      {"<|endofprompt|>", 200018},
                                                      {"<|reserved_200000|>", 200000},
                                                      {"<|reserved_201087|>", 201087}};
  for (const auto& [name, id] : specials) {
    EXPECT_EQ(t.find_added(name), std::optional<TokenId>(id)) << name;
    EXPECT_TRUE(t.is_special(id)) << name;
  }
  // The ids every o200k user knows.
  EXPECT_EQ(t.encode("Hello, world!", false), (Ids{13225, 11, 2375, 0}));
  EXPECT_EQ(harmony_stop_tokens(t), (Ids{200002, 200012, 199999}));
  EXPECT_EQ(harmony_user_prompt(t, "What is 2+2?"),
            t.encode("<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant", true));
  std::cout << fmt::format("tokenizer.json loaded in {:.2f} s; regex JIT: {}\n", load_seconds_,
                           t.regex_jit() ? "yes" : "no");
}

TEST_F(TokenizerOracle, SynthPresetCopiesIt) {
  const std::string out = test::temp_dir("synth-tokenizer-oracle") + "/20b";
  const auto r = test::run_tool("parity-synth", "--preset 20b --tokenizer-only --tokenizer " +
                                                    dir_ + "/tokenizer.json --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_all_of(out + "/tokenizer.json"), read_all_of(dir_ + "/tokenizer.json"));
}

TEST_F(TokenizerOracle, CorpusEncodesAsJsTiktokenDoes) {
  const std::vector<std::string> cases = corpus_cases();
  // The oracle's encodings are of this corpus, not an earlier one.
  const std::string source_corpus =
      read_all_of(std::string(PARITY_SOURCE_DIR) + "/tests/data/tokenizer_corpus.txt");
  ASSERT_EQ(read_all_of(dir_ + "/corpus.txt"), source_corpus)
      << dir_ << " was made from another corpus: rerun scripts/tokenizer_oracle.sh";
  std::vector<Ids> ordinary, special;
  for (const auto& l : oracle_lines("encode.jsonl")) ordinary.push_back(json::parse(l).get<Ids>());
  for (const auto& l : oracle_lines("encode_special.jsonl"))
    special.push_back(json::parse(l).get<Ids>());
  ASSERT_EQ(ordinary.size(), cases.size());
  ASSERT_EQ(special.size(), cases.size());

  const Tokenizer& t = *tokenizer_;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t mismatches = compare(t, cases, ordinary, false, "specials as text:") +
                            compare(t, cases, special, true, "specials allowed:");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(mismatches, 0u);

  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    bytes += cases[i].size();
    tokens += ordinary[i].size();
    EXPECT_EQ(t.decode(t.encode(cases[i], false)), cases[i]) << "case " << i;
    EXPECT_EQ(t.decode(t.encode(cases[i], true)), cases[i]) << "case " << i;
  }
  // The oracle's decode of its own ids gives the text back, and so does ours.
  const auto decoded = oracle_lines("decode.jsonl");
  ASSERT_EQ(decoded.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(json::parse(decoded[i]).get<std::string>(), cases[i]) << "case " << i;
    EXPECT_EQ(t.decode(ordinary[i]), cases[i]) << "case " << i;
  }
  // Streaming the largest case (all cases joined) gives it back whole.
  StreamingDecoder d(t);
  std::string streamed;
  for (const TokenId id : special.back()) streamed += d.push(id);
  streamed += d.finish();
  EXPECT_EQ(streamed, cases.back());
  std::cout << fmt::format(
      "oracle corpus: {} cases and all of them joined, {} bytes, {} tokens; {} mismatches "
      "against js-tiktoken; encoded twice in {:.1f} ms\n",
      cases.size() - 1, bytes, tokens, mismatches, seconds * 1e3);
  RecordProperty("corpus_cases", int(cases.size()));
  RecordProperty("mismatches", int(mismatches));
}

TEST_F(TokenizerOracle, RandomTextsEncodeAsJsTiktokenDoes) {
  std::vector<std::string> texts;
  std::vector<Ids> expected;
  for (const auto& l : oracle_lines("random.jsonl")) {
    const json j = json::parse(l);
    texts.push_back(j.at("text").get<std::string>());
    expected.push_back(j.at("ids").get<Ids>());
  }
  ASSERT_GE(texts.size(), 1000u);
  const size_t mismatches = compare(*tokenizer_, texts, expected, false, "random:");
  EXPECT_EQ(mismatches, 0u);
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tokenizer_->decode(expected[i]), texts[i]) << "random case " << i;
  std::cout << fmt::format("oracle random texts: {}, {} mismatches against js-tiktoken\n",
                           texts.size(), mismatches);
}

}  // namespace
}  // namespace parity
