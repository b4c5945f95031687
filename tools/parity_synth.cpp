// parity-synth: writes a deterministic synthetic gpt-oss checkpoint in the hub layout (presets
// tiny, 20b, 120b, or custom dimensions), then runs the float64 reference over a few positions
// and prints the figures that show the model exercises every branch the harness checks: the
// SwiGLU clamp on both halves, routing spread over the experts, the residual stream staying
// O(1) through every layer, and the sinks taking a share of the attention.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <iostream>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "model/synth.h"
#include "reference/cpu_backend.h"
#include "tools/common.h"

namespace parity {
namespace {

// Per-layer figures gathered from the reference forward.
struct LayerStats {
  size_t gate_n = 0, gate_clamped = 0;  // mlp1 even rows: gate > limit
  size_t lin_n = 0, lin_clamped = 0;    // mlp1 odd rows: |linear| > limit
  std::vector<int> expert_count;        // selections per expert over positions x k
  double resid_sq = 0, attn_sq = 0, moe_sq = 0;
  size_t resid_n = 0, attn_n = 0, moe_n = 0;
  double router_sd_sum = 0;  // standard deviation of the router logits, summed over positions
  int router_rows = 0;
  double sink_mass = 0;  // probability the sink column takes, summed over heads and positions
  int sink_rows = 0;
};

class StatsObserver final : public Observer {
 public:
  explicit StatsObserver(const Config& c) : c_(c), layers_(size_t(c.num_hidden_layers)) {
    for (auto& l : layers_) l.expert_count.assign(size_t(c.num_local_experts), 0);
  }

  bool wants(int /*position*/, int /*layer*/, Stage s) const override {
    switch (s) {
      case Stage::mlp1:
      case Stage::topk_idx:
      case Stage::resid_ffn:
      case Stage::o_proj:
      case Stage::moe_out:
      case Stage::router:
      case Stage::att:
      case Stage::embedding:
      case Stage::logits: return true;
      default: return false;
    }
  }

  void record(const StageKey& key, const StageData& d) override {
    if (key.layer == kModelLayer) {
      if (key.stage == Stage::embedding) sum_sq(d, embed_sq_, embed_n_);
      if (key.stage == Stage::logits) {
        double mean = 0, sq = 0;
        for (size_t i = 0; i < d.size(); ++i) mean += d.at(i);
        mean /= double(d.size());
        for (size_t i = 0; i < d.size(); ++i) sq += (d.at(i) - mean) * (d.at(i) - mean);
        logits_sd_sum_ += std::sqrt(sq / double(d.size()));
        ++logits_rows_;
      }
      return;
    }
    LayerStats& l = layers_[size_t(key.layer)];
    const double limit = c_.swiglu_limit;
    switch (key.stage) {
      case Stage::mlp1:  // [k, 2I], interleaved: even = gate, odd = linear
        for (size_t i = 0; i < d.size(); ++i) {
          const double v = d.at(i);
          if (i % 2 == 0) {
            ++l.gate_n;
            l.gate_clamped += v > limit;
          } else {
            ++l.lin_n;
            l.lin_clamped += std::fabs(v) > limit;
          }
        }
        break;
      case Stage::topk_idx:
        for (size_t i = 0; i < d.size(); ++i) ++l.expert_count.at(size_t(d.at(i)));
        break;
      case Stage::resid_ffn: sum_sq(d, l.resid_sq, l.resid_n); break;
      case Stage::o_proj: sum_sq(d, l.attn_sq, l.attn_n); break;
      case Stage::moe_out: sum_sq(d, l.moe_sq, l.moe_n); break;
      case Stage::router: {
        double mean = 0, sq = 0;
        for (size_t i = 0; i < d.size(); ++i) mean += d.at(i);
        mean /= double(d.size());
        for (size_t i = 0; i < d.size(); ++i) sq += (d.at(i) - mean) * (d.at(i) - mean);
        l.router_sd_sum += std::sqrt(sq / double(d.size()));
        ++l.router_rows;
        break;
      }
      case Stage::att: {  // [nH, pos + 2], the sink is the last column
        const size_t heads = d.dims.at(0), cols = d.dims.at(1);
        for (size_t h = 0; h < heads; ++h) l.sink_mass += d.at(h * cols + cols - 1);
        l.sink_rows += int(heads);
        break;
      }
      default: break;
    }
  }

