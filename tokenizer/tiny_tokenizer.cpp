#include "tokenizer/tiny_tokenizer.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "model/error.h"

namespace parity {

const std::string_view kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using ordered_json = nlohmann::ordered_json;

// What the merges are learned from: the words a chat with a small model is made of, some code.
// Changing it changes the tiny tokenizer's bytes.
constexpr std::string_view kTrainingText = R"(
The user asks a question and the assistant answers it. The assistant thinks in the analysis
channel first, then writes the final answer in the final channel. When it needs a tool, it
writes a call in the commentary channel and waits for the result.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
Tell me a story about a small model that learned to count: one, two, three, four, five, six,
seven, eight, nine, ten. It was the best of times, it was the worst of times; it was the age of
wisdom, it was the age of foolishness. I think that you are right, and I'm sure they'll agree.
Hello, world! Hello again, friends. Thank you for reading this, and have a nice day.
numbers: 0 1 2 3 4 5 6 7 8 9 10 20 42 100 128 256 512 1024 2048 4096 2024 2025 3.14 1e-5
def forward(x, weight, bias):
    return x @ weight.T + bias
for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }
if (error != nullptr) { return -1; } else { return 0; }
{"role": "user", "content": "hello"} {"role": "assistant", "content": "hi there"}
system developer user assistant tool analysis commentary final json functions
)";

// Once the text has no pair left: pairs of digits, a space and a letter, two letters, then any
// two tokens (a large custom vocabulary).
std::vector<std::pair<std::string, std::string>> fixed_pairs() {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (char a = '0'; a <= '9'; ++a)
    for (char b = '0'; b <= '9'; ++b) pairs.emplace_back(std::string(1, a), std::string(1, b));
  for (char c = 'a'; c <= 'z'; ++c) pairs.emplace_back(" ", std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) pairs.emplace_back(" ", std::string(1, c));
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pairs.emplace_back(std::string(1, a), std::string(1, b));
  return pairs;
}

// The bootstrap tokenizer: bytes only, the o200k pre-tokenizer. It splits the training text.
ordered_json skeleton(const std::vector<std::string>& tokens,
                      const std::vector<std::pair<std::string, std::string>>& merges,
                      const ordered_json& added) {
  ordered_json vocab = ordered_json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[byte_level_string(tokens[i])] = i;
  ordered_json merge_list = ordered_json::array();
  for (const auto& [a, b] : merges)
    merge_list.push_back(byte_level_string(a) + " " + byte_level_string(b));
  ordered_json pre = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"},
                         {"pattern", {{"Regex", kO200kPattern}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", true},
                         {"use_regex", false}}}}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", true},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

}  // namespace

std::string tiny_tokenizer_json(int vocab_size) {
  if (vocab_size < kTinyMinVocab)
    fail(
        "the tiny tokenizer needs a vocabulary of at least {} ids (256 bytes, a merge, {} special "
        "tokens); this model has {}",
        kTinyMinVocab, kTinySpecialCount, vocab_size);
  const size_t wanted = size_t(vocab_size - kTinySpecialCount);  // bytes and merged tokens

  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
  std::set<std::string> known(tokens.begin(), tokens.end());
  std::vector<std::pair<std::string, std::string>> merges;

  // Learned: count the adjacent pairs over the training text's pieces (each piece weighted by
  // how often it occurs), merge the most frequent one everywhere (the smallest pair in byte order
  // on a tie), repeat.
  const Tokenizer splitter =
      Tokenizer::parse(skeleton(tokens, {}, ordered_json::array()).dump(), "tiny tokenizer");
  std::map<std::string, int> piece_count;
  for (const auto& piece : splitter.pre_tokenize(kTrainingText)) ++piece_count[piece];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [piece, count] : piece_count) {
    std::vector<std::string> symbols;
    for (const char c : piece) symbols.emplace_back(1, c);
    words.emplace_back(std::move(symbols), count);
  }
  while (tokens.size() < wanted) {
    std::map<std::pair<std::string, std::string>, int> pair_count;
    for (const auto& [symbols, count] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i)
        pair_count[{symbols[i], symbols[i + 1]}] += count;
    if (pair_count.empty()) break;
    auto best = pair_count.begin();
    for (auto it = pair_count.begin(); it != pair_count.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [a, b] = best->first;
    for (auto& [symbols, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
    merges.emplace_back(a, b);
    if (known.insert(a + b).second) tokens.push_back(a + b);
  }
  // Fixed pairs, then any two tokens, until the vocabulary is full.
  const auto add = [&](const std::string& a, const std::string& b) {
    if (tokens.size() >= wanted || !known.insert(a + b).second) return;
    merges.emplace_back(a, b);
    tokens.push_back(a + b);
  };
  for (const auto& [a, b] : fixed_pairs()) add(a, b);
  for (size_t i = 0; tokens.size() < wanted; ++i)
    for (size_t j = 0; j <= i && tokens.size() < wanted; ++j) {
      add(tokens[i], tokens[j]);
      if (i != j) add(tokens[j], tokens[i]);
    }

  static constexpr std::string_view kNames[kTinySpecialCount] = {"<|startoftext|>",
                                                                 "<|endoftext|>",
                                                                 "<|reserved_200000|>",
                                                                 "<|reserved_200001|>",
                                                                 "<|return|>",
                                                                 "<|constrain|>",
                                                                 "<|reserved_200004|>",
                                                                 "<|channel|>",
                                                                 "<|start|>",
                                                                 "<|end|>",
                                                                 "<|message|>",
                                                                 "<|reserved_200009|>",
                                                                 "<|reserved_200010|>",
                                                                 "<|reserved_200011|>",
                                                                 "<|call|>",
                                                                 "<|reserved_200013|>",
                                                                 "<|reserved_200014|>",
                                                                 "<|reserved_200015|>",
                                                                 "<|reserved_200016|>",
                                                                 "<|reserved_200017|>",
                                                                 "<|endofprompt|>"};
  ordered_json added = ordered_json::array();
  for (int i = 0; i < kTinySpecialCount; ++i)
    added.push_back({{"id", int(wanted) + i},
                     {"content", kNames[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  return skeleton(tokens, merges, added).dump(1) + "\n";
}

}  // namespace parity
