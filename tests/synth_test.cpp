// Synthetic checkpoints (model/synth.h): the same (preset, seed, magnitudes) gives the same bytes,
// another seed other weights; unit magnitudes are the default and still the bytes the golden
// files were made from; the output loads with the checkpoint loader in the tiny config's shapes;
// and the float64 reference over it engages the SwiGLU clamp on both sides and routes to every
// expert, which is what the weight scales in synth.cpp promise. With realistic magnitudes the
// reference also shows what those scales promise: small embeddings, large norm weights, biases
// and sinks, and massive activations on the designed residual channels from layer 1 on, with
// the stages after every norm still carrying signal.
#include "model/fingerprint.h"
#include "model/synth.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
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
    if (e.path().filename() == kFingerprintCacheName) continue;  // written by loading, not synth
    std::ifstream in(e.path(), std::ios::binary);
    files[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

std::string synth(const std::string& preset, uint64_t seed, const std::string& tag,
                  SynthMagnitudes magnitudes = SynthMagnitudes::unit) {
  SynthSpec spec = synth_preset(preset);
  spec.seed = seed;
  spec.magnitudes = magnitudes;
  const std::string dir = test::temp_dir(tag);
  const SynthResult r = write_synthetic_checkpoint(spec, dir, false);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(dir)) on_disk += e.file_size();
  EXPECT_EQ(r.bytes, on_disk) << "SynthResult::bytes counts every file written";
  return dir;
}

