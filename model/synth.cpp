// Deterministic synthetic gpt-oss checkpoints (see model/synth.h).
//
// Every byte is a pure function of (seed, magnitudes, tensor name, element index): a counter-based
// RNG (the splitmix64 finalizer over key + i * golden-gamma, which is splitmix64's own stream) so
// the output does not depend on the thread count or on how the tensor is cut into chunks. Data
// is generated in chunks of a few tens of MB (OpenMP over sub-blocks of a chunk) and streamed
// through SafetensorsWriter while the next chunk is generated, so a 13.8 GB model never sits
// in memory and the disk, not the generator, sets the pace.
#include "model/synth.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
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

// ---- Weight scales: unit magnitudes -----------------------------------------------------------
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

// ---- Weight scales: realistic magnitudes ------------------------------------------------------
// Real checkpoints are not O(1) everywhere, and a fixed tolerance that passes on O(1)
// activations can fail on them. These scales give the magnitudes real gpt-oss (and LLMs
// generally) have; the figures are measured with the float64 reference by
// `parity-synth --magnitudes realistic` (tiny, and 2880 wide with 24 and 36 layers):
//  * Embedding rows of RMS 0.03: the first RMSNorm divides by ~0.03, and its eps (1e-5 against
//    a mean square of 9e-4) moves its output by ~0.5%, so an eps bug shows.
//  * Norm weights lognormal, median 2.4 and sigma 0.45 (mean ~2.6, up to ~10 in a 2880-wide
//    norm), 2% of the channels near zero (0.1 +- 0.025), none negative (nothing here needs a
//    sign flip, and real ones are rare). The exponential is pinned_exp(), so the bytes do not
//    depend on the libm.
//  * Massive activations: three residual channels, drawn from the seed and the same in every
//    layer, reach +160, -240 and +360: half through layer 0's down_proj bias (the same value
//    +-5% in every expert; the routing weights sum to 1, so the MoE output carries it whatever
//    the routing), half through layer 1's o_proj bias. Later layers leave them alone and they
//    persist, as real ones do; every other channel stays O(1).
//  * From layer 1 on the outliers dominate every RMSNorm's mean square (~70 against an ordinary
//    channel's 2 to 12 at H = 2880; ~3300 against ~3 at H = 64), so the ordinary channels leave
//    the norm 3 to 40 times smaller than the norm weights alone would make them. Compensated as
//    real models do: a norm that sees the outliers gives them a weight that brings them to an
//    ordinary channel's normalized size (0.002 to 0.01), so they do not swamp q/k, the router
//    or mlp1; and each projection reading a norm gets the gain that restores its output std,
//    computed from the RMS that norm's output is expected to have under a model of the
//    residual (RealisticResidual: an ordinary channel starts at the embedding's RMS and each
//    branch adds its RMS in quadrature; the outliers add their squares to the mean square).
//    While the outliers dominate, a norm no longer normalizes: a branch larger than the model
//    says makes the next norm's output larger too, and the MoE (SwiGLU is near quadratic)
//    amplifies that. So the branch sizes are measured, not guessed, and kept small against the
//    residual: the residual's ordinary RMS ends within ~15% of the model's (20b: 2.5 against
//    3.0; 36 layers of 2880 with 8 experts: 3.3 against 3.5).
//  * Layer 0 is what real first layers are: its attention writes at RMS 0.02 (below the
//    embedding's 0.03) and its MoE at RMS 1.5, an extended embedding, so the residual carries
//    the token's identity (the norm inputs vary from token to token for 62-97% of their mean
//    square; a residual made of attention averages over the same context would not, and
//    routing would collapse onto a few experts). Later layers: attention 0.3 (the attention
//    output has RMS ~kRealAttnOutRms, mostly the v bias that averaging over keys keeps) plus an
//    o_proj bias of std 0.2; MoE 0.4 (the routed mix of experts has RMS ~5 times mlp2's gain
//    when mlp1 has std 3.3) plus a down_proj bias of std 0.2.
//  * q/k/v: weight part std 1 plus biases of std 0.6; the biases turn with the position under
//    RoPE, so the scores get a relative-position pattern. Scores have std ~1.5-2: attention
//    neither uniform nor one-hot.
//  * Sinks N(2, 1.5): they take 20-50% of the attention over 16 to 32 positions.
//  * Router: logits std ~1.5 plus bias std 0.2: no expert takes everything (20b, 32 positions:
//    20 to 31 of the 32 experts used per layer, the busiest taking at most 18%).
//  * mlp1: std ~3.3 plus bias std 0.5: gate > 7 on ~1-2.5%, |linear| > 7 on ~2-5%.
//  * lm_head: logits std ~2.5.
constexpr float kRealEmbedStd = 0.03f;
constexpr double kRealNormMedian = 2.4, kRealNormSigma = 0.45;
constexpr double kRealNormSmallShare = 0.02, kRealNormSmall = 0.1, kRealNormSmallStd = 0.025;
constexpr double kRealOutlierPostNorm = 1.0;  // outlier channels after a norm, in ordinary RMS
constexpr double kRealOutlierValues[] = {160.0, -240.0, 360.0};
constexpr double kRealOutlierBiasSpread = 0.05;  // relative, per expert
constexpr double kRealQkvGain = 1.0, kRealQkvBiasStd = 0.6;
constexpr float kRealSinkMean = 2.0f, kRealSinkStd = 1.5f;
constexpr double kRealAttnOutRms = 0.75;
constexpr double kRealOBiasStd = 0.2;
constexpr double kRealRouterGain = 1.5, kRealRouterBiasStd = 0.2;
constexpr double kRealMlp1Gain = 3.3, kRealMlp1BiasStd = 0.5;
constexpr double kRealMoeRmsPerMlp2Gain = 5.0, kRealMlp2BiasStd = 0.2;
constexpr double kRealLmHeadGain = 2.5;
constexpr double kRealAttnBranchRms = 0.3, kRealLayer0AttnRms = 0.02;
constexpr double kRealMoeBranchRms = 0.4, kRealLayer0MoeRms = 1.5;

