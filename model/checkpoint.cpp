#include "model/checkpoint.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>

#include "model/error.h"
#include "model/numerics.h"
#include "model/untrusted.h"

namespace parity {
namespace fs = std::filesystem;

std::string_view expert_layout_name(ExpertLayout l) {
  return l == ExpertLayout::Mxfp4 ? "mxfp4" : "dense-in-major";
}

namespace {

bool is_real(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

const TensorView* expect(const TensorStore& s, const std::string& name, std::vector<int64_t> shape,
                         bool real = true) {
  const TensorView& t = s.get(name);
  if (real && !is_real(t.dtype))
    fail("{}: tensor {} has dtype {}; expected BF16, F16 or F32", t.file, quoted(name),
         dtype_name(t.dtype));
  if (!real && t.dtype != DType::U8)
    fail("{}: tensor {} has dtype {}; expected U8 (MXFP4 blocks/scales)", t.file, quoted(name),
         dtype_name(t.dtype));
  if (t.shape != shape) {
    TensorView want;
    want.shape = shape;
    // A shape of many dimensions is cut short: the line must stay one readable line.
    fail("{}: tensor {} has shape {}; the config implies {}", t.file, quoted(name),
         quoted(t.shape_str(), 60), want.shape_str());
  }
  return &t;
}

Linear linear(const TensorStore& s, const std::string& prefix, int out, int in, bool bias) {
  Linear l;
  l.out = out;
  l.in = in;
  l.weight = expect(s, prefix + ".weight", {out, in});
  if (bias) l.bias = expect(s, prefix + ".bias", {out});
  return l;
}

ExpertLinear expert_linear(const TensorStore& s, const std::string& prefix, ExpertLayout layout,
                           int E, int out, int in) {
  ExpertLinear w;
  w.layout = layout;
  w.experts = E;
  w.out = out;
  w.in = in;
  if (layout == ExpertLayout::Mxfp4) {
    if (in % kMxfp4Block != 0)
      fail("{}: MXFP4 expert input dim {} is not a multiple of 32", s.dir(), in);
    w.blocks = expect(s, prefix + "_blocks", {E, out, in / kMxfp4Block, kMxfp4BlockBytes}, false);
    w.scales = expect(s, prefix + "_scales", {E, out, in / kMxfp4Block}, false);
    for (size_t i = 0; i < w.scales->nbytes; ++i)
      if (w.scales->data[i] == 0xff)
        fail("{}: tensor {} holds scale byte 255 (NaN in E8M0) at element {}", w.scales->file,
             quoted(w.scales->name), i);
  } else {
    w.dense = expect(s, prefix, {E, in, out});
  }
  w.bias = expect(s, prefix + "_bias", {E, out});
  return w;
}

// Every tensor a bound model reads.
std::set<std::string> bound_tensors(const Model& m) {
  std::set<std::string> used;
  auto add = [&](const TensorView* t) {
    if (t != nullptr) used.insert(t->name);
  };
  auto add_linear = [&](const Linear& l) {
    add(l.weight);
    add(l.bias);
  };
  auto add_experts = [&](const ExpertLinear& w) {
    add(w.blocks);
    add(w.scales);
    add(w.dense);
    add(w.bias);
  };
  add(m.embed);
  for (const LayerWeights& w : m.layers) {
    add(w.attn_norm);
    add_linear(w.q);
    add_linear(w.k);
    add_linear(w.v);
    add_linear(w.o);
    add(w.sinks);
    add(w.ffn_norm);
    add_linear(w.router);
    add_experts(w.mlp1);
    add_experts(w.mlp2);
  }
  add(m.final_norm);
  add_linear(m.lm_head);
  return used;
}

// The layer of a "model.layers.N." tensor name, or -1. An N too large for int64 reads as the
// largest value: it is a layer the config cannot have either way.
int64_t layer_of(const std::string& name) {
  static constexpr std::string_view prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  int64_t n = -1;
  const auto [end, ec] = std::from_chars(first, last, n);
  if (end == first || end == last || *end != '.') return -1;
  return ec == std::errc::result_out_of_range ? std::numeric_limits<int64_t>::max() : n;
}

// A tensor the bound model does not read is refused, not ignored. The hub checkpoints and the
// ones transformers saves hold exactly the tensors bound above, so an extra one means the
// config and the checkpoint disagree: layers beyond num_hidden_layers (a config with fewer
// layers would silently run a truncated model), q/k/v/o biases with attention_bias false,
// both expert layouts at once, or weights of another architecture (QK norms, a tied or biased
// head). Ignoring any of them would give logits that match nothing, in a tool whose job is to
// say which numbers are wrong; a warning on stderr is too easy to miss in a trace run.
void refuse_unused_tensors(const Model& m, const std::string& dir) {
  const std::set<std::string> used = bound_tensors(m);
  size_t unused = 0;
  std::string first;
  for (const std::string& name : m.store->names()) {
    if (used.count(name)) continue;
    const int64_t layer = layer_of(name);
    if (layer >= m.config.num_hidden_layers)
      fail("{}: holds tensor {} of layer {}, but config.json has num_hidden_layers {} (the "
           "config and the checkpoint disagree)",
           dir, quoted(name), layer, m.config.num_hidden_layers);
    if (unused++ == 0) first = name;
  }
  if (unused > 0)
    fail("{}: tensor {} is not part of a gpt-oss model with this config.json ({} such tensor{}; "
         "refused rather than ignored)",
         dir, quoted(first), unused, unused == 1 ? "" : "s");
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir) {
  auto m = std::make_unique<Model>();
  m->dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a checkpoint directory", dir);
  m->config = Config::load((fs::path(dir) / "config.json").string());
  m->store = std::make_unique<TensorStore>(dir);
  const Config& c = m->config;
  const TensorStore& s = *m->store;
  const int H = c.hidden_size, E = c.num_local_experts, I = c.intermediate_size;

  if (s.has("model.layers.0.mlp.experts.gate_up_proj_blocks"))
    m->expert_layout = ExpertLayout::Mxfp4;
  else if (s.has("model.layers.0.mlp.experts.gate_up_proj"))
    m->expert_layout = ExpertLayout::DenseInMajor;
  else if (s.has("block.0.attn.qkv.weight"))
    fail("{}: this is the original/ layout (block.N.*); point --model at the Hugging Face "
         "directory (its parent) instead",
         dir);
  else
    fail("{}: no experts found (expected model.layers.0.mlp.experts.gate_up_proj_blocks or "
         "model.layers.0.mlp.experts.gate_up_proj)",
         dir);

  m->embed = expect(s, "model.embed_tokens.weight", {c.vocab_size, H});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    LayerWeights w;
    w.attn_norm = expect(s, p + ".input_layernorm.weight", {H});
    w.q = linear(s, p + ".self_attn.q_proj", c.q_dim(), H, c.attention_bias);
    w.k = linear(s, p + ".self_attn.k_proj", c.kv_dim(), H, c.attention_bias);
    w.v = linear(s, p + ".self_attn.v_proj", c.kv_dim(), H, c.attention_bias);
    w.o = linear(s, p + ".self_attn.o_proj", H, c.q_dim(), c.attention_bias);
    w.sinks = expect(s, p + ".self_attn.sinks", {c.num_attention_heads});
    w.ffn_norm = expect(s, p + ".post_attention_layernorm.weight", {H});
    w.router = linear(s, p + ".mlp.router", E, H, true);
    w.mlp1 = expert_linear(s, p + ".mlp.experts.gate_up_proj", m->expert_layout, E, 2 * I, H);
    w.mlp2 = expert_linear(s, p + ".mlp.experts.down_proj", m->expert_layout, E, H, I);
    m->layers.push_back(w);
  }
  m->final_norm = expect(s, "model.norm.weight", {H});
  m->lm_head = linear(s, "lm_head", c.vocab_size, H, false);
  refuse_unused_tensors(*m, dir);
  m->fingerprint = s.fingerprint();
  return m;
}

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& name : store->names()) n += store->get(name).nbytes;
  return n;
}

