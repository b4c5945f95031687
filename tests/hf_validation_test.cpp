// The float64 reference against the official implementation: golden/hf-tiny holds a random
// BF16 GptOss model saved by transformers (dequantized expert layout, rope_parameters config)
// and its float64 logits and per-layer hidden states (tools/hf_validate.py). Our reference must
// match them to 1e-5 relative (transformers takes RoPE angles in float32; see the spec).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <cstring>
#include <map>

#include "model/checkpoint.h"
#include "model/forward.h"
#include "reference/cpu_backend.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

const std::string kDir = std::string(PARITY_SOURCE_DIR) + "/golden/hf-tiny";

struct Collect : Observer {
  std::map<std::string, std::vector<double>> got;  // name -> [position][n]
  bool wants(int, int, Stage s) const override {
    return s == Stage::resid_ffn || s == Stage::final_norm || s == Stage::logits;
  }
  void record(const StageKey& k, const StageData& d) override {
    const std::string n = k.stage == Stage::resid_ffn ? "hidden." + std::to_string(k.layer) : std::string(name(k.stage));
    got[n].insert(got[n].end(), d.f64.begin(), d.f64.end());
  }
};

TEST(HfValidation, ReferenceMatchesTransformersFloat64) {
  ASSERT_TRUE(fs::exists(kDir + "/expected.safetensors"))
      << kDir << " lacks expected.safetensors (regenerate with: python3 tools/hf_validate.py --out golden/hf-tiny)";
  auto m = Model::load(kDir);
  EXPECT_EQ(m->expert_layout, ExpertLayout::DenseInMajor);
  SafetensorsFile expected(kDir + "/expected.safetensors");
  const auto& t = expected.tensors();
  const TensorView& tok = t.at("tokens");
  ASSERT_EQ(tok.dtype, DType::I32);
  Batch b;
  for (int64_t i = 0; i < tok.numel(); ++i) {
    int32_t v;
    std::memcpy(&v, tok.data + 4 * i, 4);
    b.tokens.push_back(v);
    b.positions.push_back(int32_t(i));
    b.seqs.push_back(0);
  }
  ASSERT_GT(b.rows(), m->config.sliding_window) << "the sequence must be longer than the window";
  auto ref = make_reference_backend(*m);
  Collect c;
  forward(*ref, b, &c);

  std::vector<std::string> names = {"logits", "final_norm"};
  for (int l = 0; l < m->config.num_hidden_layers; ++l) names.push_back("hidden." + std::to_string(l));
  for (const auto& n : names) {
    ASSERT_TRUE(t.count(n)) << "expected.safetensors lacks " << n;
    const TensorView& e = t.at(n);
    ASSERT_EQ(e.dtype, DType::F64);
    const auto& got = c.got[n];
    ASSERT_EQ(int64_t(got.size()), e.numel()) << n;
    double max_abs = 0, max_ref = 0;
    for (int64_t i = 0; i < e.numel(); ++i) {
      double want;
      std::memcpy(&want, e.data + 8 * i, 8);
      max_abs = std::max(max_abs, std::fabs(got[size_t(i)] - want));
      max_ref = std::max(max_ref, std::fabs(want));
    }
    const double rel = max_abs / max_ref;
    std::cout << "hf-tiny " << n << ": max |ours - transformers| = " << max_abs << ", relative to max |transformers| "
              << max_ref << ": " << rel << "\n";
    EXPECT_LE(rel, 1e-5) << n;
  }
}

}  // namespace
}  // namespace parity