// ---- Counter-based RNG -----------------------------------------------------------------------
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {  // splitmix64 finalizer (Stafford variant 13)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// The i-th output of the splitmix64 stream seeded with `key`.
inline uint64_t draw(uint64_t key, uint64_t i) {
  return mix64(key + (i + 1) * kGamma);
}

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

// A uniform in [0, 1) from one 64-bit draw (53 bits, exact in double).
inline double uniform01(uint64_t r) {
  return double(r >> 11) * 0x1p-53;
}

// e^x from + and x only, for |x| up to a few units: a degree-4 Taylor polynomial at x / 2^10,
// then ten squarings (relative error ~1e-12, far below BF16's rounding). std::exp is not pinned
// by IEEE, so its last bit could differ between libms and, rarely, flip a BF16 rounding.
inline double pinned_exp(double x) {
  const double y = x / 1024.0;
  double e = 1.0 + y * (1.0 + y * (1.0 / 2.0 + y * (1.0 / 6.0 + y * (1.0 / 24.0))));
  for (int i = 0; i < 10; ++i) e *= e;
  return e;
}

// ---- The tensor plan -------------------------------------------------------------------------
enum class Fill {
  Normal,       // BF16: mean + std * N(0,1)
  LogNormal,    // BF16: mean * e^(std * N(0,1)), or near zero on a share of the elements
  RandomBytes,  // U8 MXFP4 blocks: every nibble uniform over the 16 FP4 codes
  Scales,       // U8 E8M0 scales: scale_lo, or scale_lo + 1 with probability p_up
};

// Elements in one column (index along the last dimension) drawn as mean + std * N(0,1) instead
// of the tensor's own fill: the massive-activation channels of realistic magnitudes.
struct ColumnOverride {
  int64_t column = 0;
  float mean = 0, std = 0;
};

struct Plan {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  Fill fill = Fill::Normal;
  float mean = 0, std = 0;
  double small_share = 0;                // LogNormal: share of elements near zero
  double small_mean = 0, small_std = 0;  // LogNormal: those elements, mean + std * N(0,1)
  std::vector<ColumnOverride> columns;
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
    fail("synthetic checkpoint: tensor {} needs an MXFP4 scale 2^{}, outside E8M0's range", name,
         e);
  *lo = uint8_t(127 + e);
  *p_up = (r * r - 1.0) / 3.0;
}

// Appends the tensors of a plan in file order; keys and sizes are set by finish().
class PlanBuilder {
 public:
  explicit PlanBuilder(const Config& c) : experts_(c.num_local_experts) {}

  Plan& normal(std::string name, std::vector<int64_t> shape, float mean, float std) {
    Plan p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.mean = mean;
    p.std = std;
    plan_.push_back(std::move(p));
    return plan_.back();
  }
  Plan& lognormal(std::string name, std::vector<int64_t> shape, double median, double sigma) {
    Plan& p = normal(std::move(name), std::move(shape), float(median), float(sigma));
    p.fill = Fill::LogNormal;
    return p;
  }
  // Blocks and scales of RMS gain / sqrt(in), then the bias; returns the bias.
  Plan& mxfp4(const std::string& prefix, int64_t out, int64_t in, double gain, float bias_std) {
    Plan b;
    b.name = prefix + "_blocks";
    b.dtype = DType::U8;
    b.shape = {experts_, out, in / kMxfp4Block, kMxfp4BlockBytes};
    b.fill = Fill::RandomBytes;
    plan_.push_back(b);
    Plan s;
    s.name = prefix + "_scales";
    s.dtype = DType::U8;
    s.shape = {experts_, out, in / kMxfp4Block};
    s.fill = Fill::Scales;
    mxfp4_scale_for(gain / std::sqrt(double(in)), s.name, &s.scale_lo, &s.p_up);
    plan_.push_back(s);
    return normal(prefix + "_bias", {experts_, out}, 0.0f, bias_std);
  }

  std::vector<Plan> finish(uint64_t seed) {
    for (auto& p : plan_) {
      p.key = tensor_key(seed, p.name);
      p.nbytes = dtype_size(p.dtype);
      for (auto d : p.shape) p.nbytes *= size_t(d);
    }
    return std::move(plan_);
  }

 private:
  int64_t experts_;
  std::vector<Plan> plan_;
};

float inv_sqrt(int64_t n) {
  return float(1.0 / std::sqrt(double(n)));
}

std::vector<Plan> make_unit_plan(const Config& c, uint64_t seed) {
  PlanBuilder b(c);
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts,
                V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    b.normal(p + ".input_layernorm.weight", {H}, 1.0f, kNormNoise);
    b.normal(p + ".self_attn.q_proj.weight", {Q, H}, 0.0f, kQkvGain * inv_sqrt(H));
    b.normal(p + ".self_attn.q_proj.bias", {Q}, 0.0f, kQkvBiasStd);
    b.normal(p + ".self_attn.k_proj.weight", {KV, H}, 0.0f, kQkvGain * inv_sqrt(H));
    b.normal(p + ".self_attn.k_proj.bias", {KV}, 0.0f, kQkvBiasStd);
    b.normal(p + ".self_attn.v_proj.weight", {KV, H}, 0.0f, kQkvGain * inv_sqrt(H));
    b.normal(p + ".self_attn.v_proj.bias", {KV}, 0.0f, kQkvBiasStd);
    b.normal(p + ".self_attn.o_proj.weight", {H, Q}, 0.0f, kOGain * inv_sqrt(Q));
    b.normal(p + ".self_attn.o_proj.bias", {H}, 0.0f, kOBiasStd);
    b.normal(p + ".self_attn.sinks", {c.num_attention_heads}, 0.0f, kSinkStd);
    b.normal(p + ".post_attention_layernorm.weight", {H}, 1.0f, kNormNoise);
    b.normal(p + ".mlp.router.weight", {E, H}, 0.0f, kRouterGain * inv_sqrt(H));
    b.normal(p + ".mlp.router.bias", {E}, 0.0f, kRouterBiasStd);
    b.mxfp4(p + ".mlp.experts.gate_up_proj", 2 * I, H, kMlp1Gain, kMlp1BiasStd);
    b.mxfp4(p + ".mlp.experts.down_proj", H, I, kMlp2Gain, kMlp2BiasStd);
  }
  // As in the hub checkpoints, embeddings, final norm and lm_head come last (the last shard).
  b.normal("model.embed_tokens.weight", {V, H}, 0.0f, kEmbedStd);
  b.normal("model.norm.weight", {H}, 1.0f, kNormNoise);
  b.normal("lm_head.weight", {V, H}, 0.0f, kLmHeadGain * inv_sqrt(H));
  return b.finish(seed);
}

