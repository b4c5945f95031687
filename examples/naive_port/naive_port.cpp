// naive_port: a deliberately plain gpt-oss forward pass in float32, in one file, written from
// the model's description (gpt_oss/torch/model.py) and not from this project's reference: its own
// safetensors and MXFP4 reading, its own loops, its own layouts. It is what a first port looks
// like, instrumented with the capture API (parity_capture.h) so that
//
//   naive_port MODEL_DIR --tokens 1,2,3 --capture port.h5
//   parity-trace --model MODEL_DIR --candidate-trace port.h5 --out out/port
//
// names the first stage, layer and position where it leaves the float64 reference.
//
// Like many ports it keeps tensors in its own layouts, and declares them when it records, so
// nothing is reshaped for the capture: q, k and v are three projections (recorded as the parts
// of qkv), an attention row holds the sink first ([sink, key 0, ..., key pos]), and the expert's
// first projection is split into halves at load ([gate | linear], not interleaved).
//
// --dtype bfloat16 stores every stage's output (the KV cache included) as bfloat16, rounded to
// nearest even, and computes in float32 inside each stage: what fused-kernel GPU ports do. It
// declares the "bfloat16" precision preset; float32 (the default) declares "float32".
//
// Planted bugs (--bug NAME), each a classic of real ports:
//   sink     softmax over the keys only, without the sink
//   clamp    the SwiGLU's linear half clamped from above only (the lower clamp forgotten)
//   gate2    the SwiGLU's gate clamped on both sides (its clamp is one-sided: min(gate, 7))
//   eps      RMSNorm with eps 1e-6 instead of the config's
//   trunc    attn_norm's output stored as bfloat16 by truncation instead of rounding to nearest
//            even (in a float32 port: rounded at all where it should not be)
//   window   the sliding window one key too wide (pos - j <= window)
//   nibble   MXFP4 nibbles swapped (the high nibble taken as the even element)
//   kv-early each position's k and v written one cache slot early
//
// --cache-prefix N records nothing of positions 0..N-1 but their KV cache, in bulk
// (parity_capture_record_cache), as the port holds it: the diff then judges positions N and
// later without the reference running the prefix.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "parity_capture.h"

namespace {

using json = nlohmann::json;
using Vec = std::vector<float>;

[[noreturn]] void die(const std::string& what) {
  throw std::runtime_error(what);
}

// ---- checkpoint: safetensors files, read with mmap ----------------------------------------------

struct Tensor {
  std::string dtype;  // "BF16", "F16", "F32", "U8"
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  int64_t elements() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
  }
};

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir) {
    namespace fs = std::filesystem;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".safetensors") map_file(entry.path().string());
    if (tensors_.empty()) die(dir + ": no .safetensors files");
  }
  ~Checkpoint() {
    for (auto& [p, n] : maps_) munmap(p, n);
  }
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const Tensor& get(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end())
      die("tensor " + name + " not in the checkpoint (naive_port reads the hub layout)");
    return it->second;
  }

 private:
  void map_file(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) die(path + ": cannot open");
    struct stat st {};
    fstat(fd, &st);
    const size_t size = size_t(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) die(path + ": cannot map");
    maps_.emplace_back(p, size);
    const auto* bytes = static_cast<const uint8_t*>(p);
    uint64_t header = 0;
    if (size < 8) die(path + ": not a safetensors file");
    std::memcpy(&header, bytes, 8);
    if (header > size - 8) die(path + ": header past the end of the file");
    const json h = json::parse(bytes + 8, bytes + 8 + header);
    for (const auto& [name, t] : h.items()) {
      if (name == "__metadata__") continue;
      Tensor x;
      x.dtype = t.at("dtype").get<std::string>();
      x.shape = t.at("shape").get<std::vector<int64_t>>();
      const auto offsets = t.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[1] > size - 8 - header)
        die(path + ": bad offsets of " + name);
      x.data = bytes + 8 + header + offsets[0];
      tensors_[name] = x;
    }
  }

  std::map<std::string, Tensor> tensors_;
  std::vector<std::pair<void*, size_t>> maps_;
};

float bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float half(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0    ? std::ldexp(float(m), -24)
                  : e == 31 ? (m ? std::numeric_limits<float>::quiet_NaN() : INFINITY)
                            : std::ldexp(float(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}

float value_at(const Tensor& t, int64_t i) {
  if (t.dtype == "BF16") {
    uint16_t b;
    std::memcpy(&b, t.data + 2 * i, 2);
    return bf16(b);
  }
  if (t.dtype == "F16") {
    uint16_t b;
    std::memcpy(&b, t.data + 2 * i, 2);
    return half(b);
  }
  if (t.dtype == "F32") {
    float f;
    std::memcpy(&f, t.data + 4 * i, 4);
    return f;
  }
  die("unexpected dtype " + t.dtype);
}

Vec load(const Tensor& t) {
  Vec v(size_t(t.elements()));
  for (int64_t i = 0; i < t.elements(); ++i) v[size_t(i)] = value_at(t, i);
  return v;
}

// ---- the model --------------------------------------------------------------------------------

struct Params {
  int vocab, hidden, layers, heads, kv_heads, head_dim, inter, experts, top_k, window;
  std::vector<bool> sliding;
  float eps, limit;
  std::vector<float> inv_freq;  // head_dim / 2
  float concentration;
};

Params read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) die(dir + "/config.json: cannot read");
  const json c = json::parse(in);
  Params p{};
  p.vocab = c.at("vocab_size");
  p.hidden = c.at("hidden_size");
  p.layers = c.at("num_hidden_layers");
  p.heads = c.at("num_attention_heads");
  p.kv_heads = c.at("num_key_value_heads");
  p.head_dim = c.value("head_dim", p.hidden / p.heads);
  p.inter = c.at("intermediate_size");
  p.experts = c.at("num_local_experts");
  p.top_k = c.contains("num_experts_per_tok") ? c["num_experts_per_tok"].get<int>()
                                              : c.at("experts_per_token").get<int>();
  p.window = c.at("sliding_window");
  for (int L = 0; L < p.layers; ++L)
    p.sliding.push_back(c.contains("layer_types")
                            ? c["layer_types"][size_t(L)] == "sliding_attention"
                            : L % 2 == 0);
  p.eps = c.value("rms_norm_eps", 1e-5f);
  p.limit = c.value("swiglu_limit", 7.0f);
  // YaRN (gpt_oss/torch/model.py RotaryEmbedding), in float.
  const json rope = c.contains("rope_parameters") ? c["rope_parameters"]
                                                  : c.value("rope_scaling", json::object());
  const float theta = rope.value("rope_theta", c.value("rope_theta", 150000.0f));
  const float factor = rope.value("factor", 1.0f), beta_fast = rope.value("beta_fast", 32.0f),
              beta_slow = rope.value("beta_slow", 1.0f);
  const float ctx = rope.value("original_max_position_embeddings", 4096.0f);
  const int half = p.head_dim / 2;
  const float pi = 3.14159265358979f;
  float low = half * std::log(ctx / (beta_fast * 2 * pi)) / std::log(theta);
  float high = half * std::log(ctx / (beta_slow * 2 * pi)) / std::log(theta);
  if (rope.value("truncate", false)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  p.concentration = factor > 1 ? 0.1f * std::log(factor) + 1.0f : 1.0f;
  for (int i = 0; i < half; ++i) {
    const float freq = std::pow(theta, float(2 * i) / float(p.head_dim));
    float ramp = factor > 1 ? (float(i) - low) / (high - low) : 0.0f;
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    p.inv_freq.push_back((1.0f / freq) * (1.0f - ramp) + (1.0f / (factor * freq)) * ramp);
  }
  return p;
}

struct Linear {
  Vec w, b;  // w [out, in]
  int out = 0, in = 0;
};

Linear linear(const Checkpoint& ck, const std::string& name, bool bias = true) {
  const Tensor& w = ck.get(name + ".weight");
  Linear l;
  l.out = int(w.shape.at(0));
  l.in = int(w.shape.at(1));
  l.w = load(w);
  if (bias) l.b = load(ck.get(name + ".bias"));
  return l;
}

// y = W x + b, W (out, in) @ x (in,) -> y (out,)
Vec matvec(const Linear& l, const Vec& x) {
  Vec y(size_t(l.out));
  for (int o = 0; o < l.out; ++o) {
    float s = l.b.empty() ? 0.0f : l.b[size_t(o)];
    for (int i = 0; i < l.in; ++i) s += l.w[size_t(o) * size_t(l.in) + size_t(i)] * x[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}

// MXFP4 experts: blocks [E, out, in/32, 16] and scales [E, out, in/32], decoded per row as used.
struct Experts {
  const Tensor* blocks;
  const Tensor* scales;
  Vec bias;  // [E, out]
  int out, in;
  // Row order of the rows we keep: identity, or the gate/linear halves of mlp1.
  std::vector<int> rows;
};

const float kFp4[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};

// y = W[e] x + b[e], W[e] (out, in) in MXFP4, rows in this port's order; `swap`: the nibbles
// taken the wrong way round (the bug)
Vec expert_matvec(const Experts& x, int e, const Vec& v, bool swap = false) {
  const int groups = x.in / 32;
  Vec y(size_t(x.out));
  for (int o = 0; o < x.out; ++o) {
    const int r = x.rows[size_t(o)];
    const uint8_t* blk = x.blocks->data + (int64_t(e) * x.out + r) * groups * 16;
    const uint8_t* sc = x.scales->data + (int64_t(e) * x.out + r) * groups;
    float s = x.bias[size_t(e) * size_t(x.out) + size_t(r)];
    for (int g = 0; g < groups; ++g) {
      const float scale = std::ldexp(1.0f, int(sc[g]) - 127);
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = blk[g * 16 + j];
        const int even = swap ? b >> 4 : b & 15, odd = swap ? b & 15 : b >> 4;
        s += kFp4[even] * scale * v[size_t(g * 32 + 2 * j)];
        s += kFp4[odd] * scale * v[size_t(g * 32 + 2 * j + 1)];
      }
    }
    y[size_t(o)] = s;
  }
  return y;
}

Experts experts(const Checkpoint& ck, const std::string& name, bool halves) {
  Experts x{};
  x.blocks = &ck.get(name + "_blocks");
  x.scales = &ck.get(name + "_scales");
  x.bias = load(ck.get(name + "_bias"));
  x.out = int(x.blocks->shape.at(1));
  x.in = int(x.blocks->shape.at(2) * 32);
  for (int r = 0; r < x.out; ++r) x.rows.push_back(r);
  if (halves)  // the checkpoint interleaves gate (even rows) and linear (odd rows)
    for (int j = 0; j < x.out / 2; ++j) {
      x.rows[size_t(j)] = 2 * j;
      x.rows[size_t(x.out / 2 + j)] = 2 * j + 1;
    }
  return x;
}

struct Layer {
  Vec attn_norm, ffn_norm, sinks;
  Linear q, k, v, o, router;
  Experts mlp1, mlp2;
};

struct Model {
  Params p;
  Vec embed;  // [V, H]
  std::vector<Layer> layers;
  Vec norm;
  Linear head;
};

// The experts stay in the checkpoint's mapping (decoded as they are used): `ck` must outlive the
// model.
Model load_model(const Checkpoint& ck, const std::string& dir) {
  Model m;
  m.p = read_config(dir);
  m.embed = load(ck.get("model.embed_tokens.weight"));
  for (int L = 0; L < m.p.layers; ++L) {
    const std::string n = "model.layers." + std::to_string(L) + ".";
    Layer l;
    l.attn_norm = load(ck.get(n + "input_layernorm.weight"));
    l.ffn_norm = load(ck.get(n + "post_attention_layernorm.weight"));
    l.sinks = load(ck.get(n + "self_attn.sinks"));
    l.q = linear(ck, n + "self_attn.q_proj");
    l.k = linear(ck, n + "self_attn.k_proj");
    l.v = linear(ck, n + "self_attn.v_proj");
    l.o = linear(ck, n + "self_attn.o_proj");
    l.router = linear(ck, n + "mlp.router");
    l.mlp1 = experts(ck, n + "mlp.experts.gate_up_proj", true);
    l.mlp2 = experts(ck, n + "mlp.experts.down_proj", false);
    m.layers.push_back(std::move(l));
  }
  m.norm = load(ck.get("model.norm.weight"));
  m.head = linear(ck, "lm_head", false);
  return m;
}

}  // namespace

// ---- the forward pass, one token at a time ------------------------------------------------------

namespace {

enum class Bug { none, sink, clamp, gate2, eps, trunc, window, nibble, kv_early };

struct BugName {
  const char* name;
  Bug bug;
};
constexpr BugName kBugs[] = {{"sink", Bug::sink},   {"clamp", Bug::clamp},   {"gate2", Bug::gate2},
                             {"eps", Bug::eps},     {"trunc", Bug::trunc},   {"window", Bug::window},
                             {"nibble", Bug::nibble}, {"kv-early", Bug::kv_early}};

// float to bfloat16 and back: round to nearest even, or truncate (the bug).
float to_bf16(float x, bool truncate = false) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, nan
  if (!truncate) u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

struct Port {
  const Model& m;
  Bug bug = Bug::none;
  bool bf16 = false;                               // store every stage's output as bfloat16
  parity_capture* cap = nullptr;                   // null: no capture, no cost
  std::vector<std::vector<Vec>> k_cache, v_cache;  // [layer][slot] (rotated k, raw v)

  // A stage's output as the port stores it.
  Vec& store(Vec& x) const {
    if (bf16)
      for (float& v : x) v = to_bf16(v);
    return x;
  }
  float eps() const { return bug == Bug::eps ? 1e-6f : m.p.eps; }

  void rec(const char* stage, int pos, int layer, const Vec& x,
           unsigned layout = PARITY_LAYOUT_DEFAULT, int slot = PARITY_CAPTURE_ALL_SLOTS) {
    if (cap == nullptr) return;
    if (parity_capture_record(cap, stage, pos, layer, slot, x.data(), PARITY_CAPTURE_F32, x.size(),
                              layout) != 0)
      die(parity_capture_last_error());
  }
  void rec_index(const char* stage, int pos, int layer, const std::vector<int32_t>& x) {
    if (cap == nullptr) return;
    if (parity_capture_record(cap, stage, pos, layer, PARITY_CAPTURE_ALL_SLOTS, x.data(),
                              PARITY_CAPTURE_I32, x.size(), PARITY_LAYOUT_DEFAULT) != 0)
      die(parity_capture_last_error());
  }

  Vec rmsnorm_f32(const Vec& x, const Vec& w) const {
    float ss = 0;
    for (float v : x) ss += v * v;
    const float r = 1.0f / std::sqrt(ss / float(x.size()) + eps());
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  }
  Vec rmsnorm(const Vec& x, const Vec& w) const {
    Vec y = rmsnorm_f32(x, w);
    return store(y);
  }

  // Half-split RoPE on each head of x (heads, d): pairs (i, i + d/2).
  void rope(Vec& x, int heads, int pos) const {
    const int d = m.p.head_dim, h2 = d / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < h2; ++i) {
        const float angle = float(pos) * m.p.inv_freq[size_t(i)];
        const float c = std::cos(angle) * m.p.concentration,
                    s = std::sin(angle) * m.p.concentration;
        float& a = x[size_t(h * d + i)];
        float& b = x[size_t(h * d + h2 + i)];
        const float x1 = a, x2 = b;
        a = x1 * c - x2 * s;
        b = x2 * c + x1 * s;
      }
  }

  // One token at `pos`; returns the logits.
  Vec step(int token, int pos) {
    const Params& p = m.p;
    const int H = p.hidden, d = p.head_dim;
    Vec x(m.embed.begin() + int64_t(token) * H, m.embed.begin() + int64_t(token + 1) * H);
    store(x);
    rec("embedding", pos, -1, x);
    for (int L = 0; L < p.layers; ++L) {
      const Layer& l = m.layers[size_t(L)];
      // Attention block.
      Vec t = bug == Bug::trunc ? rmsnorm_f32(x, l.attn_norm) : rmsnorm(x, l.attn_norm);
      if (bug == Bug::trunc)  // stored as bfloat16 by truncation
        for (float& v : t) v = to_bf16(v, true);
      rec("attn_norm", pos, L, t);
      Vec q = matvec(l.q, t), k = matvec(l.k, t), v = matvec(l.v, t);
      store(q), store(k), store(v);
      rec("qkv", pos, L, q, PARITY_LAYOUT_QKV_Q);
      rec("qkv", pos, L, k, PARITY_LAYOUT_QKV_K);
      rec("qkv", pos, L, v, PARITY_LAYOUT_QKV_V);
      rope(q, p.heads, pos);
      rope(k, p.kv_heads, pos);
      store(q), store(k);
      rec("q_rope", pos, L, q);
      rec("k_rope", pos, L, k);
      rec("v", pos, L, v);
      auto& kc = k_cache[size_t(L)];
      auto& vc = v_cache[size_t(L)];
      kc.resize(size_t(pos) + 1, Vec(k.size(), 0.0f));
      vc.resize(size_t(pos) + 1, Vec(v.size(), 0.0f));
      const size_t slot = bug == Bug::kv_early && pos > 0 ? size_t(pos) - 1 : size_t(pos);
      kc[slot] = k;
      vc[slot] = v;
      // Scores and softmax, per head: row = [sink, key 0, ..., key pos].
      const int n = pos + 1, cols = n + 1;
      Vec scores(size_t(p.heads * cols)), att(size_t(p.heads * cols)),
          out(size_t(p.heads * d), 0.0f);
      const float scale = 1.0f / std::sqrt(float(d));
      for (int h = 0; h < p.heads; ++h) {
        const int kvh = h / (p.heads / p.kv_heads);
        float* srow = &scores[size_t(h * cols)];
        srow[0] = l.sinks[size_t(h)];
        for (int j = 0; j < n; ++j) {
          const int reach = bug == Bug::window ? p.window + 1 : p.window;
          const bool visible = !p.sliding[size_t(L)] || pos - j < reach;
          float s = -INFINITY;
          if (visible) {
            s = 0;
            for (int i = 0; i < d; ++i)
              s += q[size_t(h * d + i)] * kc[size_t(j)][size_t(kvh * d + i)];
            s *= scale;
          }
          srow[1 + j] = s;
        }
      }
      store(scores);
      for (int h = 0; h < p.heads; ++h) {
        const float* srow = &scores[size_t(h * cols)];
        float mx = bug == Bug::sink ? -INFINITY : srow[0];
        for (int j = 1; j < cols; ++j) mx = std::max(mx, srow[j]);
        float* arow = &att[size_t(h * cols)];
        float z = 0;
        for (int j = 0; j < cols; ++j) {
          const bool skip = bug == Bug::sink && j == 0;  // the bug: the sink left out
          arow[j] = skip || srow[j] == -INFINITY ? 0.0f : std::exp(srow[j] - mx);
          z += arow[j];
        }
        for (int j = 0; j < cols; ++j) arow[j] /= z;
      }
      store(att);
      for (int h = 0; h < p.heads; ++h) {
        const int kvh = h / (p.heads / p.kv_heads);
        const float* arow = &att[size_t(h * cols)];
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < d; ++i)
            out[size_t(h * d + i)] += arow[1 + j] * vc[size_t(j)][size_t(kvh * d + i)];
      }
      store(out);
      rec("scores", pos, L, scores, PARITY_LAYOUT_SINK_FIRST);
      rec("att", pos, L, att, PARITY_LAYOUT_SINK_FIRST);
      rec("attn_out", pos, L, out);
      Vec o = matvec(l.o, out);
      store(o);
      rec("o_proj", pos, L, o);
      for (int i = 0; i < H; ++i) x[size_t(i)] += o[size_t(i)];
      store(x);
      rec("resid_attn", pos, L, x);
      // MoE block.
      const Vec u = rmsnorm(x, l.ffn_norm);
      rec("ffn_norm", pos, L, u);
      Vec g = matvec(l.router, u);
      store(g);
      rec("router", pos, L, g);
      std::vector<int32_t> idx(size_t(p.experts));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(),
                       [&](int a, int b) { return g[size_t(a)] > g[size_t(b)]; });
      idx.resize(size_t(p.top_k));
      Vec w(size_t(p.top_k));
      float mx = -INFINITY, z = 0;
      for (int s = 0; s < p.top_k; ++s) mx = std::max(mx, g[size_t(idx[size_t(s)])]);
      for (int s = 0; s < p.top_k; ++s)
        z += w[size_t(s)] = std::exp(g[size_t(idx[size_t(s)])] - mx);
      for (float& ws : w) ws /= z;
      store(w);
      rec_index("topk_idx", pos, L, idx);
      rec("topk_w", pos, L, w);
      Vec moe(size_t(H), 0.0f);
      for (int s = 0; s < p.top_k; ++s) {
        const int e = idx[size_t(s)];
        Vec h = expert_matvec(l.mlp1, e, u, bug == Bug::nibble);  // [gate | linear]
        store(h);
        rec("mlp1", pos, L, h, PARITY_LAYOUT_GATE_UP_HALVES, s);
        Vec a(size_t(p.inter));
        for (int j = 0; j < p.inter; ++j) {
          const float gate = bug == Bug::gate2 ? std::clamp(h[size_t(j)], -p.limit, p.limit)
                                               : std::min(h[size_t(j)], p.limit);
          const float lin = bug == Bug::clamp
                                ? std::min(h[size_t(p.inter + j)], p.limit)
                                : std::clamp(h[size_t(p.inter + j)], -p.limit, p.limit);
          a[size_t(j)] = gate / (1.0f + std::exp(-1.702f * gate)) * (lin + 1.0f);
        }
        store(a);
        rec("swiglu", pos, L, a, PARITY_LAYOUT_DEFAULT, s);
        Vec y = expert_matvec(l.mlp2, e, a, bug == Bug::nibble);
        store(y);
        rec("mlp2", pos, L, y, PARITY_LAYOUT_DEFAULT, s);
        for (int i = 0; i < H; ++i) moe[size_t(i)] += w[size_t(s)] * y[size_t(i)];
      }
      store(moe);
      rec("moe_out", pos, L, moe);
      for (int i = 0; i < H; ++i) x[size_t(i)] += moe[size_t(i)];
      store(x);
      rec("resid_ffn", pos, L, x);
    }
    const Vec f = rmsnorm(x, m.norm);
    rec("final_norm", pos, -1, f);
    Vec logits = matvec(m.head, f);
    store(logits);
    rec("logits", pos, -1, logits);
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    rec_index("sampled", pos, -1, {best});
    return logits;
  }
};

