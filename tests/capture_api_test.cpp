// The capture library's C API (capture/parity_capture.h): every stage recorded from the
// reference's own rows in the layouts ports use comes back in ours exactly; every bad record is
// refused at the call with a message naming the file, stage, layer and position; close() writes
// nothing after a refusal or with an incomplete row; a null handle is a no-op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "model/checkpoint.h"
#include "model/forward.h"
#include "model/numerics.h"
#include "parity_capture.h"
#include "tests/test_util.h"
#include "tools/common.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::as_float;

constexpr int kTokens = 5;
const int32_t kTokenIds[kTokens] = {7, 1, 500, 3, 42};

// The reference's output rows of the tiny model on kTokenIds, by (position, layer, stage).
class Collector final : public Observer {
 public:
  bool wants(int, int, Stage) const override { return true; }
  void record(const StageKey& k, const StageData& d) override {
    rows[{k.position, k.layer, k.stage}] = d;
  }
  std::map<std::tuple<int, int, Stage>, StageData> rows;
};

const Collector& reference_rows() {
  static const Collector rows = [] {
    Collector c;
    const auto m = Model::load(test::tiny_model_dir());
    auto ref = make_backend("reference", *m);
    Batch b;
    for (int i = 0; i < kTokens; ++i) {
      b.tokens.push_back(kTokenIds[i]);
      b.positions.push_back(i);
      b.seqs.push_back(0);
    }
    forward(*ref, b, &c);
    return c;
  }();
  return rows;
}

struct CaptureFile {
  std::string dir = test::temp_dir("capture");
  std::string path = dir + "/port.h5";
};

parity_capture* open_capture(const std::string& path, const char* precision = "float32") {
  parity_capture* cap = nullptr;
  const parity_capture_options o{"test-port", precision, "no device"};
  EXPECT_EQ(parity_capture_open(&cap, path.c_str(), test::tiny_model_dir().c_str(), kTokenIds,
                                kTokens, &o),
            PARITY_CAPTURE_OK)
      << parity_capture_last_error();
  return cap;
}

int record(parity_capture* cap, const char* stage, int pos, int layer, const std::vector<float>& v,
           unsigned layout = PARITY_LAYOUT_DEFAULT, int slot = PARITY_CAPTURE_ALL_SLOTS) {
  return parity_capture_record(cap, stage, pos, layer, slot, v.data(), PARITY_CAPTURE_F32, v.size(),
                               layout);
}

// Each head of d values from half-split pairs (i, i + d/2) to interleaved pairs (2i, 2i + 1).
std::vector<float> to_interleaved(const std::vector<float>& v, size_t d, size_t end) {
  std::vector<float> out = v;
  for (size_t h = 0; h + d <= end; h += d)
    for (size_t i = 0; i < d / 2; ++i) {
      out[h + 2 * i] = v[h + i];
      out[h + 2 * i + 1] = v[h + d / 2 + i];
    }
  return out;
}

