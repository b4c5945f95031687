// The tokenizer of the tiny synthetic model (parity-synth --preset tiny): a byte-level BPE in the
// o200k_harmony layout, small enough for a vocabulary of a thousand rows. Ids 0..255 are the
// bytes, then merges learned deterministically from a fixed English-and-code text (with the o200k
// pre-tokenizer; fixed pairs of digits and letters once the text has nothing left to merge), and
// the top 21 ids are the harmony special tokens of 199998..200018 in the same order
// (<|start|> at vocab_size - 13, <|end|> at vocab_size - 12, <|return|> at vocab_size - 17, ...).
// Every id below vocab_size is a token, so any sampled id decodes.
#pragma once
#include <string>
#include <string_view>

namespace parity {

// The o200k pre-tokenizer pattern (tiktoken, openai/harmony; the hub's tokenizer.json).
extern const std::string_view kO200kPattern;

// Harmony special tokens of the tiny layout: 199998..200018 of o200k_harmony.
inline constexpr int kTinySpecialCount = 21;
// The smallest vocabulary the tiny layout fills: the bytes, one merge, the specials.
inline constexpr int kTinyMinVocab = 256 + 1 + kTinySpecialCount;

// tokenizer.json text of the tiny layout for `vocab_size` ids (an Error below kTinyMinVocab).
// The same bytes for the same vocab_size on every machine.
std::string tiny_tokenizer_json(int vocab_size);

}  // namespace parity
