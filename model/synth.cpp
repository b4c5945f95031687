// Deterministic synthetic gpt-oss checkpoints (see model/synth.h).
//
// Every byte is a pure function of (seed, tensor name, element index): a counter-based RNG
// (the splitmix64 finalizer over key + i * golden-gamma, which is splitmix64's own stream) so
// the output does not depend on the thread count or on how the tensor is cut into chunks. Data
// is generated in chunks of a few tens of MB (OpenMP over sub-blocks of a chunk) and streamed
// through SafetensorsWriter while the next chunk is generated, so a 13.8 GB model never sits
// in memory and the disk, not the generator, sets the pace.
#include "model/synth.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <vector>

#include "model/error.h"
#include "model/numerics.h"
#include "model/safetensors.h"

namespace parity {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Bumped whenever the bytes produced for a given (preset, seed) change, and recorded in
// config.json, so golden files can say which generator they were made from.
constexpr int kGeneratorVersion = 1;

// ---- Weight scales ---------------------------------------------------------------------------
// Chosen so a forward pass exercises every branch the parity harness checks (measured with the
// float64 reference by `parity-synth`, which prints the figures; see the report in the tool):
//  * Residual stream O(1): embeddings are N(0, 1) (residual RMS 1 at the input); each layer
//    adds an attention output of RMS ~0.3 and a MoE output of RMS ~0.3 that are nearly
//    independent of the residual, so after L layers the RMS is about sqrt(1 + 0.2 L): ~1.3
//    for tiny (4 layers), ~2.4 for 20b (24), ~2.9 for 120b (36). Both branches stay a
//    visible fraction of the residual, so an error in either reaches the logits.
//  * Linear layers: std = gain / sqrt(fan_in), so with an RMSNorm output of RMS ~1 each output
//    has std ~gain. q and k have std ~1; after YaRN's concentration (1.347 on each) and the
//    1/sqrt(d) scale, scores have std ~1.8: softmax neither uniform nor one-hot.
//  * Sinks N(0, 1): the same units as the scores, so the sink takes a visible share of the
//    probability mass (tens of % at early positions), and a sink bug shows.
//  * Router: gain 1.5 gives logits with std ~1.5; the top-4 differ from token to token and
//    from layer to layer, so over a few positions most experts are used, and the top-4
//    softmax weights are neither equal nor one-hot.
//  * mlp1 (gate_up): gain 3.3 gives h = W1 t + b1 with std ~3.3, so gate > 7 on ~2% and
//    |linear| > 7 on ~3-4% of the elements: the asymmetric SwiGLU clamp engages on both sides.
//  * mlp2 (down): the SwiGLU output has RMS ~8 for h of std ~3.3 (gate*sigmoid(1.702 gate) has
//    RMS ~std/sqrt(2), (lin+1) RMS ~std), so gain 0.04 puts each expert output near RMS 0.3
//    and the routed sum (weights summing to 1) near 0.2-0.3.
//  * Norm weights 1 + N(0, 0.1): close to 1 but different per element and per norm, so using
//    the wrong norm's weights (attn vs ffn vs final) is visible.
//  * Biases small (std 0.1 or less, relative to outputs of O(1)) but never zero, so a missing
//    or misplaced bias (e.g. b2 after instead of before the routing weight) is visible.
constexpr float kEmbedStd = 1.0f;
constexpr float kNormNoise = 0.1f;
constexpr float kQkvGain = 1.0f, kQkvBiasStd = 0.1f;
constexpr float kOGain = 0.5f, kOBiasStd = 0.05f;
constexpr float kSinkStd = 1.0f;
constexpr float kRouterGain = 1.5f, kRouterBiasStd = 0.1f;
constexpr double kMlp1Gain = 3.3;
constexpr float kMlp1BiasStd = 0.2f;
constexpr double kMlp2Gain = 0.04;
constexpr float kMlp2BiasStd = 0.03f;
constexpr float kLmHeadGain = 1.0f;

// ---- Counter-based RNG -----------------------------------------------------------------------
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {  // splitmix64 finalizer (Stafford variant 13)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// The i-th output of the splitmix64 stream seeded with `key`.
inline uint64_t draw(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * kGamma); }

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return mix64(mix64(seed ^ 0x5eed5eed5eed5eedull) ^ h);
}