  void print(std::ostream& out) const {
    const int E = c_.num_local_experts;
    out << fmt::format("{:>5} {:>7} {:>9} {:>8} {:>7} {:>9} {:>9} {:>7} {:>7}  {}\n", "layer", "type",
                       "resid_rms", "attn_rms", "moe_rms", "router_sd", "sink_mass", "gate>L",
                       "|lin|>L", E <= 32 ? "selections per expert" : "selections per expert (expert:count, nonzero only)");
    size_t gate_n = 0, gate_c = 0, lin_n = 0, lin_c = 0;
    double used_sum = 0;
    for (size_t L = 0; L < layers_.size(); ++L) {
      const LayerStats& l = layers_[L];
      std::string usage;
      int used = 0;
      for (int e = 0; e < E; ++e) {
        const int n = l.expert_count[size_t(e)];
        used += n > 0;
        if (E <= 32)
          usage += fmt::format("{}{}", e ? " " : "", n);
        else if (n > 0)
          usage += fmt::format("{}{}:{}", usage.empty() ? "" : " ", e, n);
      }
      used_sum += used;
      out << fmt::format("{:>5} {:>7} {:>9.3f} {:>8.3f} {:>7.3f} {:>9.3f} {:>9.3f} {:>6.2f}% {:>6.2f}%  [{}]\n", L,
                         c_.sliding(int(L)) ? "sliding" : "full", rms(l.resid_sq, l.resid_n),
                         rms(l.attn_sq, l.attn_n), rms(l.moe_sq, l.moe_n),
                         l.router_rows ? l.router_sd_sum / l.router_rows : 0.0,
                         l.sink_rows ? l.sink_mass / l.sink_rows : 0.0, pct(l.gate_clamped, l.gate_n),
                         pct(l.lin_clamped, l.lin_n), usage);
      gate_n += l.gate_n;
      gate_c += l.gate_clamped;
      lin_n += l.lin_n;
      lin_c += l.lin_clamped;
    }
    out << fmt::format(
        "clamped (limit {}): gate > limit on {:.2f}% of {} gate elements, |linear| > limit on {:.2f}% of {}\n",
        c_.swiglu_limit, pct(gate_c, gate_n), gate_n, pct(lin_c, lin_n), lin_n);
    out << fmt::format("routing: {:.1f} of {} experts selected at least once per layer (mean over layers)\n",
                       used_sum / double(layers_.size()), E);
    out << fmt::format("embedding rms {:.3f}, last residual rms {:.3f}, logits sd {:.3f}\n",
                       rms(embed_sq_, embed_n_), rms(layers_.back().resid_sq, layers_.back().resid_n),
                       logits_rows_ ? logits_sd_sum_ / logits_rows_ : 0.0);
  }

 private:
  static void sum_sq(const StageData& d, double& sq, size_t& n) {
    for (size_t i = 0; i < d.size(); ++i) sq += d.at(i) * d.at(i);
    n += d.size();
  }
  static double rms(double sq, size_t n) { return n ? std::sqrt(sq / double(n)) : 0.0; }
  static double pct(size_t part, size_t whole) { return whole ? 100.0 * double(part) / double(whole) : 0.0; }