std::vector<SynthOutlier> outliers_for(const Config& c, uint64_t seed) {
  std::vector<SynthOutlier> out;
  const uint64_t key = tensor_key(seed, "massive activation channels");
  for (uint64_t i = 0;
       out.size() < std::size(kRealOutlierValues) && int(out.size()) < c.hidden_size; ++i) {
    const int channel = int(draw(key, i) % uint64_t(c.hidden_size));
    if (std::none_of(out.begin(), out.end(),
                     [&](const SynthOutlier& o) { return o.channel == channel; }))
      out.push_back({channel, kRealOutlierValues[out.size()]});
  }
  return out;
}

// What enters one RMSNorm, in the realistic design's model of the residual stream: the mean
// square of an ordinary channel, and the share of each outlier value pushed in so far.
struct NormInput {
  double ordinary_ms = 0;
  double share = 0;
};

// The model (see the scales above): an ordinary channel starts at the embedding's RMS and each
// branch adds its RMS in quadrature; the outliers are pushed by layer 0's MoE and layer 1's
// attention. From it, the weights of the outlier channels in each norm and the RMS of each
// norm's output, which the projections reading it divide their target std by.
class RealisticResidual {
 public:
  RealisticResidual(const Config& c, std::vector<SynthOutlier> outliers)
      : c_(c), outliers_(std::move(outliers)) {}

