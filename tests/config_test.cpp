// config.json parsing (model/config.h): the hub form (rope_scaling + top-level rope_theta) and the
// transformers 5 form (rope_parameters) of a gpt-oss-20b config read to the same values, every
// field of the spec is read, and each malformed config is refused with one line naming the file
// and the problem.
#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "model/error.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The hub config.json of openai/gpt-oss-20b (spec section 1), in hub form.
json hub_20b() {
  json lt = json::array();
  for (int l = 0; l < 24; ++l) lt.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return {
      {"architectures", {"GptOssForCausalLM"}},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"eos_token_id", 200002},
      {"experts_per_token", 4},
      {"head_dim", 64},
      {"hidden_act", "silu"},
      {"hidden_size", 2880},
      {"initial_context_length", 4096},
      {"initializer_range", 0.02},
      {"intermediate_size", 2880},
      {"layer_types", lt},
      {"max_position_embeddings", 131072},
      {"model_type", "gpt_oss"},
      {"num_attention_heads", 64},
      {"num_experts_per_tok", 4},
      {"num_hidden_layers", 24},
      {"num_key_value_heads", 8},
      {"num_local_experts", 32},
      {"output_router_logits", false},
      {"pad_token_id", 199999},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
          "lm_head"}},
        {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"beta_fast", 32.0},
        {"beta_slow", 1.0},
        {"factor", 32.0},
        {"original_max_position_embeddings", 4096},
        {"rope_type", "yarn"},
        {"truncate", false}}},
      {"rope_theta", 150000},
      {"router_aux_loss_coef", 0.9},
      {"sliding_window", 128},
      {"swiglu_limit", 7.0},
      {"tie_word_embeddings", false},
      {"transformers_version", "4.55.0.dev0"},
      {"use_cache", true},
      {"vocab_size", 201088},
  };
}

// The same model as transformers 5 writes it: rope_parameters with rope_theta inside, no
// top-level rope_theta.
json tf5_20b() {
  json j = hub_20b();
  json rp = j["rope_scaling"];
  rp["rope_theta"] = 150000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = rp;
  return j;
}

std::string write_config(const std::string& text, const std::string& tag = "config") {
  const std::string path = (fs::path(test::temp_dir(tag)) / "config.json").string();
  std::ofstream(path) << text;
  return path;
}

// Loads `j` (written to a file) and expects a parity::Error whose single-line message names the
// file and contains every fragment.
void expect_refused(const json& j, std::initializer_list<std::string> fragments) {
  const std::string path = write_config(j.dump(2), "bad-config");
  try {
    Config::load(path);
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

json with(json j, const std::function<void(json&)>& edit) {
  edit(j);
  return j;
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_local_experts, b.num_local_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.layer_is_sliding, b.layer_is_sliding);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_type, b.rope_type);
  EXPECT_EQ(a.rope_factor, b.rope_factor);
  EXPECT_EQ(a.rope_beta_fast, b.rope_beta_fast);
  EXPECT_EQ(a.rope_beta_slow, b.rope_beta_slow);
  EXPECT_EQ(a.rope_original_max_position, b.rope_original_max_position);
  EXPECT_EQ(a.rope_truncate, b.rope_truncate);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.swiglu_alpha, b.swiglu_alpha);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.initial_context_length, b.initial_context_length);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
  EXPECT_EQ(a.quant_method, b.quant_method);
}

TEST(Config, Hub20bReadsTheSpecValues) {
  const Config c = Config::load(write_config(hub_20b().dump(2)));
  EXPECT_EQ(c.vocab_size, 201088);
  EXPECT_EQ(c.hidden_size, 2880);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 2880);
  EXPECT_EQ(c.num_local_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.sliding_window, 128);
  ASSERT_EQ(c.layer_is_sliding.size(), 24u);
  for (int l = 0; l < 24; ++l) EXPECT_EQ(c.sliding(l), l % 2 == 0) << "layer " << l;
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_EQ(c.rope_factor, 32.0);
  EXPECT_EQ(c.rope_beta_fast, 32.0);
  EXPECT_EQ(c.rope_beta_slow, 1.0);
  EXPECT_EQ(c.rope_original_max_position, 4096);
  EXPECT_FALSE(c.rope_truncate);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.swiglu_limit, 7.0);
  EXPECT_EQ(c.swiglu_alpha, 1.702);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.initial_context_length, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.eos_token_id, 200002);
  EXPECT_EQ(c.pad_token_id, 199999);
  EXPECT_EQ(c.quant_method, "mxfp4");
  // Derived dimensions (spec: q 4096, k/v 512, fused qkv 5120, 8 query heads per KV head).
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 512);
  EXPECT_EQ(c.qkv_dim(), 5120);
  EXPECT_EQ(c.heads_per_kv(), 8);
}