// Approximately standard normal from one 64-bit draw: the sum of four 16-bit uniforms
// (Irwin-Hall, n = 4), centred and scaled to unit variance. Bounded by +-3.46: the weights
// need no tails (sums over fan_in become Gaussian anyway), and it is a handful of integer ops.
// Every step is exact or a single IEEE float operation, so it is identical on every machine.
inline float approx_normal(uint64_t r) {
  const uint32_t s = uint32_t(r & 0xffffu) + uint32_t((r >> 16) & 0xffffu) +
                     uint32_t((r >> 32) & 0xffffu) + uint32_t(r >> 48);
  constexpr float kInvSd = float(1.7320508075688772 / 65536.0);  // 1 / (65536 / sqrt(3))
  return (float(s) - 131070.0f) * kInvSd;
}

// ---- The tensor plan -------------------------------------------------------------------------
enum class Fill {
  Normal,       // BF16: mean + std * N(0,1)
  RandomBytes,  // U8 MXFP4 blocks: every nibble uniform over the 16 FP4 codes
  Scales,       // U8 E8M0 scales: scale_lo, or scale_lo + 1 with probability p_up
};

struct Plan {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  Fill fill = Fill::Normal;
  float mean = 0, std = 0;
  uint8_t scale_lo = 127;
  double p_up = 0;
  uint64_t key = 0;
  size_t nbytes = 0;
  int shard = 0;
};

// A uniformly random FP4 nibble has RMS sqrt(mean of {0,.25,1,2.25,4,9,16,36}) = 2.926. With
// scale byte 127+e (value 2^e) on a fraction 1-p of the blocks and 128+e on the rest, the
// weight RMS is 2.926 * 2^e * sqrt(1 + 3p). Pick e and p so this equals the target exactly:
// the factor-of-two steps of E8M0 alone would miss the target by up to sqrt(2), and the mixed
// scale bytes also make a kernel that reads the wrong block's scale produce a wrong answer.
void mxfp4_scale_for(double target_std, const std::string& name, uint8_t* lo, double* p_up) {
  constexpr double kNibbleRms = 2.9261749776799064;  // sqrt(68.5 / 8)
  const double ratio = target_std / kNibbleRms;
  const int e = int(std::floor(std::log2(ratio)));
  const double r = ratio / std::ldexp(1.0, e);  // in [1, 2)
  if (127 + e < 1 || 128 + e > 254)
    fail("synthetic checkpoint: tensor {} needs an MXFP4 scale 2^{}, outside E8M0's range", name, e);
  *lo = uint8_t(127 + e);
  *p_up = (r * r - 1.0) / 3.0;
}

