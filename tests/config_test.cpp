// config.json parsing (model/config.h): the hub form (rope_scaling + top-level rope_theta) and the
// transformers 5 form (rope_parameters) of a gpt-oss-20b config read to the same values, every
// field of the spec is read, and each malformed config is refused with one line naming the file
// and the problem: untrusted JSON (deep nesting, 1e400, huge values), dimensions beyond any
// gpt-oss-like model, special files (FIFO, /dev/zero), RoPE parameters outside their domain.
#include "model/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <string>

#include "model/error.h"
#include "model/synth.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::expect_prompt_refusal;
using test::nested_arrays;
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


// Loads `text` (written as config.json) and expects a parity::Error per expect_message.
void expect_text_refused(const std::string& text, std::initializer_list<std::string> fragments) {
  const std::string path = write_config(text, "bad-config");
  try {
    Config::load(path);
    ADD_FAILURE() << "accepted: " << text.substr(0, 1000);
  } catch (const Error& e) {
    test::expect_message(e.what(), path, fragments);
  }
}

void expect_refused(const json& j, std::initializer_list<std::string> fragments) {
  expect_text_refused(j.dump(2), fragments);
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
    test::expect_message(e.what(), missing, {"no such file"});
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

TEST(ConfigErrors, TwoNamesOfOneFieldThatDisagree) {
  // The hub file has num_experts_per_tok and experts_per_token, both 4: agreeing names pass.
  EXPECT_EQ(Config::from_json(hub_20b(), "hub").num_experts_per_tok, 4);
  expect_refused(with(hub_20b(), [](json& j) { j["num_experts_per_tok"] = 2; }),
                 {"\"num_experts_per_tok\" is 2 but \"experts_per_token\"", "is 4"});
  expect_refused(with(hub_20b(), [](json& j) { j["num_experts"] = 16; }),
                 {"\"num_local_experts\" is 32 but \"num_experts\"", "is 16"});
  expect_refused(with(hub_20b(), [](json& j) { j["experts_per_token"] = "4"; }),
                 {"experts_per_token", "wrong type"});
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
    expect_refused(with(hub_20b(), [&key = key, &value = value](json& j) { j[key] = value; }),
                   {key});
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

// ---- Untrusted JSON ----------------------------------------------------------------------------

TEST(ConfigErrors, DeepNestingIsRefusedNotRecursed) {
  const std::string hub = hub_20b().dump();
  const std::string deep = nested_arrays(100000);
  // As the value of a field read as a dimension, of a field nobody reads, and of the rope
  // section: refused by the parser at its depth limit, before any dump or comparison.
  for (const std::string key : {"hidden_size", "unread_field", "rope_scaling"}) {
    json j = hub_20b();
    j.erase(key);
    std::string text = j.dump();
    text.insert(1, "\"" + key + "\": " + deep + ", ");
    expect_text_refused(text, {"nested deeper"});
  }
  // Objects as well as arrays.
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\": ";
  objects += "1" + std::string(100000, '}');
  expect_text_refused(objects, {"nested deeper"});
  // Nesting a config legitimately has (3 levels) is fine.
  EXPECT_NO_THROW(Config::load(write_config(hub)));
}

TEST(ConfigErrors, NumberOutOfDoubleRangeNamesTheFile) {
  for (const char* key : {"rope_theta", "hidden_size", "unread_field"}) {
    json j = hub_20b();
    j.erase(key);
    std::string text = j.dump();
    text.insert(1, "\"" + std::string(key) + "\": 1e400, ");
    expect_text_refused(text, {"out of range"});
  }
  std::string text = hub_20b().dump();
  text.replace(text.find("\"factor\":32.0"), 13, "\"factor\":-1e400");
  expect_text_refused(text, {"out of range"});
}

TEST(ConfigErrors, HugeValuesAreNotEchoedWhole) {
  const std::string big(200000, 'A');
  expect_refused(with(hub_20b(), [&](json& j) { j["hidden_size"] = big; }), {"hidden_size"});
  expect_refused(with(hub_20b(), [&](json& j) { j["layer_types"][0] = big; }), {"layer_types"});
  expect_refused(with(hub_20b(), [&](json& j) { j["rope_scaling"]["rope_type"] = big; }),
                 {"rope type"});
  expect_refused(with(hub_20b(), [&](json& j) { j["quantization_config"]["quant_method"] = big; }),
                 {"quant_method"});
  expect_refused(with(hub_20b(), [&](json& j) { j["head_dim"] = json::array({big, big}); }),
                 {"head_dim"});
  json many = json::array();
  for (int i = 0; i < 100000; ++i) many.push_back(i);
  expect_refused(with(hub_20b(), [&](json& j) { j["num_attention_heads"] = many; }),
                 {"num_attention_heads", "100000 elements"});
  // Control characters and escapes in a value are escaped, so the message stays one line.
  expect_refused(with(hub_20b(), [](json& j) { j["layer_types"][0] = "x\ny\x1b[31m"; }),
                 {"x\\ny\\x1b[31m"});
  // Token ids: a list's first entry read, an integer outside int refused rather than wrapped.
  expect_refused(with(hub_20b(), [](json& j) { j["eos_token_id"] = int64_t(1) << 40; }),
                 {"eos_token_id", "out of range"});
  expect_refused(with(hub_20b(), [](json& j) { j["pad_token_id"] = {int64_t(1) << 40}; }),
                 {"pad_token_id", "out of range"});
}

// ---- Dimensions beyond any gpt-oss-like model ---------------------------------------------------

TEST(ConfigErrors, DimensionsBeyondAnyModelAreRefused) {
  const int big = std::numeric_limits<int>::max();
  const std::pair<const char*, int> cases[] = {
      {"intermediate_size", big},                            // 2I overflowed int
      {"intermediate_size", ConfigLimits::kMaxIntermediate + 1},
      {"head_dim", 1 << 30},                                 // q_dim overflowed int
      {"head_dim", ConfigLimits::kMaxHeadDim + 2},
      {"hidden_size", ConfigLimits::kMaxHidden + 1},
      {"vocab_size", ConfigLimits::kMaxVocab + 1},
      {"num_attention_heads", ConfigLimits::kMaxHeads * 8},  // a multiple of 8 KV heads
      {"num_local_experts", ConfigLimits::kMaxExperts + 1},
      {"max_position_embeddings", ConfigLimits::kMaxContext + 1},
      {"sliding_window", big},
  };
  for (const auto& [key, value] : cases)
    expect_refused(with(hub_20b(), [&key = key, &value = value](json& j) { j[key] = value; }),
                   {key, "at most"});
  expect_refused(with(hub_20b(),
                      [](json& j) {
                        j["num_key_value_heads"] = ConfigLimits::kMaxHeads + 1;
                        j["num_attention_heads"] = ConfigLimits::kMaxHeads + 1;
                      }),
                 {"num_attention_heads", "at most"});
  expect_refused(with(hub_20b(), [](json& j) { j["sliding_window"] = 200000; }),
                 {"sliding_window (200000)", "max_position_embeddings (131072)"});
  expect_refused(
      with(hub_20b(),
           [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 1 << 30; }),
      {"original_max_position_embeddings", "at most"});
  expect_refused(with(hub_20b(), [](json& j) { j["initial_context_length"] = -4096; }),
                 {"initial_context_length", "positive"});
}

TEST(ConfigErrors, AbsurdLayerCountIsRefusedBeforeAnyWork) {
  // Without layer_types the default list would be built num_hidden_layers long: 2^31 - 1
  // entries took 17 s and 600 MB before the count was checked.
  const auto start = std::chrono::steady_clock::now();
  expect_refused(with(hub_20b(),
                      [](json& j) {
                        j.erase("layer_types");
                        j["num_hidden_layers"] = std::numeric_limits<int>::max();
                      }),
                 {"num_hidden_layers", "at most 1024"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  json many = json::array();
  for (int l = 0; l < 5000; ++l) many.push_back("full_attention");
  expect_refused(with(hub_20b(), [&](json& j) { j["layer_types"] = many; }),
                 {"layer_types", "5000 entries"});
}

TEST(Config, TheBoundsAdmitEveryRealConfig) {
  // The hub's 20b and 120b, the synthetic presets, transformers' tiny one and the unit tests'.
  json c120 = hub_20b();
  c120["num_hidden_layers"] = 36;
  c120["num_local_experts"] = 128;
  c120.erase("layer_types");
  EXPECT_NO_THROW(Config::from_json(c120, "120b"));
  EXPECT_NO_THROW(Config::from_json(hub_20b(), "20b"));
  EXPECT_NO_THROW(Config::from_json(tf5_20b(), "20b tf5"));
  for (const char* preset : {"tiny", "20b", "120b"})
    EXPECT_NO_THROW(synth_preset(preset).config.validate(preset)) << preset;
  for (const char* golden : {"hf-tiny", "hf-large"})
    EXPECT_NO_THROW(Config::load(std::string(PARITY_SOURCE_DIR) + "/golden/" + golden +
                                 "/config.json"))
        << golden;
  EXPECT_NO_THROW(test::small_config());

  // Every dimension at its bound at once: accepted, and the derived sizes are exact.
  json j = hub_20b();
  j["vocab_size"] = ConfigLimits::kMaxVocab;
  j["hidden_size"] = ConfigLimits::kMaxHidden;
  j["num_attention_heads"] = ConfigLimits::kMaxHeads;
  j["num_key_value_heads"] = ConfigLimits::kMaxHeads;
  j["head_dim"] = ConfigLimits::kMaxHeadDim;
  j["intermediate_size"] = ConfigLimits::kMaxIntermediate;
  j["num_local_experts"] = ConfigLimits::kMaxExperts;
  j["num_experts_per_tok"] = j["experts_per_token"] = ConfigLimits::kMaxExperts;
  j["max_position_embeddings"] = ConfigLimits::kMaxContext;
  j["sliding_window"] = ConfigLimits::kMaxContext;
  j["num_hidden_layers"] = ConfigLimits::kMaxLayers;
  j.erase("layer_types");
  const Config c = Config::from_json(j, "largest");
  EXPECT_EQ(int64_t(c.q_dim()), int64_t(1024) * 1024);
  EXPECT_EQ(int64_t(c.qkv_dim()), int64_t(3) * 1024 * 1024);
  EXPECT_EQ(c.heads_per_kv(), 1);
  EXPECT_EQ(c.layer_is_sliding.size(), size_t(ConfigLimits::kMaxLayers));
  const Rope r = Rope::from_config(c);
  ASSERT_EQ(r.inv_freq.size(), 512u);
  for (double f : r.inv_freq) EXPECT_TRUE(std::isfinite(f) && f > 0);
}

// ---- Special files -----------------------------------------------------------------------------

TEST(ConfigErrors, SpecialFilesAreRefusedPromptly) {
  {
    const std::string path = (fs::path(test::temp_dir("fifo-config")) / "config.json").string();
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    expect_prompt_refusal([&] { Config::load(path); }, path, path, {"not a regular file"});
  }
  {
    // /dev/zero would read without end.
    const std::string path = (fs::path(test::temp_dir("zero-config")) / "config.json").string();
    fs::create_symlink("/dev/zero", path);
    expect_prompt_refusal([&] { Config::load(path); }, "", path, {"not a regular file"});
  }
  {
    const std::string path = (fs::path(test::temp_dir("dir-config")) / "config.json").string();
    fs::create_directory(path);
    expect_prompt_refusal([&] { Config::load(path); }, "", path, {"directory"});
  }
  {
    // A sparse 17 MB file: refused by its size, before it is read.
    const std::string path = write_config("{}", "huge-config");
    fs::resize_file(path, Config::kMaxFileBytes + 1);
    expect_prompt_refusal([&] { Config::load(path); }, "", path,
                          {std::to_string(Config::kMaxFileBytes + 1), "bytes"});
  }
}

// ---- RoPE and the other real parameters ---------------------------------------------------------

TEST(ConfigErrors, RealParametersOutsideTheirDomain) {
  // Each of these gave NaN or meaningless RoPE tables (or a NaN norm or clamp) silently.
  const std::pair<const char*, double> rope_cases[] = {
      {"beta_fast", -32.0}, {"beta_fast", 0.0}, {"beta_slow", -1.0},
      {"beta_slow", 0.0},   {"factor", 0.0},    {"factor", -32.0},
  };
  for (const auto& [key, value] : rope_cases) {
    expect_refused(
        with(hub_20b(), [&key = key, &value = value](json& j) { j["rope_scaling"][key] = value; }),
        {key});
    expect_refused(with(tf5_20b(), [&key = key, &value = value](
                                       json& j) { j["rope_parameters"][key] = value; }),
                   {key});
  }
  expect_refused(with(hub_20b(), [](json& j) { j["rope_theta"] = 0; }), {"rope_theta"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_theta"] = -150000; }), {"rope_theta"});
  expect_refused(
      with(hub_20b(), [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = -5; }),
      {"original_max_position_embeddings"});
  expect_refused(with(hub_20b(), [](json& j) { j["rms_norm_eps"] = -1e-5; }), {"rms_norm_eps"});
  expect_refused(with(hub_20b(), [](json& j) { j["swiglu_limit"] = 0; }), {"swiglu_limit"});
  // beta_fast <= beta_slow: the ramp would run backwards (or divide by zero).
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["beta_fast"] = 1.0; }),
                 {"beta_fast > beta_slow"});
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["beta_fast"] = 0.5; }),
                 {"beta_fast > beta_slow"});

  // NaN and infinity cannot be written in JSON; a config built in code can hold them.
  const Config good = Config::from_json(hub_20b(), "20b");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<const char*, std::function<void(Config&, double)>> fields[] = {
      {"rms_norm_eps", [](Config& c, double v) { c.rms_norm_eps = v; }},
      {"swiglu_limit", [](Config& c, double v) { c.swiglu_limit = v; }},
      {"rope_theta", [](Config& c, double v) { c.rope_theta = v; }},
      {"factor", [](Config& c, double v) { c.rope_factor = v; }},
      {"beta_fast", [](Config& c, double v) { c.rope_beta_fast = v; }},
      {"beta_slow", [](Config& c, double v) { c.rope_beta_slow = v; }},
  };
  for (const auto& [name, set] : fields)
    for (double v : {nan, inf, -inf}) {
      Config c = good;
      set(c, v);
      try {
        c.validate("code-built config");
        ADD_FAILURE() << name << " = " << v << " accepted";
      } catch (const Error& e) {
        test::expect_message(e.what(), "code-built config", {name});
      }
    }
}