TEST(Config, RopeParametersAndRopeScalingReadTheSame) {
  const Config hub = Config::load(write_config(hub_20b().dump(2)));
  const Config tf5 = Config::load(write_config(tf5_20b().dump(2)));
  expect_same(hub, tf5);
  // rope_theta inside rope_parameters wins over a top-level one.
  json j = tf5_20b();
  j["rope_theta"] = 10000.0;
  j["rope_parameters"]["rope_theta"] = 250000.0;
  EXPECT_EQ(Config::from_json(j, "x").rope_theta, 250000.0);
}

TEST(Config, EveryFieldIsRead) {
  // Every value differs from its default, so a field the parser skipped would show.
  json j = {
      {"vocab_size", 1000},
      {"hidden_size", 96},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 6},
      {"num_key_value_heads", 3},
      {"head_dim", 10},
      {"intermediate_size", 48},
      {"num_local_experts", 5},
      {"num_experts_per_tok", 2},
      {"sliding_window", 7},
      {"layer_types", {"full_attention", "sliding_attention", "sliding_attention"}},
      {"rope_theta", 5000.5},
      {"rope_scaling",
       {{"rope_type", "yarn"},
        {"factor", 4.0},
        {"beta_fast", 16.0},
        {"beta_slow", 2.0},
        {"original_max_position_embeddings", 1024},
        {"truncate", true}}},
      {"rms_norm_eps", 3e-6},
      {"swiglu_limit", 5.5},
      {"max_position_embeddings", 8192},
      {"initial_context_length", 2048},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"eos_token_id", {17, 18}},
      {"pad_token_id", 19},
      {"quantization_config", {{"quant_method", "mxfp4"}}},
  };
  const Config c = Config::from_json(j, "every-field");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.hidden_size, 96);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 6);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 10);  // explicit, not hidden / heads (16)
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.num_local_experts, 5);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.sliding_window, 7);
  EXPECT_EQ(c.layer_is_sliding, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.rope_theta, 5000.5);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_EQ(c.rope_factor, 4.0);
  EXPECT_EQ(c.rope_beta_fast, 16.0);
  EXPECT_EQ(c.rope_beta_slow, 2.0);
  EXPECT_EQ(c.rope_original_max_position, 1024);
  EXPECT_TRUE(c.rope_truncate);
  EXPECT_EQ(c.rms_norm_eps, 3e-6);
  EXPECT_EQ(c.swiglu_limit, 5.5);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.initial_context_length, 2048);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.eos_token_id, 17);  // the first of a list
  EXPECT_EQ(c.pad_token_id, 19);
  EXPECT_EQ(c.quant_method, "mxfp4");

  // to_json writes every field back: reading it again gives the same config.
  expect_same(Config::from_json(c.to_json(), "round trip"), c);
}

TEST(Config, OriginalNamesAndDefaults) {
  json j = hub_20b();
  j.erase("num_local_experts");
  j.erase("num_experts_per_tok");
  j["num_experts"] = 16;       // original/config.json name
  j["experts_per_token"] = 2;  // original name (the hub has both)
  j.erase("head_dim");         // defaults to hidden / heads
  j["hidden_size"] = 4096;
  j.erase("layer_types");  // gpt-oss convention: even layers slide
  j.erase("rms_norm_eps");
  j.erase("swiglu_limit");
  j.erase("eos_token_id");
  j.erase("pad_token_id");
  j.erase("quantization_config");
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "yarn";  // older HF key
  j["rope_scaling"].erase("original_max_position_embeddings");
  j["initial_context_length"] = 2048;  // the YaRN original context defaults to it
  const Config c = Config::from_json(j, "defaults");
  EXPECT_EQ(c.num_local_experts, 16);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.head_dim, 64);
  ASSERT_EQ(c.layer_is_sliding.size(), 24u);
  for (int l = 0; l < 24; ++l) EXPECT_EQ(c.sliding(l), l % 2 == 0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.swiglu_limit, 7.0);
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.quant_method, "");
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_EQ(c.rope_original_max_position, 2048);
}