TEST(CaptureApi, EveryStageInPortLayoutsComesBackInOursExactly) {
  const Collector& ref = reference_rows();
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  const size_t d = size_t(c.head_dim), q = size_t(c.q_dim()), kv = size_t(c.kv_dim()),
               I = size_t(c.intermediate_size);
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  for (const auto& [key, row] : ref.rows) {
    const auto [pos, layer, s] = key;
    const char* n = info(s).name.data();
    std::vector<float> v = as_float(row);
    switch (s) {
      case Stage::qkv: {  // three parts, q and k in interleaved RoPE pairs
        const std::vector<float> qp(v.begin(), v.begin() + std::ptrdiff_t(q)),
            kp(v.begin() + std::ptrdiff_t(q), v.begin() + std::ptrdiff_t(q + kv)),
            vp(v.begin() + std::ptrdiff_t(q + kv), v.end());
        ASSERT_EQ(record(cap, n, pos, layer, to_interleaved(kp, d, kv),
                         PARITY_LAYOUT_QKV_K | PARITY_LAYOUT_ROPE_INTERLEAVED),
                  0)
            << parity_capture_last_error();
        ASSERT_EQ(record(cap, n, pos, layer, vp, PARITY_LAYOUT_QKV_V), 0)
            << parity_capture_last_error();
        ASSERT_EQ(record(cap, n, pos, layer, to_interleaved(qp, d, q),
                         PARITY_LAYOUT_QKV_Q | PARITY_LAYOUT_ROPE_INTERLEAVED),
                  0)
            << parity_capture_last_error();
        break;
      }
      case Stage::q_rope:
      case Stage::k_rope:
        ASSERT_EQ(record(cap, n, pos, layer, to_interleaved(v, d, v.size()),
                         PARITY_LAYOUT_ROPE_INTERLEAVED),
                  0)
            << parity_capture_last_error();
        break;
      case Stage::scores: {  // the sink first
        const size_t cols = size_t(pos) + 2;
        std::vector<float> w(v.size());
        for (size_t h = 0; h < v.size() / cols; ++h) {
          w[h * cols] = v[h * cols + cols - 1];
          for (size_t j = 0; j + 1 < cols; ++j) w[h * cols + 1 + j] = v[h * cols + j];
        }
        ASSERT_EQ(record(cap, n, pos, layer, w, PARITY_LAYOUT_SINK_FIRST), 0)
            << parity_capture_last_error();
        break;
      }
      case Stage::att: {  // without the sink's column, as float64
        const size_t cols = size_t(pos) + 2;
        std::vector<double> w;
        for (size_t h = 0; h < v.size() / cols; ++h)
          for (size_t j = 0; j + 1 < cols; ++j) w.push_back(row.f64[h * cols + j]);
        ASSERT_EQ(parity_capture_record(cap, n, pos, layer, -1, w.data(), PARITY_CAPTURE_F64,
                                        w.size(), PARITY_LAYOUT_NO_SINK),
                  0)
            << parity_capture_last_error();
        break;
      }
      case Stage::mlp1:  // one slot at a time, gate and linear as halves, in reverse slot order
        for (size_t slot = size_t(c.num_experts_per_tok); slot-- > 0;) {
          std::vector<float> halves(2 * I);
          for (size_t j = 0; j < I; ++j) {
            halves[j] = v[slot * 2 * I + 2 * j];
            halves[I + j] = v[slot * 2 * I + 2 * j + 1];
          }
          ASSERT_EQ(record(cap, n, pos, layer, halves, PARITY_LAYOUT_GATE_UP_HALVES, int(slot)), 0)
              << parity_capture_last_error();
        }
        break;
      case Stage::swiglu: {  // bfloat16
        std::vector<uint16_t> b(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
        ASSERT_EQ(parity_capture_record(cap, n, pos, layer, -1, b.data(), PARITY_CAPTURE_BF16,
                                        b.size(), 0),
                  0)
            << parity_capture_last_error();
        break;
      }
      case Stage::topk_idx:
      case Stage::sampled:
        ASSERT_EQ(parity_capture_record(cap, n, pos, layer, -1, row.i32.data(), PARITY_CAPTURE_I32,
                                        row.i32.size(), 0),
                  0)
            << parity_capture_last_error();
        break;
      default:
        ASSERT_EQ(record(cap, n, pos, layer, v), 0) << parity_capture_last_error();
    }
  }
  EXPECT_FALSE(fs::exists(f.path)) << "the capture appears only when closed";
  ASSERT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK) << parity_capture_last_error();
  ASSERT_TRUE(fs::exists(f.path));

  const TraceReader r(f.path);
  EXPECT_EQ(r.meta().backend, "test-port");
  EXPECT_EQ(r.meta().fingerprint, m->fingerprint);
  EXPECT_EQ(r.meta().tokens, std::vector<int32_t>(kTokenIds, kTokenIds + kTokens));
  EXPECT_EQ(r.entries().size(), ref.rows.size());
  for (const auto& [key, row] : ref.rows) {
    const auto [pos, layer, s] = key;
    const StageData got = r.read(trace_dataset_path(pos, layer, s));
    ASSERT_EQ(got.dims, row.dims) << name(s);
    for (size_t i = 0; i < got.size(); ++i) {
      double want = float(row.at(i));
      if (s == Stage::swiglu) want = bf16_to_float(float_to_bf16(float(row.at(i))));
      if (s == Stage::att) want = row.at(i);  // recorded as float64 (the sink: 1 - the keys' sum)
      if (s == Stage::att && (i + 1) % (size_t(pos) + 2) == 0) {
        ASSERT_NEAR(got.at(i), row.at(i), 1e-14) << "sink column of att at position " << pos;
        continue;
      }
      ASSERT_EQ(got.at(i), want) << name(s) << " layer " << layer << " position " << pos
                                 << " element " << i;
    }
    EXPECT_EQ(got.type == StageData::Type::F64, s == Stage::att) << name(s);
  }

  // The tool diffs it: every stage captured, all within the bf16 profile (swiglu went through
  // bfloat16).
  const auto t =
      test::run_tool("parity-trace", "--model " + test::tiny_model_dir() + " --candidate-trace " +
                                         f.path + " --profile bf16 --out " + f.dir + "/out");
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("PASS"), std::string::npos) << t.output;
  EXPECT_EQ(t.output.find("not captured"), std::string::npos) << t.output;
}