std::vector<int32_t> parse_tokens(const std::string& text) {
  std::vector<int32_t> t;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    size_t used = 0;
    const long v = std::stol(item, &used);
    if (used != item.size() || v < 0 || v > std::numeric_limits<int32_t>::max())
      die("--tokens: bad id " + item);
    t.push_back(int32_t(v));
    start = comma + 1;
  }
  return t;
}

int run(int argc, char** argv) {
  std::string dir, capture_path, tokens_text, dtype = "float32";
  int cache_prefix = 0;
  Bug bug = Bug::none;
  const char* usage =
      "naive_port MODEL_DIR --tokens t0,t1,... [--capture FILE] [--dtype float32|bfloat16] "
      "[--bug sink|clamp|gate2|eps|trunc|window|nibble|kv-early] [--cache-prefix N]";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--tokens")
      tokens_text = next();
    else if (a == "--capture")
      capture_path = next();
    else if (a == "--cache-prefix") {
      const std::string n = next();
      size_t used = 0;
      cache_prefix = std::stoi(n, &used);
      if (used != n.size() || cache_prefix < 0) die("--cache-prefix N: a position, not " + n);
    } else if (a == "--dtype") {
      dtype = next();
      if (dtype != "float32" && dtype != "bfloat16") die("--dtype float32|bfloat16, not " + dtype);
    } else if (a == "--bug") {
      const std::string b = next();
      const auto it = std::find_if(std::begin(kBugs), std::end(kBugs),
                                   [&](const BugName& n) { return b == n.name; });
      if (it == std::end(kBugs)) die(std::string("unknown --bug ") + b + "; " + usage);
      bug = it->bug;
    } else if (a == "-h" || a == "--help") {
      std::printf("%s\n", usage);
      return 0;
    } else if (!a.empty() && a[0] != '-' && dir.empty())
      dir = a;
    else
      die("unknown argument " + a);
  }
  if (dir.empty() || tokens_text.empty()) die(std::string("usage: ") + usage);
  const std::vector<int32_t> tokens = parse_tokens(tokens_text);
  if (size_t(cache_prefix) >= tokens.size()) die("--cache-prefix: not below the token count");

  const Checkpoint ck(dir);  // kept mapped: the experts are decoded from it as they are used
  const Model m = load_model(ck, dir);
  for (int32_t t : tokens)
    if (t >= m.p.vocab) die("token " + std::to_string(t) + " is outside the vocabulary");

  parity_capture* cap = nullptr;
  if (!capture_path.empty()) {
    const parity_capture_options options{"naive_port", dtype.c_str(), nullptr};
    if (parity_capture_open(&cap, capture_path.c_str(), dir.c_str(), tokens.data(), tokens.size(),
                            &options) != 0)
      die(parity_capture_last_error());
  }
  Port port{m, bug, dtype == "bfloat16", cap, {}, {}};
  port.k_cache.resize(size_t(m.p.layers));
  port.v_cache.resize(size_t(m.p.layers));
  Vec logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    try {
      // --cache-prefix N: positions below N record nothing; their KV cache is recorded in bulk,
      // as the port holds it, once they are done.
      port.cap = i < size_t(cache_prefix) ? nullptr : cap;
      if (cap != nullptr && cache_prefix > 0 && i == size_t(cache_prefix))
        for (int L = 0; L < m.p.layers; ++L) {
          Vec k, v;
          for (int j = 0; j < cache_prefix; ++j) {
            const Vec& kj = port.k_cache[size_t(L)][size_t(j)];
            const Vec& vj = port.v_cache[size_t(L)][size_t(j)];
            k.insert(k.end(), kj.begin(), kj.end());
            v.insert(v.end(), vj.begin(), vj.end());
          }
          if (parity_capture_record_cache(cap, L, size_t(cache_prefix), k.data(), v.data(),
                                          PARITY_CAPTURE_F32, PARITY_LAYOUT_DEFAULT) != 0)
            die(parity_capture_last_error());
        }
      logits = port.step(tokens[i], int(i));
    } catch (...) {
      parity_capture_abandon(&cap);
      throw;
    }
  }
  const int best = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::printf("naive_port: %zu tokens; next token %d (logit %.6g)\n", tokens.size(), best,
              double(logits[size_t(best)]));
  if (cap != nullptr) {
    if (parity_capture_close(&cap) != 0) die(parity_capture_last_error());
    std::printf("naive_port: capture written to %s\n", capture_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "naive_port: error: %s\n", e.what());
    return 2;
  }
}
