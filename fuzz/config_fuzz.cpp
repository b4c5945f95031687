// Fuzzes config.json reading (model/config.h): the input is the file's bytes, read as the
// loader reads them (parse_json: bounded nesting, numbers in range), then Config::from_json
// (which validates) and the RoPE tables.
//
// Beyond "no crash, no hang, no unbounded allocation": a refusal is one parity::Error line; an
// accepted config has every dimension within ConfigLimits and its derived sizes consistent in
// 64 bits; its RoPE table is finite and positive with a concentration >= 1; and to_json()
// reads back (it is what traces record) to a config with the same tables. A broken invariant
// traps, which libFuzzer saves as a crash input; any exception but a refusal of the input
// escapes and aborts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "model/config.h"
#include "model/error.h"
#include "model/untrusted.h"

namespace {

using parity::fuzz::check_message;

using parity::Config;
using parity::ConfigLimits;
using parity::Rope;

bool within(int v, int max) { return v >= 1 && v <= max; }

void check_config(const Config& c) {
  FUZZ_REQUIRE(within(c.vocab_size, ConfigLimits::kMaxVocab));
  FUZZ_REQUIRE(within(c.hidden_size, ConfigLimits::kMaxHidden));
  FUZZ_REQUIRE(within(c.num_hidden_layers, ConfigLimits::kMaxLayers));
  FUZZ_REQUIRE(within(c.num_attention_heads, ConfigLimits::kMaxHeads));
  FUZZ_REQUIRE(within(c.num_key_value_heads, c.num_attention_heads));
  FUZZ_REQUIRE(within(c.head_dim, ConfigLimits::kMaxHeadDim) && c.head_dim % 2 == 0);
  FUZZ_REQUIRE(within(c.intermediate_size, ConfigLimits::kMaxIntermediate));
  FUZZ_REQUIRE(within(c.num_local_experts, ConfigLimits::kMaxExperts));
  FUZZ_REQUIRE(within(c.num_experts_per_tok, c.num_local_experts));
  FUZZ_REQUIRE(within(c.max_position_embeddings, ConfigLimits::kMaxContext));
  FUZZ_REQUIRE(within(c.sliding_window, c.max_position_embeddings));
  FUZZ_REQUIRE(c.layer_is_sliding.size() == size_t(c.num_hidden_layers));
  // The int accessors agree with the products in 64 bits: nothing wrapped.
  const int64_t q = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kv = int64_t(c.num_key_value_heads) * c.head_dim;
  FUZZ_REQUIRE(c.q_dim() == q && c.kv_dim() == kv && c.qkv_dim() == q + 2 * kv);
  FUZZ_REQUIRE(c.heads_per_kv() * c.num_key_value_heads == c.num_attention_heads);
  for (int l = 0; l < c.num_hidden_layers; ++l) (void)c.sliding(l);
  FUZZ_REQUIRE(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0);
  FUZZ_REQUIRE(std::isfinite(c.swiglu_limit) && c.swiglu_limit > 0);
  FUZZ_REQUIRE(std::isfinite(c.rope_theta) && c.rope_theta > 1);
}

Rope check_rope(const Config& c) {
  const Rope r = Rope::from_config(c);  // a validated config must not be refused here
  FUZZ_REQUIRE(r.inv_freq.size() == size_t(c.head_dim / 2));
  for (double f : r.inv_freq) FUZZ_REQUIRE(std::isfinite(f) && f > 0 && f <= 1);
  FUZZ_REQUIRE(std::isfinite(r.concentration) && r.concentration >= 1);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz/config.json";
  Config c;
  try {
    c = Config::from_json(parity::parse_json(text, source), source);
  } catch (const parity::Error& e) {
    check_message(e);
    return 0;
  }
  check_config(c);
  const Rope r = check_rope(c);

  // What a trace records must read back to the same model.
  const Config again = Config::from_json(c.to_json(), "round trip");
  check_config(again);
  const Rope r2 = check_rope(again);
  FUZZ_REQUIRE(r2.inv_freq == r.inv_freq && r2.concentration == r.concentration);
  FUZZ_REQUIRE(again.layer_is_sliding == c.layer_is_sliding);
  return 0;
}