// Refusals: the code, and a message naming the file, stage, layer and position.
TEST(CaptureApi, BadRecordsAreRefusedAtTheCall) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  const std::vector<float> hidden(size_t(c.hidden_size), 0.5f);
  const auto refused = [&](int rc, int want, std::vector<std::string> words) {
    EXPECT_EQ(rc, want) << parity_capture_last_error();
    const std::string msg = parity_capture_last_error();
    words.push_back(f.path);
    for (const auto& w : words)
      EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  refused(record(cap, "attn_nrom", 1, 0, hidden), PARITY_CAPTURE_ERR_STAGE,
          {"unknown stage", "attn_nrom", "attn_norm"});
  refused(record(cap, "attn_norm", 2, 1, std::vector<float>(size_t(c.hidden_size) - 1)),
          PARITY_CAPTURE_ERR_SHAPE, {"stage attn_norm, layer 1, position 2", "63 values", "64"});
  refused(record(cap, "q_rope", 3, 0, std::vector<float>(60)), PARITY_CAPTURE_ERR_SHAPE,
          {"stage q_rope, layer 0, position 3", "[4, 16]"});
  refused(record(cap, "scores", 3, 0, std::vector<float>(4 * 4)), PARITY_CAPTURE_ERR_SHAPE,
          {"[4, 5]"});
  refused(record(cap, "embedding", 0, 0, hidden), PARITY_CAPTURE_ERR_STAGE,
          {"model-scope", "layer -1"});
  refused(record(cap, "attn_norm", 0, c.num_hidden_layers, hidden), PARITY_CAPTURE_ERR_STAGE,
          {"layers 0..3"});
  refused(record(cap, "attn_norm", kTokens, 0, hidden), PARITY_CAPTURE_ERR_STAGE,
          {"positions 0..4", "position 5"});
  refused(record(cap, "attn_norm", 0, 0, hidden, PARITY_LAYOUT_DEFAULT, 1),
          PARITY_CAPTURE_ERR_STAGE, {"expert slots"});
  refused(record(cap, "mlp1", 0, 0, std::vector<float>(128), PARITY_LAYOUT_DEFAULT,
                 c.num_experts_per_tok),
          PARITY_CAPTURE_ERR_STAGE, {"slots are 0..3"});
  refused(record(cap, "attn_norm", 0, 0, hidden, PARITY_LAYOUT_SINK_FIRST),
          PARITY_CAPTURE_ERR_ARGUMENT, {"SINK_FIRST does not apply to stage attn_norm"});
  refused(record(cap, "scores", 0, 0, std::vector<float>(4 * 1), PARITY_LAYOUT_NO_SINK),
          PARITY_CAPTURE_ERR_ARGUMENT, {"NO_SINK does not apply to stage scores"});
  refused(
      record(cap, "qkv", 0, 0, std::vector<float>(64), PARITY_LAYOUT_QKV_Q | PARITY_LAYOUT_QKV_K),
      PARITY_CAPTURE_ERR_ARGUMENT, {"one qkv part"});
  refused(record(cap, "qkv", 0, 1, std::vector<float>(32),
                 PARITY_LAYOUT_QKV_V | PARITY_LAYOUT_ROPE_INTERLEAVED),
          PARITY_CAPTURE_ERR_ARGUMENT, {"stage qkv, layer 1, position 0", "v part"});
  const int32_t ints[64] = {};
  refused(parity_capture_record(cap, "attn_norm", 0, 0, -1, ints, PARITY_CAPTURE_I32, 64, 0),
          PARITY_CAPTURE_ERR_ARGUMENT, {"real values"});
  refused(record(cap, "topk_idx", 0, 0, std::vector<float>(4)), PARITY_CAPTURE_ERR_ARGUMENT,
          {"int32"});
  const int32_t bad_experts[4] = {0, 1, 2, 8};
  refused(parity_capture_record(cap, "topk_idx", 0, 0, -1, bad_experts, PARITY_CAPTURE_I32, 4, 0),
          PARITY_CAPTURE_ERR_SHAPE, {"element 3 is 8"});
  refused(parity_capture_record(cap, "attn_norm", 0, 0, -1, hidden.data(), parity_capture_dtype(9),
                                64, 0),
          PARITY_CAPTURE_ERR_ARGUMENT, {"unknown dtype"});
  refused(parity_capture_record(cap, "attn_norm", 0, 0, -1, hidden.data(),
                                parity_capture_dtype(-3), 64, 0),
          PARITY_CAPTURE_ERR_ARGUMENT, {"unknown dtype"});
  // A duplicate: a whole row, a slot, a part; and a whole row over recorded slots.
  ASSERT_EQ(record(cap, "attn_norm", 4, 2, hidden), 0) << parity_capture_last_error();
  refused(record(cap, "attn_norm", 4, 2, hidden), PARITY_CAPTURE_ERR_DUPLICATE,
          {"stage attn_norm, layer 2, position 4", "twice"});
  ASSERT_EQ(record(cap, "mlp1", 1, 1, std::vector<float>(128), PARITY_LAYOUT_DEFAULT, 2), 0)
      << parity_capture_last_error();
  refused(record(cap, "mlp1", 1, 1, std::vector<float>(128), PARITY_LAYOUT_DEFAULT, 2),
          PARITY_CAPTURE_ERR_DUPLICATE, {"slot 2", "twice"});
  refused(record(cap, "mlp1", 1, 1, std::vector<float>(4 * 128)), PARITY_CAPTURE_ERR_DUPLICATE,
          {"recorded whole"});
  ASSERT_EQ(record(cap, "qkv", 0, 3, std::vector<float>(32), PARITY_LAYOUT_QKV_V), 0)
      << parity_capture_last_error();
  refused(record(cap, "qkv", 0, 3, std::vector<float>(32), PARITY_LAYOUT_QKV_V),
          PARITY_CAPTURE_ERR_DUPLICATE, {"part of qkv recorded twice"});
  // close() writes nothing after refusals.
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_NE(std::string(parity_capture_last_error()).find("were refused; the first: capture"),
            std::string::npos)
      << parity_capture_last_error();
  EXPECT_FALSE(fs::exists(f.path));
  for (const auto& e : fs::directory_iterator(f.dir)) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(CaptureApi, AnIncompleteRowIsNotWritten) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  ASSERT_EQ(record(cap, "swiglu", 2, 1, std::vector<float>(64), PARITY_LAYOUT_DEFAULT, 0), 0);
  ASSERT_EQ(record(cap, "swiglu", 2, 1, std::vector<float>(64), PARITY_LAYOUT_DEFAULT, 2), 0);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  const std::string msg = parity_capture_last_error();
  EXPECT_NE(
      msg.find("stage swiglu, layer 1, position 2: incomplete: expert slot(s) 1, 3 never recorded"),
      std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(f.path));
}