std::vector<Plan> make_plan(const Config& c, uint64_t seed) {
  std::vector<Plan> plan;
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts,
                V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  auto normal = [&](std::string name, std::vector<int64_t> shape, float mean, float std) {
    Plan p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.mean = mean;
    p.std = std;
    plan.push_back(std::move(p));
  };
  auto mxfp4 = [&](const std::string& prefix, int64_t out, int64_t in, double gain, float bias_std) {
    Plan b;
    b.name = prefix + "_blocks";
    b.dtype = DType::U8;
    b.shape = {E, out, in / kMxfp4Block, kMxfp4BlockBytes};
    b.fill = Fill::RandomBytes;
    plan.push_back(b);
    Plan s;
    s.name = prefix + "_scales";
    s.dtype = DType::U8;
    s.shape = {E, out, in / kMxfp4Block};
    s.fill = Fill::Scales;
    mxfp4_scale_for(gain / std::sqrt(double(in)), s.name, &s.scale_lo, &s.p_up);
    plan.push_back(s);
    normal(prefix + "_bias", {E, out}, 0.0f, bias_std);
  };
  auto inv_sqrt = [](int64_t n) { return float(1.0 / std::sqrt(double(n))); };

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    normal(p + ".input_layernorm.weight", {H}, 1.0f, kNormNoise);
    normal(p + ".self_attn.q_proj.weight", {Q, H}, 0.0f, kQkvGain * inv_sqrt(H));
    normal(p + ".self_attn.q_proj.bias", {Q}, 0.0f, kQkvBiasStd);
    normal(p + ".self_attn.k_proj.weight", {KV, H}, 0.0f, kQkvGain * inv_sqrt(H));
    normal(p + ".self_attn.k_proj.bias", {KV}, 0.0f, kQkvBiasStd);
    normal(p + ".self_attn.v_proj.weight", {KV, H}, 0.0f, kQkvGain * inv_sqrt(H));
    normal(p + ".self_attn.v_proj.bias", {KV}, 0.0f, kQkvBiasStd);
    normal(p + ".self_attn.o_proj.weight", {H, Q}, 0.0f, kOGain * inv_sqrt(Q));
    normal(p + ".self_attn.o_proj.bias", {H}, 0.0f, kOBiasStd);
    normal(p + ".self_attn.sinks", {c.num_attention_heads}, 0.0f, kSinkStd);
    normal(p + ".post_attention_layernorm.weight", {H}, 1.0f, kNormNoise);
    normal(p + ".mlp.router.weight", {E, H}, 0.0f, kRouterGain * inv_sqrt(H));
    normal(p + ".mlp.router.bias", {E}, 0.0f, kRouterBiasStd);
    mxfp4(p + ".mlp.experts.gate_up_proj", 2 * I, H, kMlp1Gain, kMlp1BiasStd);
    mxfp4(p + ".mlp.experts.down_proj", H, I, kMlp2Gain, kMlp2BiasStd);
  }
  // As in the hub checkpoints, embeddings, final norm and lm_head come last (the last shard).
  normal("model.embed_tokens.weight", {V, H}, 0.0f, kEmbedStd);
  normal("model.norm.weight", {H}, 1.0f, kNormNoise);
  normal("lm_head.weight", {V, H}, 0.0f, kLmHeadGain * inv_sqrt(H));

  for (auto& p : plan) {
    p.key = tensor_key(seed, p.name);
    p.nbytes = dtype_size(p.dtype);
    for (auto d : p.shape) p.nbytes *= size_t(d);
  }
  return plan;
}

// Contiguous runs of tensors, about total/N bytes each, every shard non-empty.
void assign_shards(std::vector<Plan>& plan, int shards) {
  size_t total = 0;
  for (const auto& p : plan) total += p.nbytes;
  int shard = 0, in_shard = 0;
  size_t before = 0;  // bytes of the tensors placed so far
  for (size_t i = 0; i < plan.size(); ++i) {
    const size_t left = plan.size() - i;  // tensors still to place, this one included
    const bool past_target = double(before) >= double(total) * (shard + 1) / shards;
    const bool must_move = left == size_t(shards - 1 - shard);
    if (in_shard > 0 && shard + 1 < shards && (past_target || must_move)) {
      ++shard;
      in_shard = 0;
    }
    plan[i].shard = shard;
    ++in_shard;
    before += plan[i].nbytes;
  }
}

// Bytes [off, off + n) of tensor `p` into out. off and n are multiples of the element size.
void fill_range(const Plan& p, size_t off, size_t n, uint8_t* out) {
  switch (p.fill) {
    case Fill::Normal: {
      const size_t first = off / 2, count = n / 2;
      for (size_t i = 0; i < count; ++i) {
        const float v = p.mean + p.std * approx_normal(draw(p.key, first + i));
        const uint16_t b = float_to_bf16(v);
        std::memcpy(out + 2 * i, &b, 2);  // safetensors is little-endian, as is the host
      }
      break;
    }
    case Fill::RandomBytes: {
      // Byte b is byte (b mod 8) of draw(key, b / 8), least significant first.
      size_t b = off;
      const size_t end = off + n;
      for (; b < end && b % 8 != 0; ++b) out[b - off] = uint8_t(draw(p.key, b / 8) >> (8 * (b % 8)));
      for (; b + 8 <= end; b += 8) {
        const uint64_t r = draw(p.key, b / 8);
        std::memcpy(out + (b - off), &r, 8);
      }
      for (; b < end; ++b) out[b - off] = uint8_t(draw(p.key, b / 8) >> (8 * (b % 8)));
      break;
    }
    case Fill::Scales: {
      const uint8_t lo = p.scale_lo, hi = uint8_t(p.scale_lo + 1);
      for (size_t i = 0; i < n; ++i) {
        const double u = double(draw(p.key, off + i) >> 11) * 0x1p-53;
        out[i] = u < p.p_up ? hi : lo;
      }
      break;
    }
  }
}
static_assert(std::endian::native == std::endian::little,
              "the memcpy fast paths above write little-endian safetensors data");

