// Synthetic checkpoints (model/synth.h): the same (preset, seed) gives the same bytes, another
// seed other weights; the output loads with the checkpoint loader in the tiny config's shapes;
// and the float64 reference over it engages the SwiGLU clamp on both sides and routes to every
// expert, which is what the weight scales in synth.cpp promise.
#include "model/synth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "model/numerics.h"
#include "model/safetensors.h"
#include "reference/cpu_backend.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

std::map<std::string, std::string> read_dir(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    files[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

std::string synth(const std::string& preset, uint64_t seed, const std::string& tag) {
  SynthSpec spec = synth_preset(preset);
  spec.seed = seed;
  const std::string dir = test::temp_dir(tag);
  const SynthResult r = write_synthetic_checkpoint(spec, dir, false);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(dir)) on_disk += e.file_size();
  EXPECT_EQ(r.bytes, on_disk) << "SynthResult::bytes counts every file written";
  return dir;
}

TEST(Synth, SameSeedGivesByteIdenticalFiles) {
  const auto a = read_dir(synth("tiny", 7, "synth-a"));
  const auto b = read_dir(synth("tiny", 7, "synth-b"));
  ASSERT_EQ(a.size(), 4u);  // config.json, index, 2 shards
  EXPECT_TRUE(a.count("config.json") && a.count("model.safetensors.index.json") &&
              a.count("model-00001-of-00002.safetensors") &&
              a.count("model-00002-of-00002.safetensors"));
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b.at(name)) << name << " differs between two runs with the same seed";
  }
}

TEST(Synth, RewritingIntoTheSameDirectoryGivesTheSameBytes) {
  const std::string dir = synth("tiny", 3, "synth-rewrite");
  const auto first = read_dir(dir);
  SynthSpec spec = synth_preset("tiny");
  spec.seed = 3;
  write_synthetic_checkpoint(spec, dir, false);  // replaces its own earlier output
  EXPECT_TRUE(read_dir(dir) == first) << "rewrite changed the files";
}