  static double pushed_by_moe(int layer) { return layer == 0 ? 0.5 : 0.0; }
  static double pushed_by_attention(int layer) { return layer == 1 ? 0.5 : 0.0; }
  static double attention_rms(int layer) {
    return layer == 0 ? kRealLayer0AttnRms : kRealAttnBranchRms;
  }
  static double o_bias_std(int layer) {
    return std::min(1.0, attention_rms(layer) / kRealAttnBranchRms) * kRealOBiasStd;
  }
  // The attention branch with its bias, which is not in attention_rms.
  static double attention_ms(int layer) {
    return attention_rms(layer) * attention_rms(layer) + o_bias_std(layer) * o_bias_std(layer);
  }
  static double moe_rms(int layer) { return layer == 0 ? kRealLayer0MoeRms : kRealMoeBranchRms; }

  static NormInput attn_norm_input(int layer) {
    NormInput in;
    in.ordinary_ms = double(kRealEmbedStd) * double(kRealEmbedStd);
    for (int l = 0; l < layer; ++l) {
      in.ordinary_ms += attention_ms(l) + moe_rms(l) * moe_rms(l);
      in.share += pushed_by_attention(l) + pushed_by_moe(l);
    }
    return in;
  }
  static NormInput ffn_norm_input(int layer) {
    NormInput in = attn_norm_input(layer);
    in.ordinary_ms += attention_ms(layer);
    in.share += pushed_by_attention(layer);
    return in;
  }
  NormInput final_norm_input() const { return attn_norm_input(c_.num_hidden_layers); }