// Runs parity-synth --preset tiny into `out` under a file size limit of `bytes` (RLIMIT_FSIZE
// with SIGXFSZ ignored: a write past it fails with EFBIG, as one on a full disk fails with
// ENOSPC, and no privilege or small file system is needed). Fork and exec only: the child calls
// nothing but async-signal-safe functions before exec.
test::ToolResult synth_with_file_size_limit(uint64_t bytes, const std::string& out) {
  const std::string bin = std::string(PARITY_BIN_DIR) + "/parity-synth";
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, bytes};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::execl(bin.c_str(), bin.c_str(), "--preset", "tiny", "--out", out.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  test::ToolResult r;
  char buffer[4096];
  for (ssize_t got; (got = ::read(fds[0], buffer, sizeof buffer)) > 0;) r.output.append(buffer, size_t(got));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A write that fails (a full disk) is one line naming the file and errno's text, and leaves
// nothing: neither the partial file being written nor the shards written before it. Limits at
// the start of a shard (its header), inside the first shard, and past the first shard.
TEST(Synth, AFailedWriteLeavesNoFileBehind) {
  const std::string full = synth("tiny", 0, "synth-sizes");
  uint64_t largest = 0;
  for (const auto& e : fs::directory_iterator(full))
    if (e.path().extension() == ".safetensors") largest = std::max<uint64_t>(largest, e.file_size());
  ASSERT_GT(largest, 8192u);
  for (const uint64_t limit : {uint64_t(0), uint64_t(4096), largest - 1}) {
    const std::string out = test::temp_dir("synth-limited");
    const test::ToolResult r = synth_with_file_size_limit(limit, out);
    EXPECT_EQ(r.exit_code, 2) << limit << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(".safetensors: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("18446744073709551615"), std::string::npos) << r.output;
    std::string left;
    for (const auto& e : fs::directory_iterator(out)) left += " " + e.path().filename().string();
    EXPECT_EQ(left, "") << "limit " << limit << ": left behind:" << left;
  }
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

TEST(Synth, UnitMagnitudesAreTheDefaultAndTheGoldenBytes) {
  EXPECT_EQ(SynthSpec{}.magnitudes, SynthMagnitudes::unit);
  EXPECT_EQ(synth_preset("tiny").magnitudes, SynthMagnitudes::unit);
  EXPECT_EQ(synth_preset("20b").magnitudes, SynthMagnitudes::unit);
  EXPECT_TRUE(synth_outliers(synth_preset("tiny")).empty());

  // Written without naming the magnitudes (as tools/common.cpp and every earlier caller do)
  // and with unit named: the same files, and config.json says nothing of magnitudes, as before
  // the choice existed.
  SynthSpec named = synth_preset("tiny");
  named.magnitudes = SynthMagnitudes::unit;
  const std::string named_dir = test::temp_dir("synth-unit-named");
  write_synthetic_checkpoint(named, named_dir, false);
  const auto by_default = read_dir(test::tiny_model_dir()), by_name = read_dir(named_dir);
  ASSERT_EQ(by_default.size(), by_name.size());
  for (const auto& [name, bytes] : by_default) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(bytes == by_name.at(name))
        << name << " differs between the default and explicit unit";
  }
  const auto config = nlohmann::json::parse(by_default.at("config.json"));
  EXPECT_FALSE(config.at("parity_synth").contains("magnitudes"))
      << config.at("parity_synth").dump();

  // The golden logits (golden/tiny) were made from these bytes: its manifest records the
  // checkpoint's fingerprint (parity-golden update), a hash of every byte of the checkpoint, so
  // any change of a scale or a stream moves it.
  std::ifstream manifest_file(std::string(PARITY_SOURCE_DIR) + "/golden/tiny/manifest.json");
  ASSERT_TRUE(manifest_file) << "golden/tiny/manifest.json";
  const auto manifest = nlohmann::json::parse(manifest_file);
  EXPECT_EQ(TensorStore(test::tiny_model_dir()).fingerprint(),
            manifest.at("checkpoint_fingerprint").get<std::string>())
      << "the unit tiny preset no longer has the bytes golden/tiny was made from";
}

TEST(Synth, MagnitudeNames) {
  for (auto m : {SynthMagnitudes::unit, SynthMagnitudes::realistic})
    EXPECT_EQ(parse_synth_magnitudes(synth_magnitudes_name(m)), m);
  EXPECT_EQ(synth_magnitudes_name(SynthMagnitudes::realistic), "realistic");
  EXPECT_THROW(parse_synth_magnitudes("huge"), Error);
}

TEST(Synth, RealisticIsDeterministicAndRecorded) {
  const auto a = read_dir(synth("tiny", 5, "synth-real-a", SynthMagnitudes::realistic));
  const auto b = read_dir(synth("tiny", 5, "synth-real-b", SynthMagnitudes::realistic));
  const auto unit = read_dir(synth("tiny", 5, "synth-real-unit"));
  ASSERT_EQ(a.size(), 4u);
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b.at(name))
        << name << " differs between two realistic runs with the same seed";
    if (name == "model.safetensors.index.json") continue;  // the same names and sizes as unit's
    EXPECT_FALSE(bytes == unit.at(name)) << name << " is the same as with unit magnitudes";
  }
  const auto config = nlohmann::json::parse(a.at("config.json"));
  EXPECT_EQ(config.at("parity_synth").at("magnitudes"), "realistic");

  // The outlier channels: distinct, inside the hidden size, fixed by the seed.
  SynthSpec spec = synth_preset("tiny");
  spec.seed = 5;
  spec.magnitudes = SynthMagnitudes::realistic;
  const auto outliers = synth_outliers(spec);
  ASSERT_EQ(outliers.size(), 3u);
  std::set<int> channels;
  for (const auto& o : outliers) {
    EXPECT_GE(o.channel, 0);
    EXPECT_LT(o.channel, spec.config.hidden_size);
    EXPECT_GE(std::fabs(o.value), 100.0);
    channels.insert(o.channel);
  }
  EXPECT_EQ(channels.size(), outliers.size());
  const auto again = synth_outliers(spec);
  for (size_t i = 0; i < outliers.size(); ++i) EXPECT_EQ(again[i].channel, outliers[i].channel);
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

// Everything the realistic checks below read from one reference forward: per layer the largest
// |x| of each residual channel, the clamp on both halves, the routing, the sinks' share and the
// largest key probability, the spread of the router logits and of the scores; non-finite values
// anywhere (the masked scores' -inf excepted).
struct RealisticFigures : Observer {
  explicit RealisticFigures(const Config& c)
      : c(c),
        resid_max(size_t(c.num_hidden_layers), std::vector<double>(size_t(c.hidden_size))),
        attn_resid_max(size_t(c.num_hidden_layers), std::vector<double>(size_t(c.hidden_size))),
        selections(size_t(c.num_hidden_layers), std::vector<int>(size_t(c.num_local_experts))) {}
  bool wants(int, int, Stage) const override { return true; }
  void record(const StageKey& key, const StageData& d) override {
    for (size_t i = 0; i < d.size(); ++i) {
      const double v = d.at(i);
      if (!std::isfinite(v) && !(key.stage == Stage::scores && v == -INFINITY)) ++non_finite;
    }
    switch (key.stage) {
      case Stage::embedding:
        for (size_t i = 0; i < d.size(); ++i) embed_sq += d.at(i) * d.at(i);
        embed_n += d.size();
        break;
      case Stage::resid_attn:
      case Stage::resid_ffn: {
        auto& m =
            (key.stage == Stage::resid_ffn ? resid_max : attn_resid_max).at(size_t(key.layer));
        for (size_t i = 0; i < d.size(); ++i) m[i] = std::max(m[i], std::fabs(d.at(i)));
        break;
      }
      case Stage::mlp1:  // interleaved: even = gate, odd = linear
        for (size_t i = 0; i < d.size(); i += 2) {
          ++gate_n;
          gate_over += d.at(i) > c.swiglu_limit;
          lin_over += d.at(i + 1) > c.swiglu_limit;
          lin_under += d.at(i + 1) < -c.swiglu_limit;
        }
        break;
      case Stage::topk_idx:
        for (size_t i = 0; i < d.size(); ++i)
          ++selections.at(size_t(key.layer)).at(size_t(d.at(i)));
        break;
      case Stage::router:
        router_sd.push_back(sd(d, 0, d.size()));
        break;
      case Stage::scores: {  // [nH, pos + 2]: the visible keys' spread, per head
        const size_t cols = d.dims.at(1);
        if (cols > 3)
          for (size_t h = 0; h < d.dims.at(0); ++h)
            score_sd.push_back(sd(d, h * cols, h * cols + cols - 1));
        break;
      }
      case Stage::att: {
        const size_t cols = d.dims.at(1);
        for (size_t h = 0; h < d.dims.at(0); ++h) {
          sink_share += d.at(h * cols + cols - 1);
          double top = 0;
          for (size_t j = 0; j + 1 < cols; ++j) top = std::max(top, d.at(h * cols + j));
          key_max += top;
          ++att_rows;
        }
        break;
      }
      default:
        break;
    }
  }
  // Standard deviation of the finite elements [begin, end).
  static double sd(const StageData& d, size_t begin, size_t end) {
    double sum = 0, sq = 0;
    int n = 0;
    for (size_t i = begin; i < end; ++i)
      if (std::isfinite(d.at(i))) {
        sum += d.at(i);
        sq += d.at(i) * d.at(i);
        ++n;
      }
    const double mean = sum / n;
    return std::sqrt(std::max(0.0, sq / n - mean * mean));
  }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
  }

  const Config& c;
  std::vector<std::vector<double>> resid_max, attn_resid_max;
  std::vector<std::vector<int>> selections;
  std::vector<double> router_sd, score_sd;
  double embed_sq = 0, sink_share = 0, key_max = 0;
  size_t embed_n = 0, att_rows = 0, non_finite = 0;
  size_t gate_n = 0, gate_over = 0, lin_over = 0, lin_under = 0;
};