TEST(CaptureApi, TokensAppendedAsAPortGeneratesThem) {
  CaptureFile f;
  parity_capture* cap = nullptr;
  const parity_capture_options o{"generating-port", "float32", nullptr};
  ASSERT_EQ(parity_capture_open(&cap, f.path.c_str(), test::tiny_model_dir().c_str(), kTokenIds, 3, &o),
            PARITY_CAPTURE_OK)
      << parity_capture_last_error();
  const std::vector<float> e = as_float(reference_rows().rows.at({3, kModelLayer, Stage::embedding}));
  // Position 3 is past the prompt until its token is appended.
  EXPECT_EQ(record(cap, "embedding", 3, -1, e), PARITY_CAPTURE_ERR_STAGE);
  const int32_t bad[] = {kTokenIds[3], 1024};
  EXPECT_EQ(parity_capture_append_tokens(cap, bad, 2), PARITY_CAPTURE_ERR_MODEL);
  EXPECT_NE(std::string(parity_capture_last_error()).find("token id 1024 at position 4"),
            std::string::npos)
      << parity_capture_last_error();
  parity_capture_abandon(&cap);  // the refused record above leaves nothing to write

  ASSERT_EQ(parity_capture_open(&cap, f.path.c_str(), test::tiny_model_dir().c_str(), kTokenIds, 3, &o),
            PARITY_CAPTURE_OK);
  for (int p = 0; p < kTokens; ++p) {
    if (p >= 3) {
      ASSERT_EQ(parity_capture_append_tokens(cap, &kTokenIds[p], 1), PARITY_CAPTURE_OK);
    }
    ASSERT_EQ(record(cap, "embedding", p, -1,
                     as_float(reference_rows().rows.at({p, kModelLayer, Stage::embedding}))),
              PARITY_CAPTURE_OK)
        << parity_capture_last_error();
  }
  ASSERT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK) << parity_capture_last_error();
  const TraceReader t(f.path);
  EXPECT_EQ(t.meta().tokens, std::vector<int32_t>(kTokenIds, kTokenIds + kTokens));
  EXPECT_EQ(t.meta().positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(parity_capture_append_tokens(nullptr, nullptr, 7), PARITY_CAPTURE_OK);
}