template <typename T>
static inline T element(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::BF16: {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      return T(bf16_to_float(b));
    }
    case DType::F16: {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      return T(f16_to_float(b));
    }
    case DType::F32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return T(f);
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, t.data + 8 * i, 8);
      return T(d);
    }
    default:
      fail("{}: tensor {} of dtype {} read as real numbers", t.file, quoted(t.name),
           dtype_name(t.dtype));
  }
}

template <typename T>
void read_vector(const TensorView& t, T* out) {
  read_row(t, 0, t.numel(), out);
}

template <typename T>
void read_row(const TensorView& t, int64_t row, int64_t n, T* out) {
  const int64_t base = row * n;
  if (t.dtype == DType::BF16) {
    // memcpy, not a uint16_t* cast: safetensors does not align the data section, so a tensor
    // may start at an odd address, and a misaligned uint16_t access is undefined behaviour.
    const uint8_t* p = t.data + 2 * base;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      out[i] = T(bf16_to_float(b));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = element<T>(t, base + i);
  }
}

template <typename T>
void read_expert_row(const ExpertLinear& w, int e, int row, T* out) {
  if (w.layout == ExpertLayout::Mxfp4) {
    const int groups = w.in / kMxfp4Block;
    const size_t r = size_t(e) * size_t(w.out) + size_t(row);
    decode_mxfp4_row(w.blocks->data + r * size_t(groups) * kMxfp4BlockBytes,
                     w.scales->data + r * size_t(groups), w.in, out);
  } else {
    // [E, in, out]: row `row` of W[e] is column `row` of the stored matrix.
    const int64_t base = int64_t(e) * w.in * w.out + row;
    for (int k = 0; k < w.in; ++k) out[k] = element<T>(*w.dense, base + int64_t(k) * w.out);
  }
}

#define PARITY_INSTANTIATE(T)                                                    \
  template void read_vector<T>(const TensorView&, T*);                          \
  template void read_row<T>(const TensorView&, int64_t, int64_t, T*);           \
  template void read_expert_row<T>(const ExpertLinear&, int, int, T*);
PARITY_INSTANTIATE(double)
PARITY_INSTANTIATE(float)
#undef PARITY_INSTANTIATE

}  // namespace parity
