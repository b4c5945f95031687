#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "model/error.h"
#include "model/untrusted.h"

namespace parity {
namespace {

using nlohmann::json;

// ---- GPT-2's byte-to-unicode mapping ---------------------------------------------------------
// Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, 0x7F-0xA0, 0xAD)
// for U+0100.. in byte order, so every byte is a visible character in vocab and merges.
struct ByteLevelTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};  // code point -> byte, -1 where none
  ByteLevelTables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[size_t(b)] = printable ? char32_t(b) : next++;
      to_byte[size_t(to_char[size_t(b)])] = int16_t(b);
    }
  }
};
const ByteLevelTables& byte_level() {
  static const ByteLevelTables tables;
  return tables;
}

// A byte-level string of tokenizer.json back to its bytes; nullopt when a character is not one
// of the 256 the mapping uses.
std::optional<std::string> byte_level_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto& t = byte_level();
  while (!s.empty()) {
    const Utf8Step step = utf8_step(s);
    if (step.status != Utf8Status::ok || step.code_point >= t.to_byte.size() ||
        t.to_byte[step.code_point] < 0)
      return std::nullopt;
    out += char(t.to_byte[step.code_point]);
    s.remove_prefix(step.length);
  }
  return out;
}

// GPT-2's pattern, what a ByteLevel pre-tokenizer with use_regex applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- tokenizer.json field access --------------------------------------------------------------
const json* member(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool flag(const json& obj, const char* key, bool fallback, const std::string& where) {
  const json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean())
    fail("{}: \"{}\" must be true or false, not {}", where, key, json_excerpt(*v));
  return v->get<bool>();
}

std::string string_field(const json& obj, const char* key, const std::string& where) {
  const json* v = member(obj, key);
  if (v == nullptr || !v->is_string())
    fail("{}: \"{}\" must be a string{}", where, key,
         v == nullptr ? " (it is missing)" : ", not " + json_excerpt(*v));
  return v->get<std::string>();
}

// `where()` names the entry in an error; it is called only then (a vocab has 200k entries).
template <typename Where>
TokenId id_field(const json& v, Where&& where) {
  if (!v.is_number_integer())
    fail("{}: the id must be an integer, not {}", where(), json_excerpt(v));
  const bool in_range = v.is_number_unsigned()
                            ? v.get<uint64_t>() < uint64_t(kMaxTokenId)
                            : v.get<int64_t>() >= 0 && v.get<int64_t>() < int64_t(kMaxTokenId);
  if (!in_range) fail("{}: id {} is out of range (0..{})", where(), v.dump(), kMaxTokenId - 1);
  return v.get<TokenId>();
}

enum class Kind : uint8_t { none, vocab, special, added };

// Added tokens by their text, for the leftmost-longest scan of the input.
struct Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    TokenId id = -1;
    bool special = false;
  };
  std::vector<Node> nodes{Node{}};
  std::array<bool, 256> first_byte{};

  void insert(std::string_view s, TokenId id, bool special) {
    int32_t n = 0;
    for (const char ch : s) {
      const uint8_t b = uint8_t(ch);
      int32_t child = -1;
      for (const auto& [key, index] : nodes[size_t(n)].next)
        if (key == b) child = index;
      if (child < 0) {
        child = int32_t(nodes.size());
        nodes[size_t(n)].next.emplace_back(b, child);
        nodes.emplace_back();
      }
      n = child;
    }
    nodes[size_t(n)].id = id;
    nodes[size_t(n)].special = special;
    first_byte[uint8_t(s[0])] = true;
  }

  struct Match {
    size_t start = 0, length = 0;
    TokenId id = -1;
  };
  // The first added token in text[from..] that is allowed (special ones only with
  // allow_special), the longest where several start at the same byte.
  std::optional<Match> find(std::string_view text, size_t from, bool allow_special) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_byte[uint8_t(text[i])]) continue;
      int32_t n = 0;
      std::optional<Match> best;
      for (size_t j = i; j < text.size(); ++j) {
        int32_t child = -1;
        for (const auto& [key, index] : nodes[size_t(n)].next)
          if (key == uint8_t(text[j])) child = index;
        if (child < 0) break;
        n = child;
        const Node& node = nodes[size_t(n)];
        if (node.id >= 0 && (allow_special || !node.special)) best = Match{i, j + 1 - i, node.id};
      }
      if (best) return best;
    }
    return std::nullopt;
  }
};

constexpr size_t kMaxCachedPieces = size_t(1) << 16;
constexpr size_t kMaxCachedPieceBytes = 256;