TEST(Synth, DifferentSeedGivesDifferentWeights) {
  const std::string da = synth("tiny", 1, "synth-s1"), db = synth("tiny", 2, "synth-s2");
  const TensorStore a(da), b(db);
  ASSERT_EQ(a.names(), b.names());  // same plan, same shapes
  size_t differing = 0;
  for (const auto& name : a.names()) {
    const TensorView &ta = a.get(name), &tb = b.get(name);
    ASSERT_EQ(ta.shape, tb.shape) << name;
    ASSERT_EQ(ta.dtype, tb.dtype) << name;
    if (std::memcmp(ta.data, tb.data, ta.nbytes) != 0) ++differing;
  }
  // Every tensor is random except perhaps the MXFP4 scales (two possible bytes each), which
  // still differ over a whole tensor.
  EXPECT_EQ(differing, a.names().size());
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

TEST(Synth, DifferentTensorsGetDifferentStreams) {
  // Same shape, same seed, different names: a generator keyed only by the seed would repeat.
  const TensorStore s(test::tiny_model_dir());
  const TensorView &k = s.get("model.layers.0.self_attn.k_proj.weight"),
                   &v = s.get("model.layers.0.self_attn.v_proj.weight"),
                   &k1 = s.get("model.layers.1.self_attn.k_proj.weight");
  ASSERT_EQ(k.nbytes, v.nbytes);
  EXPECT_NE(std::memcmp(k.data, v.data, k.nbytes), 0);
  EXPECT_NE(std::memcmp(k.data, k1.data, k.nbytes), 0);
}

TEST(Synth, LoadsWithTheTinyConfigShapes) {
  const Config want = synth_preset("tiny").config;
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  EXPECT_EQ(c.to_json(), want.to_json());
  const int64_t H = want.hidden_size, V = want.vocab_size, E = want.num_local_experts,
                I = want.intermediate_size, nH = want.num_attention_heads, d = want.head_dim,
                nKV = want.num_key_value_heads;
  EXPECT_EQ(m->expert_layout, ExpertLayout::Mxfp4);
  EXPECT_EQ(m->embed->shape, (std::vector<int64_t>{V, H}));
  EXPECT_EQ(m->lm_head.weight->shape, (std::vector<int64_t>{V, H}));
  EXPECT_EQ(m->final_norm->shape, (std::vector<int64_t>{H}));
  ASSERT_EQ(m->layers.size(), size_t(want.num_hidden_layers));
  for (const auto& l : m->layers) {
    EXPECT_EQ(l.attn_norm->shape, (std::vector<int64_t>{H}));
    EXPECT_EQ(l.q.weight->shape, (std::vector<int64_t>{nH * d, H}));
    EXPECT_EQ(l.k.weight->shape, (std::vector<int64_t>{nKV * d, H}));
    EXPECT_EQ(l.v.bias->shape, (std::vector<int64_t>{nKV * d}));
    EXPECT_EQ(l.o.weight->shape, (std::vector<int64_t>{H, nH * d}));
    EXPECT_EQ(l.sinks->shape, (std::vector<int64_t>{nH}));
    EXPECT_EQ(l.router.weight->shape, (std::vector<int64_t>{E, H}));
    EXPECT_EQ(l.mlp1.blocks->shape, (std::vector<int64_t>{E, 2 * I, H / 32, 16}));
    EXPECT_EQ(l.mlp1.scales->shape, (std::vector<int64_t>{E, 2 * I, H / 32}));
    EXPECT_EQ(l.mlp1.bias->shape, (std::vector<int64_t>{E, 2 * I}));
    EXPECT_EQ(l.mlp2.blocks->shape, (std::vector<int64_t>{E, H, I / 32, 16}));
    EXPECT_EQ(l.mlp2.bias->shape, (std::vector<int64_t>{E, H}));
    EXPECT_EQ(l.q.weight->dtype, DType::BF16);
    EXPECT_EQ(l.sinks->dtype, DType::BF16);
    EXPECT_EQ(l.mlp1.blocks->dtype, DType::U8);
  }
  // Two shards through an index, embeddings and lm_head in the last one (as on the hub).
  EXPECT_TRUE(fs::exists(fs::path(test::tiny_model_dir()) / "model.safetensors.index.json"));
  EXPECT_NE(m->embed->file.find("model-00002-of-00002"), std::string::npos) << m->embed->file;
}

TEST(Synth, WeightsHaveTheIntendedScales) {
  // Embeddings N(0, 1), norm weights 1 + N(0, 0.1), MXFP4 experts with RMS gain / sqrt(fan_in)
  // (3.3 / sqrt(64) for gate_up); each within a loose band that a wrong scale would leave.
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  auto stats = [](const std::vector<double>& v) {
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(sq / double(v.size()))};
  };
  std::vector<double> embed(size_t(m->embed->numel()));
  read_vector(*m->embed, embed.data());
  const auto [em, es] = stats(embed);
  EXPECT_NEAR(em, 0.0, 0.02);
  EXPECT_NEAR(es, 1.0, 0.05);
  std::vector<double> norm(size_t(c.hidden_size));
  read_vector(*m->final_norm, norm.data());
  const auto [nm, ns] = stats(norm);
  EXPECT_NEAR(nm, 1.0, 0.05);
  EXPECT_NEAR(ns, 0.1, 0.04);
  double sq = 0;
  size_t n = 0;
  std::vector<double> row(size_t(c.hidden_size));
  for (int e = 0; e < c.num_local_experts; ++e)
    for (int r = 0; r < 2 * c.intermediate_size; ++r) {
      read_expert_row(m->layers[0].mlp1, e, r, row.data());
      for (double x : row) sq += x * x;
      n += row.size();
    }
  EXPECT_NEAR(std::sqrt(sq / double(n)), 3.3 / 8.0, 0.03);
  // The scales mix two adjacent bytes (synth.cpp: an exact RMS between powers of two).
  const TensorView& sc = *m->layers[0].mlp1.scales;
  std::map<int, size_t> bytes;
  for (size_t i = 0; i < sc.nbytes; ++i) ++bytes[sc.data[i]];
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes.rbegin()->first, bytes.begin()->first + 1);
}