// Fills a chunk with every available thread; sub-blocks are independent, so the result does
// not depend on the number of threads.
void fill_chunk(const Plan& p, size_t off, size_t n, uint8_t* out) {
  constexpr size_t kSub = size_t(1) << 16;  // a multiple of 8 and of every element size
  const int64_t pieces = int64_t((n + kSub - 1) / kSub);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t o = size_t(k) * kSub;
    fill_range(p, off + o, std::min(kSub, n - o), out + o);
  }
}

// "\r 37.5%  5.16 / 13.76 GB  612 MB/s" on stderr, redrawn at most ten times a second.
class Progress {
 public:
  Progress(bool on, size_t total) : on_(on), total_(total), start_(Clock::now()), last_(start_) {}
  void add(size_t n) {
    done_ += n;
    if (!on_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done_ < total_) return;
    last_ = now;
    draw(now);
  }
  void finish() {
    if (!on_) return;
    draw(Clock::now());
    std::fputc('\n', stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void draw(Clock::time_point now) {
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\rparity-synth: %5.1f%%  %6.2f / %.2f GB  %6.0f MB/s ",
                 total_ ? 100.0 * double(done_) / double(total_) : 100.0, double(done_) / 1e9,
                 double(total_) / 1e9, s > 0 ? double(done_) / 1e6 / s : 0.0);
    std::fflush(stderr);
  }
  bool on_;
  size_t total_, done_ = 0;
  Clock::time_point start_, last_;
};

std::string shard_name(int i, int n) {
  return n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

// Writes `text` to path via a temporary name, so the file appears only when complete.
void write_text_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot create ({})", tmp.string(), std::strerror(errno));
    out << text;
    out.close();
    if (!out) fail("{}: write failed ({})", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename into place ({})", path.string(), ec.message());
}

void remove_file(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  if (ec) fail("{}: cannot remove the earlier synthetic file ({})", p.string(), ec.message());
}

// The output directory may be empty, or hold an earlier parity-synth output (config.json with a
// "parity_synth" entry, or the leftovers of an interrupted run without config.json): those
// files are removed, config.json first so the directory never looks like a complete model while
// it is being rewritten. A config.json written by anything else means a real checkpoint, which
// is never overwritten.
void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    fail("{}: cannot create the output directory ({})", dir.string(), ec ? ec.message() : "not a directory");
  const fs::path cfg = dir / "config.json";
  if (fs::exists(cfg)) {
    json j;
    std::ifstream in(cfg);
    try {
      j = json::parse(in);
    } catch (const json::parse_error&) {
      j = nullptr;
    }
    if (!j.is_object() || !j.contains("parity_synth"))
      fail("{}: holds a checkpoint that parity-synth did not write (its config.json has no "
           "\"parity_synth\" entry); refusing to overwrite it. Choose an empty --out directory.",
           dir.string());
    remove_file(cfg);
  }
  static const std::regex ours(
      R"((model-\d{5}-of-\d{5}\.safetensors|model\.safetensors|model\.safetensors\.index\.json|config\.json)(\.partial)?)");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), ours)) remove_file(e.path());
}

Config base_config() {
  Config c;
  c.rope_theta = 150000.0;
  c.rope_type = "yarn";
  c.rope_factor = 32.0;
  c.rope_beta_fast = 32.0;
  c.rope_beta_slow = 1.0;
  c.rope_original_max_position = 4096;
  c.rope_truncate = false;
  c.rms_norm_eps = 1e-5;
  c.swiglu_limit = 7.0;
  c.initial_context_length = 4096;
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.quant_method = "mxfp4";
  return c;
}

}  // namespace