TEST(Config, NoRopeSectionMeansPlainRope) {
  json j = hub_20b();
  j.erase("rope_scaling");
  j["rope_theta"] = 10000;
  const Config c = Config::from_json(j, "plain");
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_EQ(c.rope_factor, 1.0);
  const Rope r = Rope::from_config(c);
  EXPECT_EQ(r.concentration, 1.0);
  for (int i = 0; i < 32; ++i)
    EXPECT_DOUBLE_EQ(r.inv_freq[size_t(i)], std::pow(10000.0, -2.0 * i / 64));
}

TEST(Config, YarnTablesMatchTheSpec) {
  // Spec section 4.3: low = 8.0928, high = 17.3980; i <= 8 keep the frequency, i >= 18 are
  // divided by 32; concentration 0.1 ln 32 + 1.
  const Rope r = Rope::from_config(Config::from_json(hub_20b(), "20b"));
  ASSERT_EQ(r.inv_freq.size(), 32u);
  EXPECT_DOUBLE_EQ(r.concentration, 1.3465735902799727);
  const double low = 8.092779, high = 17.398024;
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(150000.0, -2.0 * i / 64);
    if (i <= 8) {
      EXPECT_DOUBLE_EQ(r.inv_freq[size_t(i)], base) << i;
    } else if (i >= 18) {
      EXPECT_DOUBLE_EQ(r.inv_freq[size_t(i)], base / 32) << i;
    } else {
      const double ramp = (i - low) / (high - low);
      EXPECT_NEAR(r.inv_freq[size_t(i)], base * (1 - ramp) + base / 32 * ramp, 1e-6 * base) << i;
    }
  }
}

TEST(ConfigErrors, FileProblems) {
  const std::string missing = (fs::path(test::temp_dir("no-config")) / "config.json").string();
  try {
    Config::load(missing);
    ADD_FAILURE() << "missing file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  for (const std::string text : {"{\"vocab_size\": 10,", "", "not json", "{\"a\": 1} trailing"}) {
    const std::string path = write_config(text, "bad-json");
    try {
      Config::load(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  expect_refused(json::array({1, 2}), {"JSON object"});
}

TEST(ConfigErrors, MissingRequiredField) {
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "intermediate_size", "sliding_window"})
    expect_refused(with(hub_20b(), [&](json& j) { j.erase(key); }),
                   {"missing required field", key});
  // Both names of the expert counts missing: the error names the fallback it looked for.
  expect_refused(with(hub_20b(), [](json& j) { j.erase("num_local_experts"); }),
                 {"missing", "num_experts"});
  expect_refused(with(hub_20b(),
                      [](json& j) {
                        j.erase("num_experts_per_tok");
                        j.erase("experts_per_token");
                      }),
                 {"missing", "experts_per_token"});
  expect_refused(with(hub_20b(), [](json& j) { j["hidden_size"] = nullptr; }), {"hidden_size"});
}

TEST(ConfigErrors, WrongType) {
  const std::pair<const char*, json> cases[] = {
      {"hidden_size", "2880"},
      {"hidden_size", 2880.5},  // a fraction is not a dimension
      {"hidden_size", true},    // nor is a boolean
      {"hidden_size", json::array({2880})},
      {"num_attention_heads", json::object()},
      {"vocab_size", 4294967296.0},
      {"rms_norm_eps", "1e-5"},
      {"rms_norm_eps", false},
      {"swiglu_limit", json::array({7})},
      {"rope_theta", "150000"},
      {"attention_bias", "yes"},
      {"attention_bias", 1},
      {"tie_word_embeddings", "false"},
      {"max_position_embeddings", 131072.5},
      {"head_dim", "64"},
  };
  for (const auto& [key, value] : cases)
    expect_refused(with(hub_20b(), [&](json& j) { j[key] = value; }), {key});
  // Inside the rope section the message says which section.
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["factor"] = "32"; }),
                 {"rope_scaling", "factor"});
  expect_refused(with(tf5_20b(), [](json& j) { j["rope_parameters"]["rope_theta"] = "1e5"; }),
                 {"rope_parameters", "rope_theta"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["truncate"] = "no"; }),
                 {"truncate"});
  // A rope section that is not an object is not silently dropped (that would mean plain RoPE).
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"] = "yarn"; }), {"rope_scaling"});
  expect_refused(with(tf5_20b(), [](json& j) { j["rope_parameters"] = json::array(); }),
                 {"rope_parameters"});
  expect_refused(with(hub_20b(), [](json& j) { j["layer_types"] = "sliding_attention"; }),
                 {"layer_types"});
  expect_refused(with(hub_20b(), [](json& j) { j["layer_types"][3] = 1; }), {"layer_types"});
}