  const Config& c_;
  std::vector<LayerStats> layers_;
  double embed_sq_ = 0, logits_sd_sum_ = 0;
  size_t embed_n_ = 0;
  int logits_rows_ = 0;
};

void print_stats(const std::string& dir, uint64_t seed, int positions) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(dir);
  const Config& c = model->config;
  auto backend = make_reference_backend(*model);
  Batch batch;
  std::string tokens;
  for (int p = 0; p < positions; ++p) {
    // Spread-out token ids, different per seed.
    const int32_t tok = int32_t((1 + 7919ull * uint64_t(p) + 104729ull * seed) % uint64_t(c.vocab_size));
    batch.tokens.push_back(tok);
    batch.positions.push_back(p);
    batch.seqs.push_back(0);
    tokens += fmt::format("{}{}", p ? "," : "", tok);
  }
  StatsObserver obs(c);
  forward(*backend, batch, &obs);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("reference forward over positions 0..{} (tokens {}; sliding window {}), load + "
                           "forward {:.1f} s:\n",
                           positions - 1, tokens, c.sliding_window, s);
  obs.print(std::cout);
}

int synth_main(int argc, char** argv) {
  CLI::App app{
      "parity-synth: writes a deterministic synthetic gpt-oss checkpoint in the hub layout (config.json, "
      "safetensors shards + index, MXFP4 experts, BF16 elsewhere), then runs the float64 reference over a few "
      "positions and prints the figures showing it exercises every branch (SwiGLU clamp, routing spread, "
      "residual RMS per layer, sink mass)."};
  std::string preset = "tiny", out;
  uint64_t seed = 0;
  int hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, experts = 0, topk = 0,
      vocab = 0, window = 0, shards = 0, positions = 0;
  bool no_stats = false, progress = ::isatty(STDERR_FILENO) != 0;
  app.add_option("--preset", preset, "tiny (CI, seconds), 20b or 120b (the real shapes, ~13.8 / ~65 GB)")
      ->check(CLI::IsMember({"tiny", "20b", "120b"}))
      ->capture_default_str();
  app.add_option("--seed", seed, "RNG seed; the same seed gives the same bytes")->capture_default_str();
  app.add_option("--out", out, "output directory (created; an earlier parity-synth output there is replaced)")
      ->required();
  auto* g = app.add_option_group("custom dimensions", "override the preset's (the result is preset \"custom\")");
  std::vector<CLI::Option*> dims = {
      g->add_option("--hidden", hidden, "hidden_size (multiple of 32)")->check(CLI::PositiveNumber),
      g->add_option("--layers", layers, "num_hidden_layers (sliding/full alternate)")->check(CLI::PositiveNumber),
      g->add_option("--heads", heads, "num_attention_heads")->check(CLI::PositiveNumber),
      g->add_option("--kv-heads", kv_heads, "num_key_value_heads")->check(CLI::PositiveNumber),
      g->add_option("--head-dim", head_dim, "head_dim (even)")->check(CLI::PositiveNumber),
      g->add_option("--intermediate", inter, "intermediate_size (multiple of 32)")->check(CLI::PositiveNumber),
      g->add_option("--experts", experts, "num_local_experts")->check(CLI::PositiveNumber),
      g->add_option("--topk", topk, "num_experts_per_tok")->check(CLI::PositiveNumber),
      g->add_option("--vocab", vocab, "vocab_size")->check(CLI::PositiveNumber),
      g->add_option("--window", window, "sliding_window")->check(CLI::PositiveNumber),
  };
  app.add_option("--shards", shards, "number of safetensors files (default: the preset's)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-stats", no_stats, "skip the reference forward and its figures");
  app.add_option("--stats-positions", positions, "positions in the reference forward (default: 16 for tiny, 2 "
                                                 "for 20b/120b)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--progress,!--no-progress", progress, "progress bar on stderr (default: when it is a terminal)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitError;
  }

  SynthSpec spec = synth_preset(preset);
  spec.seed = seed;
  Config& c = spec.config;
  bool custom = false;
  for (auto* o : dims) custom = custom || o->count() > 0;
  if (hidden) c.hidden_size = hidden;
  if (layers) {
    c.num_hidden_layers = layers;
    c.layer_is_sliding.clear();
    for (int l = 0; l < layers; ++l) c.layer_is_sliding.push_back(l % 2 == 0);
  }
  if (heads) c.num_attention_heads = heads;
  if (kv_heads) c.num_key_value_heads = kv_heads;
  if (head_dim) c.head_dim = head_dim;
  if (inter) c.intermediate_size = inter;
  if (experts) c.num_local_experts = experts;
  if (topk) c.num_experts_per_tok = topk;
  if (vocab) {
    c.vocab_size = vocab;
    if (c.eos_token_id >= vocab) c.eos_token_id = -1;  // ids the smaller vocabulary lacks
    if (c.pad_token_id >= vocab) c.pad_token_id = -1;
  }
  if (window) c.sliding_window = window;
  if (custom) spec.preset = "custom";
  if (shards) spec.shards = shards;
  c.validate(fmt::format("--preset {} with the given dimensions", preset));

  const SynthResult r = write_synthetic_checkpoint(spec, out, progress);
  std::cout << fmt::format("wrote {} (preset {}, seed {}): {:.3f} GB in {} safetensors file{}, {:.1f} s ({:.0f} MB/s)\n",
                           out, spec.preset, seed, double(r.bytes) / 1e9, spec.shards, spec.shards > 1 ? "s" : "",
                           r.seconds, r.seconds > 0 ? double(r.bytes) / 1e6 / r.seconds : 0.0);
  if (!no_stats) print_stats(out, seed, positions ? positions : preset == "tiny" ? 16 : 2);
  return kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  return parity::guarded_main("parity-synth", [&] { return parity::synth_main(argc, argv); });
}