SynthSpec synth_preset(const std::string& name) {
  SynthSpec s;
  s.preset = name;
  Config c = base_config();
  if (name == "tiny") {
    c.vocab_size = 1024;
    c.hidden_size = 64;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 64;
    c.num_local_experts = 8;
    c.num_experts_per_tok = 4;
    c.sliding_window = 8;
    c.max_position_embeddings = 4096;
    s.shards = 2;
  } else if (name == "20b" || name == "120b") {
    // The real shapes (gpt-oss spec section 1, the hub config.json files).
    const bool big = name == "120b";
    c.vocab_size = 201088;
    c.hidden_size = 2880;
    c.num_hidden_layers = big ? 36 : 24;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.intermediate_size = 2880;
    c.num_local_experts = big ? 128 : 32;
    c.num_experts_per_tok = 4;
    c.sliding_window = 128;
    c.max_position_embeddings = 131072;
    c.eos_token_id = 200002;
    c.pad_token_id = 199999;
    s.shards = big ? 15 : 3;
  } else {
    fail("unknown synthetic preset \"{}\" (tiny, 20b, 120b)", name);
  }
  // gpt-oss alternates sliding and full attention, starting with sliding (spec section 1).
  c.layer_is_sliding.clear();
  for (int l = 0; l < c.num_hidden_layers; ++l) c.layer_is_sliding.push_back(l % 2 == 0);
  c.validate("synthetic preset " + name);
  s.config = c;
  return s;
}

SynthResult write_synthetic_checkpoint(const SynthSpec& spec, const std::string& out_dir,
                                       bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const Config& c = spec.config;
  const std::string what = "synthetic checkpoint (" + spec.preset + ")";
  c.validate(what);
  if (c.hidden_size % kMxfp4Block != 0 || c.intermediate_size % kMxfp4Block != 0)
    fail("{}: hidden_size ({}) and intermediate_size ({}) must be multiples of 32, the MXFP4 "
         "block size along the experts' input dimension",
         what, c.hidden_size, c.intermediate_size);

  std::vector<Plan> plan = make_plan(c, spec.seed);
  if (spec.shards < 1 || size_t(spec.shards) > plan.size())
    fail("{}: {} shards requested; between 1 and {} (one tensor per shard at least)", what,
         spec.shards, plan.size());
  assign_shards(plan, spec.shards);

  const fs::path dir(out_dir);
  prepare_out_dir(dir);

  size_t total = 0;
  for (const auto& p : plan) total += p.nbytes;
  Progress bar(progress, total);

  // Two chunk buffers: one is filled (all threads) while the other is being written.
  constexpr size_t kChunk = size_t(32) << 20;
  std::vector<uint8_t> buf[2] = {std::vector<uint8_t>(kChunk), std::vector<uint8_t>(kChunk)};

  json weight_map = json::object();
  std::vector<std::string> files;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"generator", fmt::format("parity-synth {} seed {}", spec.preset, spec.seed)}};
  for (int s = 0; s < spec.shards; ++s) {
    files.push_back(shard_name(s, spec.shards));
    std::vector<SafetensorsWriter::Decl> decls;
    for (const auto& p : plan)
      if (p.shard == s) {
        decls.push_back({p.name, p.dtype, p.shape});
        weight_map[p.name] = files.back();
      }
    SafetensorsWriter writer((dir / files.back()).string(), decls, metadata);
    // Declared after the writer: if anything throws, the future's destructor waits for the
    // write in flight before the writer goes away.
    std::future<void> pending;
    int cur = 0;
    for (const auto& p : plan) {
      if (p.shard != s) continue;
      for (size_t off = 0; off < p.nbytes; off += kChunk) {
        const size_t n = std::min(kChunk, p.nbytes - off);
        uint8_t* data = buf[cur].data();
        fill_chunk(p, off, n, data);
        if (pending.valid()) pending.get();  // rethrows a write failure
        pending = std::async(std::launch::async, [&writer, &bar, data, n] {
          writer.write(data, n);
          bar.add(n);
        });
        cur ^= 1;
      }
    }
    if (pending.valid()) pending.get();
    writer.finish();
  }
  bar.finish();

  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  if (spec.shards > 1) {
    write_text_file(dir / "model.safetensors.index.json", index.dump(2) + "\n");
    files.push_back("model.safetensors.index.json");
  }
  // config.json last: its presence is what marks a complete checkpoint (tools/common.cpp).
  json cj = c.to_json();
  cj["parity_synth"] = {{"preset", spec.preset}, {"seed", spec.seed}, {"generator_version", kGeneratorVersion}};
  write_text_file(dir / "config.json", cj.dump(2) + "\n");
  files.push_back("config.json");

  SynthResult r;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(dir / f, ec);
    if (!ec) r.bytes += size;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace parity