TEST(ConfigErrors, YarnRampOutsideTheRotaryPairs) {
  // The 20b's ramp, as Rope computes it: the spec's 8.0928 and 17.3980 of 31 pairs.
  const Rope::YarnRamp r = Rope::yarn_ramp(Config::from_json(hub_20b(), "20b"));
  EXPECT_NEAR(r.low, 8.092779, 1e-6);
  EXPECT_NEAR(r.high, 17.398024, 1e-6);
  // low <= 0: beta_fast rotations do not fit the original context even at pair 0
  // (4096 / (2 pi 1000) < 1). The official reference asserts, transformers clamps to 0.
  expect_refused(with(hub_20b(), [](json& j) { j["rope_scaling"]["beta_fast"] = 1000.0; }),
                 {"YaRN ramp", "head_dim 64", "beta_fast"});
  // high > d - 1: a small theta puts the ramp's end past the last pair (transformers clamps).
  expect_refused(with(hub_20b(), [](json& j) { j["rope_theta"] = 10.0; }),
                 {"YaRN ramp", "rope_theta"});
  // Factor 1 is plain RoPE, which has no ramp: no bound applies.
  EXPECT_NO_THROW(Config::from_json(with(hub_20b(),
                                         [](json& j) {
                                           j["rope_scaling"]["factor"] = 1.0;
                                           j["rope_scaling"]["beta_fast"] = 1000.0;
                                         }),
                                    "factor 1"));
  // Accepted ramps give finite tables, truncate (floor/ceil) included.
  for (bool truncate : {false, true}) {
    json j = hub_20b();
    j["rope_scaling"]["truncate"] = truncate;
    const Rope rope = Rope::from_config(Config::from_json(j, "20b"));
    for (double f : rope.inv_freq) EXPECT_TRUE(std::isfinite(f) && f > 0) << truncate;
  }
}

TEST(ConfigErrors, RopeTablesOfAnInvalidHeadDimAreRefused) {
  for (int d : {0, -2, 3, ConfigLimits::kMaxHeadDim + 2, std::numeric_limits<int>::min()}) {
    Config c;
    c.head_dim = d;
    EXPECT_THROW(Rope::from_config(c), Error) << d;
  }
}

TEST(ConfigErrors, UnsupportedQuantization) {
  expect_refused(with(hub_20b(), [](json& j) { j["quantization_config"]["quant_method"] = "fp8"; }),
                 {"quant_method", "\"fp8\""});
}

}  // namespace
}  // namespace parity