// What the reference does with the tiny model over 16 positions (the figures parity-synth
// prints): SwiGLU inputs beyond the limit on each side, and expert selections.
struct ForwardFigures : Observer {
  explicit ForwardFigures(const Config& c)
      : limit(c.swiglu_limit),
        selections(size_t(c.num_hidden_layers), std::vector<int>(size_t(c.num_local_experts))) {}
  bool wants(int, int, Stage s) const override { return s == Stage::mlp1 || s == Stage::topk_idx; }
  void record(const StageKey& key, const StageData& d) override {
    if (key.stage == Stage::topk_idx) {
      for (size_t i = 0; i < d.size(); ++i) ++selections.at(size_t(key.layer)).at(size_t(d.at(i)));
      return;
    }
    for (size_t i = 0; i < d.size(); ++i) {  // interleaved: even = gate, odd = linear
      const double v = d.at(i);
      if (i % 2 == 0) {
        ++gate_n;
        gate_over += v > limit;
      } else {
        ++lin_n;
        lin_over += v > limit;
        lin_under += v < -limit;
      }
    }
  }
  double limit;
  std::vector<std::vector<int>> selections;
  size_t gate_n = 0, gate_over = 0, lin_n = 0, lin_over = 0, lin_under = 0;
};

TEST(Synth, ReferenceForwardClampsBothSidesAndUsesEveryExpert) {
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  auto backend = make_reference_backend(*m);
  Batch batch;
  for (int p = 0; p < 16; ++p) {  // parity-synth's default for tiny, seed 0
    batch.tokens.push_back(int32_t((1 + 7919ull * uint64_t(p)) % uint64_t(c.vocab_size)));
    batch.positions.push_back(p);
    batch.seqs.push_back(0);
  }
  ForwardFigures fig(c);
  forward(*backend, batch, &fig);
  ASSERT_EQ(fig.gate_n,
            size_t(16 * c.num_hidden_layers * c.num_experts_per_tok * c.intermediate_size));
  // synth.cpp aims at ~2% of gates above the limit and ~3-4% of |linear| above it.
  const double gate = double(fig.gate_over) / double(fig.gate_n);
  const double lin = double(fig.lin_over + fig.lin_under) / double(fig.lin_n);
  EXPECT_GT(fig.gate_over, 0u);
  EXPECT_GT(fig.lin_over, 0u) << "linear half clamped from above";
  EXPECT_GT(fig.lin_under, 0u) << "linear half clamped from below";
  EXPECT_GT(gate, 0.002);
  EXPECT_LT(gate, 0.2);
  EXPECT_GT(lin, 0.002);
  EXPECT_LT(lin, 0.2);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    int total = 0;
    for (int e = 0; e < c.num_local_experts; ++e) {
      EXPECT_GT(fig.selections[size_t(l)][size_t(e)], 0)
          << "layer " << l << " never routes to expert " << e;
      total += fig.selections[size_t(l)][size_t(e)];
    }
    EXPECT_EQ(total, 16 * c.num_experts_per_tok) << "layer " << l;
  }
}

TEST(Synth, PresetsAndRefusals) {
  const SynthSpec s20 = synth_preset("20b");
  EXPECT_EQ(s20.config.num_local_experts, 32);
  EXPECT_EQ(s20.config.num_hidden_layers, 24);
  EXPECT_EQ(s20.shards, 3);
  const SynthSpec s120 = synth_preset("120b");
  EXPECT_EQ(s120.config.num_local_experts, 128);
  EXPECT_EQ(s120.config.num_hidden_layers, 36);
  EXPECT_THROW(synth_preset("7b"), Error);

  // A directory holding a real checkpoint (config.json not written by parity-synth) is never
  // overwritten.
  const std::string dir = test::temp_dir("synth-foreign");
  std::ofstream(fs::path(dir) / "config.json") << "{\"model_type\": \"gpt_oss\"}";
  try {
    write_synthetic_checkpoint(synth_preset("tiny"), dir, false);
    ADD_FAILURE() << "overwrote a foreign checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));

  SynthSpec bad = synth_preset("tiny");
  bad.config.hidden_size = 48;  // not a multiple of the MXFP4 block
  EXPECT_THROW(write_synthetic_checkpoint(bad, test::temp_dir("synth-bad"), false), Error);
  bad = synth_preset("tiny");
  bad.shards = 0;
  EXPECT_THROW(write_synthetic_checkpoint(bad, test::temp_dir("synth-bad"), false), Error);
}

}  // namespace
}  // namespace parity