// The id tables are dense (an entry per id up to the largest): a tokenizer's ids are, and a
// file that gave a few tokens ids in the millions would make a few bytes of JSON allocate
// hundreds of MB. The largest id may be at most twice the tokens plus this many.
constexpr int64_t kIdSlack = 4096;
void check_dense(const std::string& source, const char* what, TokenId max_id, size_t tokens) {
  const int64_t limit = 2 * int64_t(tokens) + kIdSlack;
  if (int64_t(max_id) >= limit)
    fail(
        "{}: {} reaches id {} with {} tokens: a tokenizer's ids are dense (below 2 n + {} for "
        "n tokens)",
        source, what, max_id, tokens, kIdSlack);
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> bytes_of;  // id -> bytes (empty where Kind::none)
  std::vector<Kind> kind;
  std::unordered_map<std::string_view, TokenId> vocab_id;  // ordinary tokens, keys in bytes_of
  std::array<TokenId, 256> byte_token{};
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left << 32 | right) -> rank, merged token
  bool ignore_merges = false;
  Trie added;
  std::optional<PreTokenizer> pre_tokenizer;
  size_t tokens = 0;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache;

  static uint64_t pair_key(TokenId a, TokenId b) {
    return uint64_t(uint32_t(a)) << 32 | uint32_t(b);
  }

  void load(const json& j);
  void load_vocab(const json& model);
  void load_added(const json& j);
  void index_vocab();
  void load_merges(const json& model);
  void load_pre_tokenizer(const json& j);

  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  void encode_segment(std::string_view segment, std::vector<TokenId>& out) const;
};

// ---- loading ----------------------------------------------------------------------------------

void Tokenizer::Impl::load(const json& j) {
  if (!j.is_object()) fail("{}: not a tokenizer.json (the top level is not a JSON object)", source);
  const json* model = member(j, "model");
  if (model == nullptr || !model->is_object())
    fail("{}: no \"model\" object: not a Hugging Face tokenizers file", source);
  const std::string where = source + ": model";
  if (const json* type = member(*model, "type"); type != nullptr && *type != "BPE")
    fail("{}: type {} is not supported (only byte-level BPE, as gpt-oss has)", where,
         json_excerpt(*type));
  if (flag(*model, "byte_fallback", false, where))
    fail("{}: byte_fallback is not supported (a byte-level BPE has every byte as a token)", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = member(*model, key); v != nullptr && *v != "")
      fail("{}: {} {} is not supported", where, key, json_excerpt(*v));
  if (const json* v = member(*model, "dropout"); v != nullptr && !(v->is_number() && *v == 0))
    fail("{}: dropout {} is not supported (it makes encoding random)", where, json_excerpt(*v));
  ignore_merges = flag(*model, "ignore_merges", false, where);
  if (const json* n = member(j, "normalizer"))
    fail("{}: normalizer {} is not supported (o200k has none)", source, json_excerpt(*n));
  if (const json* d = member(j, "decoder");
      d != nullptr && !(d->is_object() && member(*d, "type") && *member(*d, "type") == "ByteLevel"))
    fail("{}: decoder {} is not supported (only ByteLevel)", source, json_excerpt(*d));

  load_vocab(*model);
  load_added(j);
  index_vocab();
  load_merges(*model);
  load_pre_tokenizer(j);
}

void Tokenizer::Impl::load_vocab(const json& model) {
  const json* vocab = member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty())
    fail("{}: model.vocab must be a non-empty object of token -> id", source);
  std::vector<std::pair<TokenId, std::string>> entries;
  entries.reserve(vocab->size());
  TokenId max_id = -1;
  for (const auto& item : vocab->items()) {
    // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& text = item.key();
    const json& value = item.value();
    const auto where = [&] { return fmt::format("{}: model.vocab[{}]", source, quoted(text, 60)); };
    const TokenId id = id_field(value, where);
    auto bytes = byte_level_bytes(text);
    if (!bytes)
      fail("{}: not a byte-level string (a character outside GPT-2's byte-to-unicode mapping)",
           where());
    if (bytes->empty()) fail("{}: an empty token", where());
    entries.emplace_back(id, std::move(*bytes));
    max_id = std::max(max_id, id);
  }
  check_dense(source, "model.vocab", max_id, entries.size());
  bytes_of.assign(size_t(max_id) + 1, std::string());
  kind.assign(size_t(max_id) + 1, Kind::none);
  for (auto& [id, bytes] : entries) {
    if (kind[size_t(id)] != Kind::none)
      fail("{}: model.vocab gives id {} to two tokens, {} and {}", source, id,
           quoted(byte_level_string(bytes_of[size_t(id)]), 40),
           quoted(byte_level_string(bytes), 40));
    bytes_of[size_t(id)] = std::move(bytes);
    kind[size_t(id)] = Kind::vocab;
  }
  tokens = entries.size();
}

