// The harmony chat format of gpt-oss (openai/harmony, docs/format.md) on top of the tokenizer:
// a message is `<|start|>{role}<|message|>{content}<|end|>`, and a prompt for the model ends with
// `<|start|>assistant`, after which the model writes its own header (a channel: analysis for its
// reasoning, final for the answer), messages and the token that ends its turn.
#pragma once
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace parity {

// `<|start|>user<|message|>PROMPT<|end|><|start|>assistant`. The prompt is encoded as ordinary
// text: a "<|end|>" typed in it stays text and cannot close the message early. An Error naming
// the file when the tokenizer lacks a harmony token.
std::vector<TokenId> harmony_user_prompt(const Tokenizer& tokenizer, std::string_view prompt);

// The tokens that end generation, those of `tokenizer` among:
//   <|return|> 200002  the final answer is done (harmony's stop set for assistant actions)
//   <|call|>   200012  the model calls a tool and waits for its output (the same set)
//   <|endoftext|> 199999  in the hub's generation_config.json eos list beside the two above
// Not <|end|> 200007: it closes a message, not the turn. The model's first message is usually
// its analysis channel; stopping at its <|end|> would return the reasoning without the answer
// (harmony's general stop_tokens() has <|end|> for parsing finished messages, not for sampling).
// <|return|> and <|call|> are required (an Error when missing); <|endoftext|> is added when there.
std::vector<TokenId> harmony_stop_tokens(const Tokenizer& tokenizer);

}  // namespace parity