TEST(ConfigErrors, IntegerOutOfRange) {
  // 2^32 + 2880 would wrap to 2880 in a 32-bit int.
  expect_refused(with(hub_20b(), [](json& j) { j["hidden_size"] = int64_t(4294967296) + 2880; }),
                 {"hidden_size"});
  expect_refused(
      with(hub_20b(), [](json& j) { j["vocab_size"] = std::numeric_limits<uint64_t>::max(); }),
      {"vocab_size"});
}

TEST(ConfigErrors, NonPositiveDimensions) {
  for (const char* key :
       {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts",
        "num_experts_per_tok", "sliding_window", "max_position_embeddings"})
    for (int v : {0, -1}) {
      json j = hub_20b();
      j[key] = v;
      if (std::string(key) == "num_hidden_layers") j.erase("layer_types");
      if (std::string(key) == "num_experts_per_tok") j["experts_per_token"] = v;
      expect_refused(j, {key, "positive"});
    }
  expect_refused(with(hub_20b(), [](json& j) { j["rms_norm_eps"] = 0; }), {"rms_norm_eps"});
  expect_refused(with(hub_20b(), [](json& j) { j["swiglu_limit"] = -7.0; }), {"swiglu_limit"});
}

TEST(ConfigErrors, InconsistentShapes) {
  expect_refused(with(hub_20b(), [](json& j) { j["num_key_value_heads"] = 7; }),
                 {"num_attention_heads (64)", "multiple", "num_key_value_heads (7)"});
  expect_refused(with(hub_20b(), [](json& j) { j["num_key_value_heads"] = 128; }), {"multiple"});
  expect_refused(with(hub_20b(), [](json& j) { j["head_dim"] = 63; }), {"head_dim", "even"});
  expect_refused(with(hub_20b(),
                      [](json& j) {
                        j["num_experts_per_tok"] = 33;
                        j["experts_per_token"] = 33;
                      }),
                 {"num_experts_per_tok (33)", "num_local_experts (32)"});
  expect_refused(with(hub_20b(), [](json& j) { j["layer_types"].erase(23); }),
                 {"layer_types", "23", "24"});
  expect_refused(with(hub_20b(), [](json& j) { j["layer_types"][0] = "chunked_attention"; }),
                 {"layer_types", "chunked_attention"});
  expect_refused(with(hub_20b(), [](json& j) { j["tie_word_embeddings"] = true; }),
                 {"tie_word_embeddings"});
}

TEST(ConfigErrors, RopeProblems) {
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["rope_type"] = "linear"; }),
                 {"linear", "rope"});
  expect_refused(with(tf5_20b(), [](json& j) { j["rope_parameters"]["rope_type"] = "dynamic"; }),
                 {"dynamic"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["factor"] = 0.5; }), {"factor"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["beta_slow"] = 32.0; }),
                 {"beta_fast", "beta_slow"});
  expect_refused(
      with(hub_20b(), [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; }),
      {"original_max_position_embeddings"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_theta"] = 1; }), {"rope_theta"});
  expect_refused(with(tf5_20b(), [](json& j) { j["rope_parameters"]["rope_theta"] = -5.0; }),
                 {"rope_theta"});
}

}  // namespace
}  // namespace parity