void Tokenizer::Impl::load_added(const json& j) {
  const json* added_tokens = member(j, "added_tokens");
  if (added_tokens != nullptr && !added_tokens->is_array())
    fail("{}: added_tokens must be an array", source);
  std::vector<std::tuple<TokenId, std::string, bool>> list;
  if (added_tokens != nullptr) {
    for (size_t i = 0; i < added_tokens->size(); ++i) {
      const json& t = (*added_tokens)[i];
      const std::string where = fmt::format("{}: added_tokens[{}]", source, i);
      if (!t.is_object()) fail("{}: must be an object", where);
      const json* id_value = member(t, "id");
      if (id_value == nullptr) fail("{}: no \"id\"", where);
      const TokenId id = id_field(*id_value, [&] { return where; });
      std::string content = string_field(t, "content", where);
      if (content.empty()) fail("{}: empty content", where);
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (flag(t, key, false, where))
          fail("{} ({}): {} is not supported", where, quoted(content, 40), key);
      list.emplace_back(id, std::move(content), flag(t, "special", false, where));
    }
  }
  TokenId max_id = TokenId(bytes_of.size()) - 1;
  for (const auto& [id, content, special] : list) max_id = std::max(max_id, id);
  check_dense(source, "added_tokens", max_id, tokens + list.size());
  bytes_of.resize(size_t(max_id) + 1);
  kind.resize(size_t(max_id) + 1, Kind::none);

  std::unordered_map<std::string, TokenId> by_content;
  for (const auto& [id, content, special] : list) {
    const std::string where =
        fmt::format("{}: added token {} (id {})", source, quoted(content, 40), id);
    if (const auto [it, fresh] = by_content.emplace(content, id); !fresh)
      fail("{}: the same text as added token id {}", where, it->second);
    const size_t i = size_t(id);
    if (kind[i] == Kind::special || kind[i] == Kind::added)
      fail("{}: id {} is given to two added tokens, {} and this one", where, id,
           quoted(bytes_of[i], 40));
    // An added token may repeat its vocab entry (same id, same bytes); another token's id is a
    // conflict.
    if (kind[i] == Kind::vocab && bytes_of[i] != content)
      fail("{}: id {} is already the vocab token {}", where, id,
           quoted(byte_level_string(bytes_of[i]), 40));
    if (kind[i] == Kind::none) ++tokens;
    bytes_of[i] = content;
    kind[i] = special ? Kind::special : Kind::added;
    added.insert(content, id, special);
  }
}

// After load_added: bytes_of is final, so the lookup's keys can point into it.
void Tokenizer::Impl::index_vocab() {
  vocab_id.reserve(tokens);
  for (size_t i = 0; i < bytes_of.size(); ++i)
    if (kind[i] == Kind::vocab) vocab_id.emplace(bytes_of[i], TokenId(i));
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_id.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it == vocab_id.end())
      fail(
          "{}: model.vocab has no token for the byte 0x{:02x} ({}): a byte-level BPE needs all "
          "256",
          source, b, quoted(byte_level_string(std::string(1, char(b)))));
    byte_token[size_t(b)] = it->second;
  }
}

