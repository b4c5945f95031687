// A gpt-oss checkpoint bound to its config: every tensor located, dtype- and shape-checked, and
// exposed as typed views; a tensor the model would not read (a layer beyond num_hidden_layers,
// a bias with attention_bias false, an unknown name) is refused, not ignored. Reads the hub layout (MXFP4 experts as blocks/scales) and the layout
// transformers writes for a dequantized model (gate_up_proj [E, H, 2I], down_proj [E, I, H],
// input-major, so W1[e][j][k] = gate_up_proj[e][k][j]).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace parity {

// y = W x + b with W stored [out, in] (PyTorch convention) in BF16, F16 or F32.
struct Linear {
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;  // may be null (lm_head)
  int out = 0, in = 0;
};

enum class ExpertLayout {
  Mxfp4,         // blocks [E, out, in/32, 16] U8 + scales [E, out, in/32] U8 (hub layout)
  DenseInMajor,  // [E, in, out] BF16/F16/F32 (transformers save of a dequantized model)
};
std::string_view expert_layout_name(ExpertLayout l);

// One expert projection for all E experts: W[e] is [out, in] mathematically.
struct ExpertLinear {
  ExpertLayout layout = ExpertLayout::Mxfp4;
  const TensorView* blocks = nullptr;  // Mxfp4
  const TensorView* scales = nullptr;  // Mxfp4
  const TensorView* dense = nullptr;   // DenseInMajor
  const TensorView* bias = nullptr;    // [E, out]
  int experts = 0, out = 0, in = 0;
};

struct LayerWeights {
  const TensorView* attn_norm = nullptr;  // [H]
  Linear q, k, v, o;
  const TensorView* sinks = nullptr;  // [nH]
  const TensorView* ffn_norm = nullptr;  // [H]
  Linear router;                         // [E, H]
  ExpertLinear mlp1;                     // out = 2 I (rows interleaved: even gate, odd linear)
  ExpertLinear mlp2;                     // out = H, in = I
};

struct Model {
  std::string dir;
  Config config;
  std::unique_ptr<TensorStore> store;
  const TensorView* embed = nullptr;  // [V, H]
  std::vector<LayerWeights> layers;
  const TensorView* final_norm = nullptr;  // [H]
  Linear lm_head;                          // [V, H], no bias
  ExpertLayout expert_layout = ExpertLayout::Mxfp4;
  std::string fingerprint;  // checkpoint content fingerprint (TensorStore::fingerprint)

  static std::unique_ptr<Model> load(const std::string& dir);
  size_t weight_bytes() const;
};

// Typed element access, exact for every stored dtype.
template <typename T>
void read_vector(const TensorView& t, T* out);  // all elements, flattened
template <typename T>
void read_row(const TensorView& t, int64_t row, int64_t row_len, T* out);  // contiguous row
// Row j of W[e] ([out, in] view) for an expert projection, whatever the layout.
template <typename T>
void read_expert_row(const ExpertLinear& w, int expert, int row, T* out);

}  // namespace parity