  // A norm that sees the outliers scales them down to about an ordinary channel's normalized
  // value (kRealOutlierPostNorm of it), so they do not swamp the projections after it.
  static double outlier_weight(const NormInput& in, const SynthOutlier& o) {
    return kRealOutlierPostNorm * std::sqrt(in.ordinary_ms) / (in.share * std::fabs(o.value));
  }

  double norm_output_rms(const NormInput& in) const {
    const double H = c_.hidden_size, n = in.share > 0 ? double(outliers_.size()) : 0.0;
    double outlier_ms = 0, outlier_out = 0;  // sums over the outlier channels
    if (in.share > 0)
      for (const auto& o : outliers_) {
        const double x = in.share * o.value, w = outlier_weight(in, o);
        outlier_ms += x * x;
        outlier_out += x * x * w * w;
      }
    const double ms = ((H - n) * in.ordinary_ms + outlier_ms) / H;
    const double inv_sq = 1.0 / (ms + c_.rms_norm_eps);
    // E[w^2] of the ordinary norm weights: lognormal (E[e^(2 sigma N)] = e^(2 sigma^2)) or small.
    const double weight_sq = (1.0 - kRealNormSmallShare) * kRealNormMedian * kRealNormMedian *
                                 pinned_exp(2.0 * kRealNormSigma * kRealNormSigma) +
                             kRealNormSmallShare * (kRealNormSmall * kRealNormSmall +
                                                    kRealNormSmallStd * kRealNormSmallStd);
    return std::sqrt(((H - n) * in.ordinary_ms * weight_sq + outlier_out) * inv_sq / H);
  }

 private:
  const Config& c_;
  std::vector<SynthOutlier> outliers_;
};

std::vector<Plan> make_realistic_plan(const Config& c, uint64_t seed) {
  PlanBuilder b(c);
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts,
                V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  const std::vector<SynthOutlier> outliers = outliers_for(c, seed);
  const RealisticResidual residual(c, outliers);
  const double root_h = std::sqrt(double(H));

  auto norm = [&](const std::string& name, const NormInput& in) {
    Plan& p = b.lognormal(name, {H}, kRealNormMedian, kRealNormSigma);
    p.small_share = kRealNormSmallShare;
    p.small_mean = kRealNormSmall;
    p.small_std = kRealNormSmallStd;
    if (in.share > 0)
      for (const auto& o : outliers) {
        const double w = RealisticResidual::outlier_weight(in, o);
        p.columns.push_back({o.channel, float(w), float(0.1 * w)});
      }
  };
  // The share `share` of each outlier value, the same +-spread in every row (expert).
  auto push_outliers = [&](Plan& bias, double share, double spread) {
    for (const auto& o : outliers)
      bias.columns.push_back(
          {o.channel, float(share * o.value), float(spread * std::fabs(share * o.value))});
  };

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const NormInput attn_in = RealisticResidual::attn_norm_input(l);
    const double qkv_std = kRealQkvGain / (residual.norm_output_rms(attn_in) * root_h);
    const double attn_rms = RealisticResidual::attention_rms(l);
    norm(p + ".input_layernorm.weight", attn_in);
    b.normal(p + ".self_attn.q_proj.weight", {Q, H}, 0.0f, float(qkv_std));
    b.normal(p + ".self_attn.q_proj.bias", {Q}, 0.0f, float(kRealQkvBiasStd));
    b.normal(p + ".self_attn.k_proj.weight", {KV, H}, 0.0f, float(qkv_std));
    b.normal(p + ".self_attn.k_proj.bias", {KV}, 0.0f, float(kRealQkvBiasStd));
    b.normal(p + ".self_attn.v_proj.weight", {KV, H}, 0.0f, float(qkv_std));
    b.normal(p + ".self_attn.v_proj.bias", {KV}, 0.0f, float(kRealQkvBiasStd));
    b.normal(p + ".self_attn.o_proj.weight", {H, Q}, 0.0f,
             float(attn_rms / kRealAttnOutRms) * inv_sqrt(Q));
    Plan& o_bias =
        b.normal(p + ".self_attn.o_proj.bias", {H}, 0.0f, float(RealisticResidual::o_bias_std(l)));
    if (const double share = RealisticResidual::pushed_by_attention(l); share > 0)
      push_outliers(o_bias, share, 0.0);
    b.normal(p + ".self_attn.sinks", {c.num_attention_heads}, kRealSinkMean, kRealSinkStd);
    const NormInput ffn_in = RealisticResidual::ffn_norm_input(l);
    const double ffn_rms = residual.norm_output_rms(ffn_in);
    norm(p + ".post_attention_layernorm.weight", ffn_in);
    b.normal(p + ".mlp.router.weight", {E, H}, 0.0f, float(kRealRouterGain / (ffn_rms * root_h)));
    b.normal(p + ".mlp.router.bias", {E}, 0.0f, float(kRealRouterBiasStd));
    b.mxfp4(p + ".mlp.experts.gate_up_proj", 2 * I, H, kRealMlp1Gain / ffn_rms,
            float(kRealMlp1BiasStd));
    Plan& down_bias =
        b.mxfp4(p + ".mlp.experts.down_proj", H, I,
                RealisticResidual::moe_rms(l) / kRealMoeRmsPerMlp2Gain, float(kRealMlp2BiasStd));
    if (const double share = RealisticResidual::pushed_by_moe(l); share > 0)
      push_outliers(down_bias, share, kRealOutlierBiasSpread);
  }
  b.normal("model.embed_tokens.weight", {V, H}, 0.0f, kRealEmbedStd);
  const NormInput final_in = residual.final_norm_input();
  norm("model.norm.weight", final_in);
  b.normal("lm_head.weight", {V, H}, 0.0f,
           float(kRealLmHeadGain / (residual.norm_output_rms(final_in) * root_h)));
  return b.finish(seed);
}