TEST(CaptureApi, CacheRowsAreCheckedAtTheCall) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  const std::vector<float> kv(2 * 2 * 16, 0.5f);  // 2 positions of [nKV 2, d 16]
  const auto msg = [] { return std::string(parity_capture_last_error()); };
  EXPECT_EQ(parity_capture_record_cache(cap, 4, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_ERR_STAGE);
  EXPECT_NE(msg().find("cache of layer 4: the model has layers 0..3"), std::string::npos) << msg();
  EXPECT_EQ(parity_capture_record_cache(cap, 0, 2, kv.data(), kv.data(), PARITY_CAPTURE_I32, 0),
            PARITY_CAPTURE_ERR_ARGUMENT);
  EXPECT_EQ(parity_capture_record_cache(cap, 0, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32,
                                        PARITY_LAYOUT_SINK_FIRST),
            PARITY_CAPTURE_ERR_ARGUMENT);
  EXPECT_NE(msg().find("layout SINK_FIRST does not apply to cache rows"), std::string::npos) << msg();
  EXPECT_EQ(parity_capture_record_cache(cap, 0, 6, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_ERR_SHAPE);
  EXPECT_NE(msg().find("6 rows, but the capture has 5 tokens"), std::string::npos) << msg();
  EXPECT_EQ(parity_capture_record_cache(cap, 0, 2, nullptr, kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_ERR_ARGUMENT);
  ASSERT_EQ(parity_capture_record_cache(cap, 0, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_OK)
      << msg();
  EXPECT_EQ(parity_capture_record_cache(cap, 0, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_ERR_DUPLICATE);
  EXPECT_EQ(parity_capture_record_cache(cap, 1, 1, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_ERR_SHAPE);
  EXPECT_NE(msg().find("every layer caches the same positions"), std::string::npos) << msg();
  // Refused records leave nothing to write.
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_FALSE(fs::exists(f.path));
  // A cache for some layers only, or stage rows inside the cached prefix: not written.
  cap = open_capture(f.path);
  ASSERT_EQ(parity_capture_record_cache(cap, 0, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
            PARITY_CAPTURE_OK);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_NE(msg().find("cache rows of layer 1 never recorded"), std::string::npos) << msg();
  cap = open_capture(f.path);
  for (int layer = 0; layer < 4; ++layer)
    ASSERT_EQ(parity_capture_record_cache(cap, layer, 2, kv.data(), kv.data(), PARITY_CAPTURE_F32, 0),
              PARITY_CAPTURE_OK);
  ASSERT_EQ(record(cap, "embedding", 1, -1,
                   as_float(reference_rows().rows.at({1, kModelLayer, Stage::embedding}))),
            PARITY_CAPTURE_OK);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_NE(msg().find("rows at position 1 lie inside the cache prefix 0..1"), std::string::npos) << msg();
  EXPECT_FALSE(fs::exists(f.path));
}

TEST(CaptureApi, ANullHandleIsANoOpAndCopiesNothing) {
  int copies = 0;
  const auto copy = [](void*, const void*, size_t, void* user) {
    ++*static_cast<int*>(user);
    return 0;
  };
  EXPECT_EQ(
      parity_capture_record(nullptr, "nonsense", -1, 99, 7, nullptr, PARITY_CAPTURE_F32, 3, 0xff),
      0);
  EXPECT_EQ(parity_capture_record_copy(nullptr, "embedding", 0, -1, -1, nullptr, PARITY_CAPTURE_F32,
                                       64, 0, copy, &copies),
            0);
  EXPECT_EQ(copies, 0);
  EXPECT_EQ(parity_capture_close(nullptr), 0);
  parity_capture_abandon(nullptr);
  EXPECT_EQ(parity_capture_row_elements(nullptr, "embedding", 0), 0u);
}

TEST(CaptureApi, CopyCallbackFetchesDeviceRowsAfterTheChecks) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  struct Device {
    std::vector<float> memory = std::vector<float>(64, 0.25f);
    int copies = 0;
    bool fail = false;
  } dev;
  const auto copy = [](void* dst, const void* src, size_t bytes, void* user) {
    auto* d = static_cast<Device*>(user);
    ++d->copies;
    if (d->fail) return 7;
    std::memcpy(dst, src, bytes);
    return 0;
  };
  // A wrong count is refused before anything is copied.
  EXPECT_EQ(parity_capture_record_copy(cap, "embedding", 0, -1, -1, dev.memory.data(),
                                       PARITY_CAPTURE_F32, 63, 0, copy, &dev),
            PARITY_CAPTURE_ERR_SHAPE);
  EXPECT_EQ(dev.copies, 0);
  parity_capture_abandon(&cap);
  cap = open_capture(f.path);
  EXPECT_EQ(parity_capture_record_copy(cap, "embedding", 0, -1, -1, dev.memory.data(),
                                       PARITY_CAPTURE_F32, 64, 0, copy, &dev),
            PARITY_CAPTURE_OK)
      << parity_capture_last_error();
  EXPECT_EQ(dev.copies, 1);
  dev.fail = true;
  EXPECT_EQ(parity_capture_record_copy(cap, "embedding", 1, -1, -1, dev.memory.data(),
                                       PARITY_CAPTURE_F32, 64, 0, copy, &dev),
            PARITY_CAPTURE_ERR_COPY);
  EXPECT_NE(std::string(parity_capture_last_error()).find("copy function failed (code 7)"),
            std::string::npos);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE) << "a failed copy leaves a hole";
  // A clean capture with one copied row.
  dev.fail = false;
  cap = open_capture(f.path);
  ASSERT_EQ(parity_capture_record_copy(cap, "embedding", 3, -1, -1, dev.memory.data(),
                                       PARITY_CAPTURE_F32, 64, 0, copy, &dev),
            PARITY_CAPTURE_OK);
  ASSERT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK) << parity_capture_last_error();
  const TraceReader r(f.path);
  const StageData got = r.read(trace_dataset_path(3, kModelLayer, Stage::embedding));
  EXPECT_EQ(got.type, StageData::Type::F32);
  EXPECT_EQ(got.at(63), 0.25);
}

TEST(CaptureApi, OpenRefusesWhatItCannotUse) {
  CaptureFile f;
  parity_capture* cap = reinterpret_cast<parity_capture*>(&f);
  EXPECT_EQ(parity_capture_open(&cap, f.path.c_str(), (f.dir + "/nowhere").c_str(), kTokenIds,
                                kTokens, nullptr),
            PARITY_CAPTURE_ERR_MODEL);
  EXPECT_EQ(cap, nullptr);
  EXPECT_NE(std::string(parity_capture_last_error()).find(f.path), std::string::npos);
  const int32_t outside[2] = {1, 1024};
  EXPECT_EQ(parity_capture_open(&cap, f.path.c_str(), test::tiny_model_dir().c_str(), outside, 2,
                                nullptr),
            PARITY_CAPTURE_ERR_MODEL);
  EXPECT_NE(std::string(parity_capture_last_error()).find("token id 1024 at position 1"),
            std::string::npos)
      << parity_capture_last_error();
  EXPECT_EQ(parity_capture_open(&cap, f.path.c_str(), test::tiny_model_dir().c_str(), kTokenIds, 0,
                                nullptr),
            PARITY_CAPTURE_ERR_MODEL);
  const parity_capture_options o{nullptr, "float8", nullptr};
  EXPECT_EQ(parity_capture_open(&cap, f.path.c_str(), test::tiny_model_dir().c_str(), kTokenIds,
                                kTokens, &o),
            PARITY_CAPTURE_ERR_ARGUMENT);
  EXPECT_EQ(parity_capture_open(nullptr, f.path.c_str(), test::tiny_model_dir().c_str(), kTokenIds,
                                kTokens, nullptr),
            PARITY_CAPTURE_ERR_ARGUMENT);
  fs::create_directories(f.dir + "/a_directory");
  EXPECT_EQ(parity_capture_open(&cap, (f.dir + "/a_directory").c_str(),
                                test::tiny_model_dir().c_str(), kTokenIds, kTokens, nullptr),
            PARITY_CAPTURE_ERR_IO);
  EXPECT_EQ(cap, nullptr);
}

TEST(CaptureApi, RowElementsFollowTheStageList) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  EXPECT_EQ(parity_capture_row_elements(cap, "scores", 3), 4u * 5u);
  EXPECT_EQ(parity_capture_row_elements(cap, "mlp1", 0), 4u * 128u);
  EXPECT_EQ(parity_capture_row_elements(cap, "qkv", 0), (4u + 2u * 2u) * 16u);
  EXPECT_EQ(parity_capture_row_elements(cap, "no_such_stage", 0), 0u);
  parity_capture_abandon(&cap);
  EXPECT_FALSE(fs::exists(f.path));
}

// The files in a capture's directory: a finished capture and nothing else (no temporary file).
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CaptureApi, CloseAndAbandonClearTheHandleSoASecondCallIsANoOp) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  ASSERT_EQ(record(cap, "embedding", 0, -1, std::vector<float>(64, 1.0f)), PARITY_CAPTURE_OK);
  ASSERT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK) << parity_capture_last_error();
  EXPECT_EQ(cap, nullptr);
  // Under ASan a second close of a freed handle is a use-after-free; here it finds NULL.
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK);
  parity_capture_abandon(&cap);
  EXPECT_EQ(files_in(f.dir), std::vector<std::string>{"port.h5"});
  cap = open_capture(f.path);
  parity_capture_abandon(&cap);
  EXPECT_EQ(cap, nullptr);
  parity_capture_abandon(&cap);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_OK);
  EXPECT_EQ(files_in(f.dir), std::vector<std::string>{"port.h5"}) << "abandon keeps the old file";
}