void Tokenizer::Impl::load_merges(const json& model) {
  // Required, as in Hugging Face's files: without it the vocabulary's longer tokens would never
  // be made (a vocabulary of bytes alone has an empty list).
  const auto it = model.find("merges");
  if (it == model.end() || !it->is_array())
    fail("{}: model.merges must be an array of merges{}", source,
         it == model.end() ? " (it is missing)" : ", not " + json_excerpt(*it));
  const json* list = &*it;
  merges.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const auto where = [&] { return fmt::format("{}: model.merges[{}]", source, i); };
    std::string left, right;
    if (m.is_string()) {  // "a b" (the older form)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail("{}: {} is not two tokens separated by one space", where(), quoted(s, 60));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("{}: {} is neither \"a b\" nor [\"a\", \"b\"]", where(), json_excerpt(m));
    }
    const auto lookup = [&](const std::string& text) {
      const auto bytes = byte_level_bytes(text);
      const auto it = bytes ? vocab_id.find(*bytes) : vocab_id.end();
      if (it == vocab_id.end())
        fail("{}: {} is not a token of model.vocab", where(), quoted(text, 60));
      return it->second;
    };
    const TokenId a = lookup(left), b = lookup(right);
    const std::string joined = bytes_of[size_t(a)] + bytes_of[size_t(b)];
    const auto result = vocab_id.find(joined);
    if (result == vocab_id.end())
      fail("{}: {} + {} makes {}, which is not a token of model.vocab", where(), quoted(left, 40),
           quoted(right, 40), quoted(byte_level_string(joined), 60));
    if (const auto [it, fresh] = merges.emplace(pair_key(a, b), Merge{int32_t(i), result->second});
        !fresh)
      fail("{}: repeats model.merges[{}] ({} {})", where(), it->second.rank, quoted(left, 40),
           quoted(right, 40));
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& j) {
  const std::string where = source + ": pre_tokenizer";
  const json* pre = member(j, "pre_tokenizer");
  if (pre == nullptr)
    fail("{}: missing (a byte-level BPE needs the Split regex and ByteLevel)", where);
  std::vector<const json*> steps;
  if (const json* type = pre->is_object() ? member(*pre, "type") : nullptr;
      type != nullptr && *type == "Sequence") {
    const json* list = member(*pre, "pretokenizers");
    if (list == nullptr || !list->is_array())
      fail("{}: a Sequence without \"pretokenizers\"", where);
    for (const json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(pre);
  }
  std::optional<std::string> pattern;
  bool literal = false;
  bool byte_level_seen = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!s.is_object() || member(s, "type") == nullptr || !s["type"].is_string())
      fail("{}: {} is not a pre-tokenizer object", at, json_excerpt(s));
    const std::string type = s["type"].get<std::string>();
    if (type == "Split") {
      if (pattern) fail("{}: a second Split (only one regex is supported)", at);
      const json* p = member(s, "pattern");
      if (p != nullptr && p->is_object() && member(*p, "Regex") != nullptr) {
        pattern = string_field(*p, "Regex", at + ".pattern");
      } else if (p != nullptr && p->is_object() && member(*p, "String") != nullptr) {
        pattern = string_field(*p, "String", at + ".pattern");
        literal = true;
      } else {
        fail("{}: \"pattern\" must be {{\"Regex\": ...}} or {{\"String\": ...}}", at);
      }
      const json* b = member(s, "behavior");
      const std::string behavior = b ? b->dump() : "missing";
      if (behavior != "\"Isolated\"")
        fail("{}: behavior {} is not supported (only \"Isolated\": each match is a piece)", at,
             behavior);
      if (flag(s, "invert", false, at)) fail("{}: invert is not supported", at);
    } else if (type == "ByteLevel") {
      if (flag(s, "add_prefix_space", false, at))
        fail("{}: add_prefix_space is not supported (o200k adds no space)", at);
      if (flag(s, "use_regex", true, at)) {
        if (pattern) fail("{}: use_regex after a Split would split twice", at);
        pattern = std::string(kGpt2Pattern);
      }
      byte_level_seen = true;
    } else {
      fail("{}: type {} is not supported (Split and ByteLevel are)", at, quoted(type, 40));
    }
  }
  if (!byte_level_seen)
    fail("{}: no ByteLevel step (this reader handles byte-level BPE only)", where);
  if (!pattern) fail("{}: no regex (a Split, or ByteLevel with use_regex)", where);

  pre_tokenizer.emplace(*pattern, literal, where);
}

// ---- encoding ---------------------------------------------------------------------------------