TEST(Synth, RealisticMagnitudesThroughTheReference) {
  SynthSpec spec = synth_preset("tiny");
  spec.magnitudes = SynthMagnitudes::realistic;
  const std::string dir = test::temp_dir("synth-realistic");
  write_synthetic_checkpoint(spec, dir, false);
  const auto m = Model::load(dir);
  const Config& c = m->config;
  EXPECT_EQ(c.to_json(), spec.config.to_json()) << "realistic magnitudes keep the preset's shapes";
  const std::vector<SynthOutlier> outliers = synth_outliers(spec);
  ASSERT_FALSE(outliers.empty());
  std::vector<bool> is_outlier(size_t(c.hidden_size), false);
  for (const auto& o : outliers) is_outlier.at(size_t(o.channel)) = true;

  // The weights as stored: norm weights large and spread but never negative, small on the
  // outlier channels wherever the norm sees them; sinks and q/k/v biases of several units.
  auto values = [](const TensorView& t) {
    std::vector<double> v(size_t(t.numel()));
    read_vector(t, v.data());
    return v;
  };
  double norm_sum = 0, norm_max = 0, norm_min = 1e9;
  size_t norm_n = 0;
  std::vector<const TensorView*> norms = {m->final_norm};
  for (const auto& l : m->layers) norms.insert(norms.end(), {l.attn_norm, l.ffn_norm});
  for (const TensorView* t : norms)
    for (double w : values(*t)) {
      norm_sum += w;
      norm_max = std::max(norm_max, w);
      norm_min = std::min(norm_min, w);
      ++norm_n;
    }
  EXPECT_GT(norm_sum / double(norm_n), 1.5) << "norm weights' mean";
  EXPECT_LT(norm_sum / double(norm_n), 4.0) << "norm weights' mean";
  EXPECT_GT(norm_max, 4.0) << "norm weights spread well above their mean";
  EXPECT_GE(norm_min, 0.0) << "no negative norm weight";
  for (size_t l = 1; l < m->layers.size(); ++l)
    for (const TensorView* t : {m->layers[l].attn_norm, m->layers[l].ffn_norm}) {
      const auto w = values(*t);
      for (const auto& o : outliers) {
        EXPECT_LT(w.at(size_t(o.channel)), 0.1) << "layer " << l << " channel " << o.channel;
      }
    }
  double sink_sum = 0, sink_sq = 0, qkv_bias_sq = 0;
  size_t sink_n = 0, qkv_bias_n = 0;
  for (const auto& l : m->layers) {
    for (double s : values(*l.sinks)) {
      sink_sum += s;
      sink_sq += s * s;
      ++sink_n;
    }
    for (const TensorView* b : {l.q.bias, l.k.bias, l.v.bias})
      for (double x : values(*b)) {
        qkv_bias_sq += x * x;
        ++qkv_bias_n;
      }
  }
  const double sink_mean = sink_sum / double(sink_n);
  EXPECT_GT(sink_mean, 1.0);
  EXPECT_LT(sink_mean, 3.0);
  EXPECT_GT(std::sqrt(sink_sq / double(sink_n) - sink_mean * sink_mean), 0.8) << "sinks' spread";
  const double qkv_bias_rms = std::sqrt(qkv_bias_sq / double(qkv_bias_n));
  EXPECT_GT(qkv_bias_rms, 0.4);
  EXPECT_LT(qkv_bias_rms, 1.0);

  // The reference over 20 positions (past the sliding window of 8).
  constexpr int kPositions = 20;
  auto backend = make_reference_backend(*m);
  Batch batch;
  for (int p = 0; p < kPositions; ++p) {
    batch.tokens.push_back(int32_t((1 + 7919ull * uint64_t(p)) % uint64_t(c.vocab_size)));
    batch.positions.push_back(p);
    batch.seqs.push_back(0);
  }
  RealisticFigures fig(c);
  forward(*backend, batch, &fig);

  EXPECT_EQ(fig.non_finite, 0u);
  const double embed_rms = std::sqrt(fig.embed_sq / double(fig.embed_n));
  EXPECT_LT(embed_rms, 0.1);
  EXPECT_GT(embed_rms, 0.01);
  // Massive activations: in the hundreds on exactly the designed channels from layer 1 on
  // (after either branch), half of it already after layer 0; every other channel O(1).
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (const auto& o : outliers) {
      const double ffn = fig.resid_max[size_t(l)][size_t(o.channel)];
      const double attn = fig.attn_resid_max[size_t(l)][size_t(o.channel)];
      if (l >= 1) {
        EXPECT_GT(ffn, 50.0) << "layer " << l << " channel " << o.channel;
        EXPECT_GT(attn, 50.0) << "layer " << l << " channel " << o.channel;
        EXPECT_NEAR(ffn, std::fabs(o.value), 0.2 * std::fabs(o.value))
            << "layer " << l << " channel " << o.channel;
      } else {
        EXPECT_NEAR(ffn, 0.5 * std::fabs(o.value), 0.2 * std::fabs(o.value))
            << "channel " << o.channel;
      }
    }
    for (int ch = 0; ch < c.hidden_size; ++ch) {
      if (is_outlier[size_t(ch)]) continue;
      EXPECT_LT(fig.resid_max[size_t(l)][size_t(ch)], 20.0) << "layer " << l << " channel " << ch;
    }
  }
  // The stages after the outlier-dominated norms still carry signal: router logits and scores
  // spread, the clamp engaged on both halves, every expert used, attention neither uniform nor
  // one-hot, the sinks taking a share.
  EXPECT_GT(RealisticFigures::mean(fig.router_sd), 0.7);
  EXPECT_GT(RealisticFigures::mean(fig.score_sd), 0.7);
  const double gate = double(fig.gate_over) / double(fig.gate_n);
  const double lin = double(fig.lin_over + fig.lin_under) / double(fig.gate_n);
  EXPECT_GT(fig.gate_over, 0u);
  EXPECT_GT(fig.lin_over, 0u) << "linear half clamped from above";
  EXPECT_GT(fig.lin_under, 0u) << "linear half clamped from below";
  EXPECT_GT(gate, 0.002);
  EXPECT_LT(gate, 0.2);
  EXPECT_GT(lin, 0.002);
  EXPECT_LT(lin, 0.2);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (int e = 0; e < c.num_local_experts; ++e) {
      const int n = fig.selections[size_t(l)][size_t(e)];
      EXPECT_GT(n, 0) << "layer " << l << " never routes to expert " << e;
      EXPECT_LT(n, kPositions) << "layer " << l << " routes every position to expert " << e;
    }
  const double sink = fig.sink_share / double(fig.att_rows),
               key_max = fig.key_max / double(fig.att_rows);
  EXPECT_GT(sink, 0.05);
  EXPECT_LT(sink, 0.9);
  EXPECT_GT(key_max, 0.15) << "attention close to uniform";
  EXPECT_LT(key_max, 0.9) << "attention close to one-hot";
}

TEST(Synth, RealisticWorksForCustomShapes) {
  // One layer (only half of each outlier pushed), a hidden size of 32 and a single expert per
  // token: the plan still builds, loads and runs to finite logits.
  SynthSpec spec = synth_preset("tiny");
  spec.magnitudes = SynthMagnitudes::realistic;
  spec.preset = "custom";
  spec.config.hidden_size = 32;
  spec.config.num_hidden_layers = 1;
  spec.config.layer_is_sliding = {true};
  spec.config.num_experts_per_tok = 1;
  spec.shards = 1;
  const std::string dir = test::temp_dir("synth-realistic-custom");
  write_synthetic_checkpoint(spec, dir, false);
  const auto m = Model::load(dir);
  auto backend = make_reference_backend(*m);
  RealisticFigures fig(m->config);
  forward(*backend, Batch{{1, 2, 3}, {0, 1, 2}, {0, 0, 0}}, &fig);
  EXPECT_EQ(fig.non_finite, 0u);
  for (const auto& o : synth_outliers(spec))
    EXPECT_GT(fig.resid_max[0][size_t(o.channel)], 0.25 * std::fabs(o.value)) << o.channel;
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
