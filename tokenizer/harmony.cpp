#include "tokenizer/harmony.h"

#include <string>

namespace parity {

std::vector<TokenId> harmony_user_prompt(const Tokenizer& tokenizer, std::string_view prompt) {
  const TokenId start = tokenizer.added("<|start|>"), message = tokenizer.added("<|message|>"),
                end = tokenizer.added("<|end|>");
  std::vector<TokenId> ids{start};
  const auto append = [&](std::string_view text) {
    const std::vector<TokenId> part = tokenizer.encode(text, /*allow_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  append("user");
  ids.push_back(message);
  append(prompt);
  ids.push_back(end);
  ids.push_back(start);
  append("assistant");
  return ids;
}

std::vector<TokenId> harmony_stop_tokens(const Tokenizer& tokenizer) {
  std::vector<TokenId> stops{tokenizer.added("<|return|>"), tokenizer.added("<|call|>")};
  if (const auto eot = tokenizer.find_added("<|endoftext|>")) stops.push_back(*eot);
  return stops;
}

}  // namespace parity