TEST(CaptureApi, RecordCopyWithoutACopyFunctionIsARefusedRecord) {
  CaptureFile f;
  parity_capture* cap = open_capture(f.path);
  ASSERT_NE(cap, nullptr);
  const std::vector<float> row(64, 0.5f);
  EXPECT_EQ(parity_capture_record_copy(cap, "embedding", 0, -1, -1, row.data(), PARITY_CAPTURE_F32,
                                       64, 0, nullptr, nullptr),
            PARITY_CAPTURE_ERR_ARGUMENT);
  EXPECT_NE(std::string(parity_capture_last_error()).find("without a copy function"),
            std::string::npos)
      << parity_capture_last_error();
  ASSERT_EQ(record(cap, "embedding", 1, -1, row), PARITY_CAPTURE_OK);
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_NE(std::string(parity_capture_last_error()).find("1 record(s) were refused"),
            std::string::npos)
      << parity_capture_last_error();
  EXPECT_TRUE(files_in(f.dir).empty());
}

TEST(CaptureApi, TwoHandlesOnOnePathWriteTheirOwnFilesAndTheLastCloseWins) {
  CaptureFile f;
  const auto embedding_at = [&](int position) {
    const TraceReader r(f.path);
    return r.read(trace_dataset_path(position, kModelLayer, Stage::embedding)).at(0);
  };
  // A second handle opened and abandoned takes nothing from the first.
  parity_capture* a = open_capture(f.path);
  ASSERT_EQ(record(a, "embedding", 0, -1, std::vector<float>(64, 1.0f)), PARITY_CAPTURE_OK);
  parity_capture* b = open_capture(f.path);
  ASSERT_EQ(record(b, "embedding", 0, -1, std::vector<float>(64, 2.0f)), PARITY_CAPTURE_OK);
  parity_capture_abandon(&b);
  ASSERT_EQ(parity_capture_close(&a), PARITY_CAPTURE_OK) << parity_capture_last_error();
  EXPECT_EQ(embedding_at(0), 1.0);
  // Both closed: the file is whole, and the last close's.
  a = open_capture(f.path);
  b = open_capture(f.path);
  ASSERT_EQ(record(a, "embedding", 0, -1, std::vector<float>(64, 3.0f)), PARITY_CAPTURE_OK);
  ASSERT_EQ(record(b, "embedding", 0, -1, std::vector<float>(64, 4.0f)), PARITY_CAPTURE_OK);
  ASSERT_EQ(parity_capture_close(&b), PARITY_CAPTURE_OK) << parity_capture_last_error();
  EXPECT_EQ(embedding_at(0), 4.0);
  ASSERT_EQ(parity_capture_close(&a), PARITY_CAPTURE_OK) << parity_capture_last_error();
  EXPECT_EQ(embedding_at(0), 3.0);
  EXPECT_EQ(files_in(f.dir), std::vector<std::string>{"port.h5"});
}

TEST(CaptureApi, MessagesAreOneLineWhateverThePathHolds) {
  CaptureFile f;
  const std::string path = f.dir + "/port\n\x1b[2J.h5";
  parity_capture* cap = open_capture(path);
  ASSERT_NE(cap, nullptr);
  EXPECT_EQ(record(cap, "embedding", 0, -1, std::vector<float>(63)), PARITY_CAPTURE_ERR_SHAPE);
  const std::string m = parity_capture_last_error();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
  EXPECT_NE(m.find("port\\n\\x1b[2J.h5: stage embedding, position 0"), std::string::npos) << m;
  EXPECT_EQ(parity_capture_close(&cap), PARITY_CAPTURE_ERR_STATE);
  EXPECT_EQ(std::string(parity_capture_last_error()).find('\n'), std::string::npos);
  EXPECT_TRUE(files_in(f.dir).empty());
}

}  // namespace
}  // namespace parity