std::vector<Plan> make_plan(const SynthSpec& spec) {
  switch (spec.magnitudes) {
    case SynthMagnitudes::unit:
      return make_unit_plan(spec.config, spec.seed);
    case SynthMagnitudes::realistic:
      return make_realistic_plan(spec.config, spec.seed);
  }
  fail("synthetic checkpoint: unknown magnitudes {}", int(spec.magnitudes));
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

const ColumnOverride* column_override(const Plan& p, size_t element) {
  if (p.columns.empty()) return nullptr;
  const int64_t column = int64_t(element % size_t(p.shape.back()));
  for (const auto& c : p.columns)
    if (c.column == column) return &c;
  return nullptr;
}

// Bytes [off, off + n) of tensor `p` into out. off and n are multiples of the element size.
void fill_range(const Plan& p, size_t off, size_t n, uint8_t* out) {
  switch (p.fill) {
    case Fill::Normal: {
      const size_t first = off / 2, count = n / 2;
      for (size_t i = 0; i < count; ++i) {
        const ColumnOverride* col = column_override(p, first + i);
        const float mean = col ? col->mean : p.mean, sd = col ? col->std : p.std;
        const float v = mean + sd * approx_normal(draw(p.key, first + i));
        const uint16_t b = float_to_bf16(v);
        std::memcpy(out + 2 * i, &b, 2);  // safetensors is little-endian, as is the host
      }
      break;
    }
    case Fill::LogNormal: {
      // The near-zero choice comes from a second stream, so it is independent of the value.
      const uint64_t choice_key = mix64(p.key ^ 0x6c6f676e6f726d31ull);
      const size_t first = off / 2, count = n / 2;
      for (size_t i = 0; i < count; ++i) {
        const size_t e = first + i;
        const double z = approx_normal(draw(p.key, e));
        double v;
        if (const ColumnOverride* col = column_override(p, e))
          v = col->mean + col->std * z;
        else if (uniform01(draw(choice_key, e)) < p.small_share)
          v = p.small_mean + p.small_std * z;
        else
          v = p.mean * pinned_exp(p.std * z);
        const uint16_t b = float_to_bf16(float(v));
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    }
    case Fill::RandomBytes: {
      // Byte b is byte (b mod 8) of draw(key, b / 8), least significant first.
      size_t b = off;
      const size_t end = off + n;
      for (; b < end && b % 8 != 0; ++b)
        out[b - off] = uint8_t(draw(p.key, b / 8) >> (8 * (b % 8)));
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
        const double u = uniform01(draw(p.key, off + i));
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
  auto give_up = [&](const std::string& what) {
    std::error_code ignored;
    fs::remove(tmp, ignored);  // a failed write leaves nothing behind
    fail("{}: {}", tmp.string(), what);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) give_up(fmt::format("cannot create ({})", std::strerror(errno)));
    errno = 0;
    out << text;
    out.close();
    if (!out)
      give_up(fmt::format("write failed ({})", errno != 0 ? std::strerror(errno) : "no reason given"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) give_up(fmt::format("cannot rename into place ({})", ec.message()));
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
    fail("{}: cannot create the output directory ({})", dir.string(),
         ec ? ec.message() : "not a directory");
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
      fail(
          "{}: holds a checkpoint that parity-synth did not write (its config.json has no "
          "\"parity_synth\" entry); refusing to overwrite it. Choose an empty --out directory.",
          dir.string());
    remove_file(cfg);
  }
  static const std::regex ours(
      R"((model-\d{5}-of-\d{5}\.safetensors|model\.safetensors|model\.safetensors\.index\.json|config\.json)(\.partial)?)");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), ours))
      remove_file(e.path());
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

std::string_view synth_magnitudes_name(SynthMagnitudes m) {
  switch (m) {
    case SynthMagnitudes::unit:
      return "unit";
    case SynthMagnitudes::realistic:
      return "realistic";
  }
  return "?";
}

SynthMagnitudes parse_synth_magnitudes(std::string_view name) {
  for (auto m : {SynthMagnitudes::unit, SynthMagnitudes::realistic})
    if (name == synth_magnitudes_name(m)) return m;
  fail("unknown synthetic magnitudes \"{}\" (unit, realistic)", name);
}

std::vector<SynthOutlier> synth_outliers(const SynthSpec& spec) {
  if (spec.magnitudes == SynthMagnitudes::unit) return {};
  return outliers_for(spec.config, spec.seed);
}

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
    fail(
        "{}: hidden_size ({}) and intermediate_size ({}) must be multiples of 32, the MXFP4 "
        "block size along the experts' input dimension",
        what, c.hidden_size, c.intermediate_size);

  std::vector<Plan> plan = make_plan(spec);
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
  // Unit magnitudes keep the generator string (and so the bytes) of the files written before
  // the choice existed.
  std::string generator = fmt::format("parity-synth {} seed {}", spec.preset, spec.seed);
  if (spec.magnitudes != SynthMagnitudes::unit)
    generator += fmt::format(" magnitudes {}", synth_magnitudes_name(spec.magnitudes));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"generator", generator}};
  // A run that fails half way (a full disk) removes the files it wrote: a directory of some
  // shards and no config.json is no checkpoint, only space taken.
  struct RemoveUnlessDone {
    const fs::path& dir;
    const std::vector<std::string>& files;
    bool done = false;
    ~RemoveUnlessDone() {
      if (done) return;
      std::error_code ec;
      for (const std::string& f : files) fs::remove(dir / f, ec);
    }
  } written{dir, files};
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
  cj["parity_synth"] = {
      {"preset", spec.preset}, {"seed", spec.seed}, {"generator_version", kGeneratorVersion}};
  // Absent means unit, as in every config.json written before the choice existed: unit output
  // stays byte-identical.
  if (spec.magnitudes != SynthMagnitudes::unit)
    cj["parity_synth"]["magnitudes"] = synth_magnitudes_name(spec.magnitudes);
  write_text_file(dir / "config.json", cj.dump(2) + "\n");
  files.push_back("config.json");
  written.done = true;

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