// Byte-pair merging of one piece: start from its bytes' tokens and merge, again and again, the
// adjacent pair of lowest merge rank (leftmost on a tie) until no adjacent pair is a merge. A heap
// of candidate pairs with lazy deletion over a linked list of symbols: O(n log n).
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  if (ignore_merges || piece.size() == 1) {
    if (const auto it = vocab_id.find(piece); it != vocab_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (const auto it = cache.find(std::string(piece)); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }

  struct Symbol {
    TokenId id;
    int32_t prev, next;
  };
  const int32_t n = int32_t(piece.size());
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[size_t(i)] = {byte_token[uint8_t(piece[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};

  struct Candidate {
    int32_t rank, left, right;
    TokenId left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[size_t(left)].next;
    if (right < 0) return;
    const TokenId a = sym[size_t(left)].id, b = sym[size_t(right)].id;
    const auto it = merges.find(pair_key(a, b));
    if (it != merges.end()) heap.push({it->second.rank, left, right, a, b, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[size_t(c.left)];
    // Stale when either side has been merged since: a symbol's span only grows, so its id never
    // comes back to an earlier one.
    if (l.id != c.left_id || l.next != c.right || sym[size_t(c.right)].id != c.right_id) continue;
    l.id = c.result;
    l.next = sym[size_t(c.right)].next;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.left;
    sym[size_t(c.right)].id = -1;
    consider(l.prev);
    consider(c.left);
  }
  const size_t first = out.size();
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);

  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kMaxCachedPieces) cache.clear();
    cache.emplace(std::string(piece), std::vector<TokenId>(out.begin() + long(first), out.end()));
  }
}

void Tokenizer::Impl::encode_segment(std::string_view segment, std::vector<TokenId>& out) const {
  for (const std::string_view piece : pre_tokenizer->split(segment)) bpe(piece, out);
}

// ---- Tokenizer --------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  return parse(read_small_file(path, kMaxTokenizerJsonBytes, "tokenizer.json"), path);
}

Tokenizer Tokenizer::parse(std::string_view json_text, const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  impl->load(parse_json(json_text, source));
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  if (const size_t bad = utf8_invalid_offset(text); bad != std::string_view::npos)
    fail("text to encode: invalid UTF-8 at byte {} of {} ({})", bad, text.size(),
         quoted(text.substr(bad, 4), 20));
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    const auto match = impl_->added.find(text, pos, allow_special);
    const size_t end = match ? match->start : text.size();
    if (end > pos) impl_->encode_segment(text.substr(pos, end - pos), out);
    if (!match) break;
    out.push_back(match->id);
    pos = match->start + match->length;
  }
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  if (const size_t bad = utf8_invalid_offset(text); bad != std::string_view::npos)
    fail("text to split: invalid UTF-8 at byte {} of {}", bad, text.size());
  const std::vector<std::string_view> pieces = impl_->pre_tokenizer->split(text);
  return {pieces.begin(), pieces.end()};
}

bool Tokenizer::contains(TokenId id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[size_t(id)] != Kind::none;
}

bool Tokenizer::is_special(TokenId id) const {
  return contains(id) && impl_->kind[size_t(id)] == Kind::special;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (!contains(id))
    fail("{}: token id {} is not in the vocabulary (ids 0..{}{})", impl_->source, id, id_end() - 1,
         id >= 0 && id < id_end() ? ", this one unused" : "");
  return impl_->bytes_of[size_t(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!contains(ids[i]))
      fail("{}: cannot decode token id {} (index {} of {}): not in the vocabulary (ids 0..{})",
           impl_->source, ids[i], i, ids.size(), id_end() - 1);
    out += impl_->bytes_of[size_t(ids[i])];
  }
  return out;
}

std::optional<TokenId> Tokenizer::find_added(std::string_view content) const {
  if (content.empty()) return std::nullopt;
  const auto m = impl_->added.find(content, 0, true);
  if (!m || m->start != 0 || m->length != content.size()) return std::nullopt;
  return m->id;
}

TokenId Tokenizer::added(std::string_view content) const {
  const auto id = find_added(content);
  if (!id) fail("{}: has no added token {}", impl_->source, quoted(content, 60));
  return *id;
}

TokenId Tokenizer::id_end() const {
  return TokenId(impl_->kind.size());
}
size_t Tokenizer::token_count() const {
  return impl_->tokens;
}
size_t Tokenizer::merge_count() const {
  return impl_->merges.size();
}
bool Tokenizer::regex_jit() const {
  return impl_->pre_tokenizer->jit();
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}

// ---- streaming decoder ------------------------------------------------------------------------

std::string StreamingDecoder::push(TokenId id) {
  pending_ += tokenizer_.token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Step step = utf8_step(std::string_view(pending_).substr(i));
    if (step.status == Utf8Status::incomplete) break;  // wait for the rest of the character
    if (step.status == Utf8Status::ok)
      out.append(pending_, i, step.length);
    else
      append_utf8(out, 0xFFFD);
    i += step.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

// ---- files ------------------------------------------------------------------------------------

std::string find_tokenizer_json(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("{}: {} (expected a model directory or a tokenizer.json)", path,
         errno == ENOENT ? "no such file or directory" : std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return path;  // a file: Tokenizer::load checks what it is
  const std::string file = path + "/tokenizer.json";
  // lstat: a dangling link is there, and Tokenizer::load names it as one.
  if (::lstat(file.c_str(), &st) != 0)
    fail(
        "{}: no tokenizer.json in this directory (a Hugging Face model directory has it beside "
        "config.json; for a synthetic model: scripts/tokenizer_oracle.sh, then parity-synth "
        "--preset 20b --tokenizer-only --out {})",
        path, path);
  return file;
}

std::string byte_level_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(out, byte_level().to_char[uint8_t(c)]);
  return out;
}

}  // namespace parity
