// parity-synth: writes a deterministic synthetic gpt-oss checkpoint in the hub layout (presets
// tiny, 20b, 120b, or custom dimensions), then runs the float64 reference over a few positions
// and prints the figures that show the model exercises every branch the harness checks and has
// the magnitudes asked for: per layer the residual's RMS and its largest channels (the massive
// activations of --magnitudes realistic), the branch outputs, q and the scores, the sinks' share
// of the attention, the SwiGLU clamp on both halves, the routing spread over the experts, and
// the norm weights, sinks and biases as stored.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "model/synth.h"
#include "model/untrusted.h"
#include "reference/cpu_backend.h"
#include "tools/common.h"

namespace parity {
namespace {

double mean_of(const StageData& d) {
  double sum = 0;
  for (size_t i = 0; i < d.size(); ++i) sum += d.at(i);
  return sum / double(d.size());
}
double sd_of(const StageData& d) {
  const double mean = mean_of(d);
  double sq = 0;
  for (size_t i = 0; i < d.size(); ++i) sq += (d.at(i) - mean) * (d.at(i) - mean);
  return std::sqrt(sq / double(d.size()));
}
double rms(double sq, size_t n) {
  return n ? std::sqrt(sq / double(n)) : 0.0;
}
double pct(size_t part, size_t whole) {
  return whole ? 100.0 * double(part) / double(whole) : 0.0;
}

// Sum of squares and count, over every element or over the ordinary channels only (not the
// massive-activation channels realistic magnitudes put in the residual).
struct SquareSum {
  double sq = 0;
  size_t n = 0;
  void add(double x) {
    sq += x * x;
    ++n;
  }
  double rms() const { return parity::rms(sq, n); }
};

// Per-channel sums over positions of a hidden-sized stage: how much of its energy varies from
// token to token (the signal the projections after it work with) and how much is the same at
// every position (biases, the massive activations, a mean the norm weights carry).
struct ChannelMoments {
  std::vector<double> sum, sq;
  int rows = 0;
  void add(const StageData& d) {
    if (sum.empty()) {
      sum.assign(d.size(), 0.0);
      sq.assign(d.size(), 0.0);
    }
    for (size_t i = 0; i < d.size(); ++i) {
      sum[i] += d.at(i);
      sq[i] += d.at(i) * d.at(i);
    }
    ++rows;
  }
  // Share of the mean square that varies over positions, in [0, 1].
  double varying_share() const {
    double total = 0, varying = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      const double mean = sum[i] / rows, ms = sq[i] / rows;
      total += ms;
      varying += std::max(0.0, ms - mean * mean);
    }
    return total > 0 ? varying / total : 0.0;
  }
  double rms() const {
    double total = 0;
    for (size_t i = 0; i < sq.size(); ++i) total += sq[i] / rows;
    return sq.empty() ? 0.0 : std::sqrt(total / double(sq.size()));
  }
};

// Per-layer figures gathered from the reference forward.
struct LayerStats {
  ChannelMoments attn_norm, ffn_norm;
  size_t gate_n = 0, gate_clamped = 0;      // mlp1 even rows: gate > limit
  size_t lin_n = 0, lin_clamped = 0;        // mlp1 odd rows: |linear| > limit
  std::vector<int> expert_count;            // selections per expert over positions x k
  std::vector<double> resid_max;            // per channel: max |resid_ffn| over positions
  SquareSum resid, attn, moe, head_out, q;  // ordinary channels for the hidden-sized ones
  double router_sd_sum = 0;  // standard deviation of the router logits, summed over positions
  int router_rows = 0;
  double sink_mass = 0;  // probability the sink column takes, summed over heads and positions
  double key_max = 0;    // largest probability of a key (not the sink), summed likewise
  int att_rows = 0;
  double score_sd_sum = 0;  // sd of the visible keys' scores, summed over heads and positions
  int score_rows = 0;
};

class StatsObserver final : public Observer {
 public:
  StatsObserver(const Config& c, const std::vector<SynthOutlier>& outliers)
      : c_(c), layers_(size_t(c.num_hidden_layers)), outlier_(size_t(c.hidden_size), false) {
    for (auto& l : layers_) {
      l.expert_count.assign(size_t(c.num_local_experts), 0);
      l.resid_max.assign(size_t(c.hidden_size), 0.0);
    }
    for (const auto& o : outliers) outlier_.at(size_t(o.channel)) = true;
  }

  bool wants(int /*position*/, int /*layer*/, Stage s) const override {
    switch (s) {
      case Stage::attn_norm:
      case Stage::ffn_norm:
      case Stage::q_rope:
      case Stage::scores:
      case Stage::att:
      case Stage::attn_out:
      case Stage::o_proj:
      case Stage::router:
      case Stage::topk_idx:
      case Stage::mlp1:
      case Stage::moe_out:
      case Stage::resid_ffn:
      case Stage::embedding:
      case Stage::logits:
        return true;
      default:
        return false;
    }
  }

  void record(const StageKey& key, const StageData& d) override {
    for (size_t i = 0; i < d.size(); ++i) {
      const double v = d.at(i);
      const bool masked = key.stage == Stage::scores && v == -INFINITY;
      non_finite_ += !std::isfinite(v) && !masked;
    }
    if (key.layer == kModelLayer) {
      if (key.stage == Stage::embedding) hidden_sum(d, embed_);
      if (key.stage == Stage::logits) {
        logits_sd_sum_ += sd_of(d);
        ++logits_rows_;
      }
      return;
    }
    LayerStats& l = layers_[size_t(key.layer)];
    const double limit = c_.swiglu_limit;
    switch (key.stage) {
      case Stage::attn_norm:
        l.attn_norm.add(d);
        break;
      case Stage::ffn_norm:
        l.ffn_norm.add(d);
        break;
      case Stage::q_rope:
        for (size_t i = 0; i < d.size(); ++i) l.q.add(d.at(i));
        break;
      case Stage::scores: {  // [nH, pos + 2], masked keys -inf, the sink last
        const size_t heads = d.dims.at(0), cols = d.dims.at(1);
        for (size_t h = 0; h < heads; ++h) {
          double sum = 0, sq = 0;
          int n = 0;
          for (size_t j = 0; j + 1 < cols; ++j) {
            const double v = d.at(h * cols + j);
            if (!std::isfinite(v)) continue;
            sum += v;
            sq += v * v;
            ++n;
          }
          if (n < 2) continue;
          const double mean = sum / n;
          l.score_sd_sum += std::sqrt(std::max(0.0, sq / n - mean * mean));
          ++l.score_rows;
        }
        break;
      }
      case Stage::att: {
        const size_t heads = d.dims.at(0), cols = d.dims.at(1);
        for (size_t h = 0; h < heads; ++h) {
          l.sink_mass += d.at(h * cols + cols - 1);
          double top = 0;
          for (size_t j = 0; j + 1 < cols; ++j) top = std::max(top, d.at(h * cols + j));
          l.key_max += top;
        }
        l.att_rows += int(heads);
        break;
      }
      case Stage::attn_out:
        for (size_t i = 0; i < d.size(); ++i) l.head_out.add(d.at(i));
        break;
      case Stage::o_proj:
        hidden_sum(d, l.attn);
        break;
      case Stage::router:
        l.router_sd_sum += sd_of(d);
        ++l.router_rows;
        break;
      case Stage::topk_idx:
        for (size_t i = 0; i < d.size(); ++i) ++l.expert_count.at(size_t(d.at(i)));
        break;
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
      case Stage::moe_out:
        hidden_sum(d, l.moe);
        break;
      case Stage::resid_ffn:
        hidden_sum(d, l.resid);
        for (size_t i = 0; i < d.size(); ++i)
          l.resid_max[i] = std::max(l.resid_max[i], std::fabs(d.at(i)));
        break;
      default:
        break;
    }
  }

  void print(std::ostream& out, const Model& m) const {
    const int E = c_.num_local_experts;
    const bool any_outlier = std::find(outlier_.begin(), outlier_.end(), true) != outlier_.end();
    out << "activations per layer ("
        << (any_outlier ? "rms over the ordinary channels, not the massive-activation ones; " : "")
        << "max|resid| over positions with its three largest channels; attn_norm: output rms "
           "and the share of its mean square that varies from token to token):\n";
    out << fmt::format(
        "{:>5} {:>7} {:>9} {:>10}  {:<30} {:>13} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>6} {:>7} "
        "{:>7}\n",
        "layer", "type", "resid_rms", "max|resid|", "largest channels (channel:max)",
        "attn_norm var", "attn_rms", "moe_rms", "att_out", "q_rms", "score_sd", "key_max", "sink",
        "gate>L", "|lin|>L");
    size_t gate_n = 0, gate_c = 0, lin_n = 0, lin_c = 0;
    for (size_t L = 0; L < layers_.size(); ++L) {
      const LayerStats& l = layers_[L];
      std::vector<size_t> order(l.resid_max.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      const size_t top = std::min<size_t>(3, order.size());
      std::partial_sort(order.begin(), order.begin() + long(top), order.end(),
                        [&](size_t a, size_t b) { return l.resid_max[a] > l.resid_max[b]; });
      std::string largest;
      for (size_t i = 0; i < top; ++i)
        largest += fmt::format("{}{}:{:.1f}", i ? " " : "", order[i], l.resid_max[order[i]]);
      out << fmt::format(
          "{:>5} {:>7} {:>9.3f} {:>10.2f}  {:<30} {:>7.3f} {:>4.0f}% {:>8.3f} {:>7.3f} {:>7.3f} "
          "{:>6.3f} {:>8.3f} {:>7.3f} {:>6.3f} {:>6.2f}% {:>6.2f}%\n",
          L, c_.sliding(int(L)) ? "sliding" : "full", l.resid.rms(), l.resid_max[order[0]], largest,
          l.attn_norm.rms(), 100.0 * l.attn_norm.varying_share(), l.attn.rms(), l.moe.rms(),
          l.head_out.rms(), l.q.rms(), l.score_rows ? l.score_sd_sum / l.score_rows : 0.0,
          l.att_rows ? l.key_max / l.att_rows : 0.0, l.att_rows ? l.sink_mass / l.att_rows : 0.0,
          pct(l.gate_clamped, l.gate_n), pct(l.lin_clamped, l.lin_n));
      gate_n += l.gate_n;
      gate_c += l.gate_clamped;
      lin_n += l.lin_n;
      lin_c += l.lin_clamped;
    }

    out << fmt::format(
        "routing per layer (its input: the ffn_norm output's rms and the share of its mean square "
        "that varies from token to token; router logit sd, experts used, the busiest expert's "
        "share of the selections; {}):\n",
        E <= 32 ? "selections per expert" : "expert:count, nonzero only");
    double used_sum = 0;
    for (size_t L = 0; L < layers_.size(); ++L) {
      const LayerStats& l = layers_[L];
      std::string usage;
      int used = 0, busiest = 0, total = 0;
      for (int e = 0; e < E; ++e) {
        const int n = l.expert_count[size_t(e)];
        used += n > 0;
        busiest = std::max(busiest, n);
        total += n;
        if (E <= 32)
          usage += fmt::format("{}{}", e ? " " : "", n);
        else if (n > 0)
          usage += fmt::format("{}{}:{}", usage.empty() ? "" : " ", e, n);
      }
      used_sum += used;
      out << fmt::format(
          "{:>5}  ffn_norm {:>6.3f} {:>3.0f}% varying  router_sd {:>6.3f}  used {:>3}/{}  busiest "
          "{:>5.1f}%  [{}]\n",
          L, l.ffn_norm.rms(), 100.0 * l.ffn_norm.varying_share(),
          l.router_rows ? l.router_sd_sum / l.router_rows : 0.0, used, E,
          pct(size_t(busiest), size_t(total)), usage);
    }

    out << "weights per layer (norm weights min / mean / max, sinks mean and sd, bias sd):\n";
    out << fmt::format("{:>5}  {:<24} {:<24} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10}\n", "layer",
                       "attn_norm", "ffn_norm", "sinks", "q_bias", "k_bias", "v_bias", "o_bias",
                       "max|o_bias|");
    for (size_t L = 0; L < m.layers.size(); ++L) {
      const LayerWeights& w = m.layers[L];
      const auto sinks = summary(*w.sinks);
      const auto o_bias = summary(*w.o.bias);
      out << fmt::format(
          "{:>5}  {:<24} {:<24} {:>5.2f} {:>5.2f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>10.2f}\n",
          L, range(*w.attn_norm), range(*w.ffn_norm), sinks.mean, sinks.sd, summary(*w.q.bias).sd,
          summary(*w.k.bias).sd, summary(*w.v.bias).sd, o_bias.sd, o_bias.max_abs);
    }
    out << fmt::format("final norm {}\n", range(*m.final_norm));

    out << fmt::format(
        "clamped (limit {}): gate > limit on {:.2f}% of {} gate elements, |linear| > limit on "
        "{:.2f}% of {}\n",
        c_.swiglu_limit, pct(gate_c, gate_n), gate_n, pct(lin_c, lin_n), lin_n);
    out << fmt::format(
        "routing: {:.1f} of {} experts selected at least once per layer (mean over layers)\n",
        used_sum / double(layers_.size()), E);
    out << fmt::format(
        "embedding rms {:.4f}, last residual rms {:.3f}{}, logits sd {:.3f}, "
        "non-finite values {}\n",
        embed_.rms(), layers_.back().resid.rms(), any_outlier ? " (ordinary channels)" : "",
        logits_rows_ ? logits_sd_sum_ / logits_rows_ : 0.0, non_finite_);
  }

 private:
  struct Summary {
    double min = 0, mean = 0, max = 0, sd = 0, max_abs = 0;
  };
  static Summary summary(const TensorView& t) {
    std::vector<double> v(size_t(t.numel()));
    read_vector(t, v.data());
    Summary s{v.at(0), 0, v.at(0), 0, 0};
    for (double x : v) {
      s.min = std::min(s.min, x);
      s.max = std::max(s.max, x);
      s.mean += x;
      s.max_abs = std::max(s.max_abs, std::fabs(x));
    }
    s.mean /= double(v.size());
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / double(v.size()));
    return s;
  }
  static std::string range(const TensorView& t) {
    const Summary s = summary(t);
    return fmt::format("{:.3f} / {:.2f} / {:.2f}", s.min, s.mean, s.max);
  }
  // Hidden-sized rows: only the ordinary channels count.
  void hidden_sum(const StageData& d, SquareSum& sum) const {
    for (size_t i = 0; i < d.size(); ++i)
      if (!outlier_[i]) sum.add(d.at(i));
  }

  const Config& c_;
  std::vector<LayerStats> layers_;
  std::vector<bool> outlier_;
  SquareSum embed_;
  double logits_sd_sum_ = 0;
  int logits_rows_ = 0;
  size_t non_finite_ = 0;
};

void print_stats(const std::string& dir, const SynthSpec& spec, int positions) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(dir);
  const Config& c = model->config;
  auto backend = make_reference_backend(*model);
  Batch batch;
  std::string tokens;
  for (int p = 0; p < positions; ++p) {
    // Spread-out token ids, different per seed.
    const int32_t tok =
        int32_t((1 + 7919ull * uint64_t(p) + 104729ull * spec.seed) % uint64_t(c.vocab_size));
    batch.tokens.push_back(tok);
    batch.positions.push_back(p);
    batch.seqs.push_back(0);
    tokens += fmt::format("{}{}", p ? "," : "", tok);
  }
  const std::vector<SynthOutlier> outliers = synth_outliers(spec);
  StatsObserver obs(c, outliers);
  forward(*backend, batch, &obs);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format(
      "reference forward over positions 0..{} (tokens {}; sliding window {}), "
      "load + forward {:.1f} s:\n",
      positions - 1, tokens, c.sliding_window, s);
  if (!outliers.empty()) {
    std::string list;
    for (const auto& o : outliers)
      list += fmt::format("{}{}:{:+g}", list.empty() ? "" : " ", o.channel, o.value);
    std::cout << fmt::format(
        "massive-activation channels by design (channel:value from layer 1 on): {}\n", list);
  }
  obs.print(std::cout, *model);
}

// o200k_harmony's ids end at 201088, the vocabulary of the 20b and 120b models.
constexpr int kO200kHarmonyIds = 201088;

// The o200k_harmony tokenizer.json the 20b and 120b presets copy: --tokenizer FILE, else
// $PARITY_TOKENIZER_ORACLE_DIR/tokenizer.json, else the one scripts/tokenizer_oracle.sh writes
// beside this build (<build>/oracle/o200k_harmony/tokenizer.json).
std::string o200k_tokenizer_source(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* dir = std::getenv("PARITY_TOKENIZER_ORACLE_DIR"); dir != nullptr && *dir)
    return std::string(dir) + "/tokenizer.json";
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "oracle" / "o200k_harmony" / "tokenizer.json").string();
}

// Writes DIR/tokenizer.json for the model of `spec`: the o200k_harmony file copied for a model
// with its vocabulary, the tiny layout (tokenizer/tiny_tokenizer.h) made for a smaller one. Returns
// the line to print. Without the o200k_harmony file: an Error when `required`, else a note.
std::string write_tokenizer(const SynthSpec& spec, const std::string& source,
                            const std::string& dir, bool required) {
  const int vocab = spec.config.vocab_size;
  const std::string path = dir + "/tokenizer.json";
  if (vocab >= kO200kHarmonyIds) {
    std::error_code ec;
    if (!std::filesystem::exists(source, ec)) {
      const std::string how = fmt::format(
          "no o200k_harmony tokenizer.json at {}: scripts/tokenizer_oracle.sh writes one (node and "
          "npm), or pass --tokenizer FILE (the hub's openai/gpt-oss-20b tokenizer.json will do)",
          source);
      if (required) fail("{}", how);
      return "no tokenizer.json written (" + how + ")";
    }
    const std::string text = read_small_file(source, kMaxTokenizerJsonBytes, "tokenizer.json");
    const Tokenizer t = Tokenizer::parse(text, source);
    if (t.id_end() > vocab)
      fail("{}: ids up to {}, more than the model's vocabulary of {}", source, t.id_end() - 1,
           vocab);
    t.added("<|start|>");  // an Error when the file is not a harmony tokenizer
    write_file_atomically(path, text);
    return fmt::format("wrote {} (o200k_harmony, copied from {}: {} tokens, {} merges)", path,
                       source, t.token_count(), t.merge_count());
  }
  if (vocab < kTinyMinVocab) {
    if (required)
      fail("vocab_size {}: too small for a tokenizer (at least {})", vocab, kTinyMinVocab);
    return fmt::format("no tokenizer.json written (vocab_size {} < {})", vocab, kTinyMinVocab);
  }
  write_file_atomically(path, tiny_tokenizer_json(vocab));
  return fmt::format("wrote {} (the tiny layout: 256 bytes, {} merges, {} harmony specials)", path,
                     vocab - 256 - kTinySpecialCount, kTinySpecialCount);
}

// --tokenizer-only writes into a directory that may hold a checkpoint: never into one that
// parity-synth did not write (its config.json has no "parity_synth" entry).
void refuse_foreign_checkpoint(const std::string& dir) {
  const std::string cfg = dir + "/config.json";
  if (!std::filesystem::exists(cfg)) return;
  const nlohmann::json j = parse_json(read_small_file(cfg, 1 << 20, "config"), cfg);
  if (!j.is_object() || !j.contains("parity_synth"))
    fail(
        "{}: holds a checkpoint that parity-synth did not write; refusing to write its "
        "tokenizer.json. Choose another --out directory.",
        dir);
}

int synth_main(int argc, char** argv) {
  CLI::App app{
      "parity-synth: writes a deterministic synthetic gpt-oss checkpoint in the hub layout "
      "(config.json, safetensors shards + index, MXFP4 experts, BF16 elsewhere), then runs the "
      "float64 reference over a few positions and prints the figures showing it exercises every "
      "branch and has the magnitudes asked for (residual RMS and largest channels per layer, "
      "sink share, SwiGLU clamp, routing spread, norm weights)."};
  std::string preset = "tiny", out, magnitudes = "unit";
  uint64_t seed = 0;
  int hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, experts = 0,
      topk = 0, vocab = 0, window = 0, shards = 0, positions = 0;
  bool no_stats = false, tokenizer_only = false, progress = ::isatty(STDERR_FILENO) != 0;
  std::string tokenizer_source;
  app.add_option("--preset", preset,
                 "tiny (CI, seconds), 20b or 120b (the real shapes, ~13.8 / ~65 GB)")
      ->check(CLI::IsMember({"tiny", "20b", "120b"}))
      ->capture_default_str();
  app.add_option(
         "--magnitudes", magnitudes,
         "unit: every activation O(1); realistic: the magnitudes of real checkpoints (small "
         "embeddings, large norm weights, biases and sinks, massive activations on a few "
         "residual channels)")
      ->check(CLI::IsMember({"unit", "realistic"}))
      ->capture_default_str();
  app.add_option("--seed", seed, "RNG seed; the same seed gives the same bytes")
      ->capture_default_str();
  app.add_option("--out", out,
                 "output directory (created; an earlier parity-synth output there is replaced)")
      ->required();
  auto* g = app.add_option_group("custom dimensions",
                                 "override the preset's (the result is preset \"custom\")");
  std::vector<CLI::Option*> dims = {
      add_decimal_option(*g, "--hidden", hidden, "hidden_size (multiple of 32)", 1),
      add_decimal_option(*g, "--layers", layers, "num_hidden_layers (sliding/full alternate)", 1),
      add_decimal_option(*g, "--heads", heads, "num_attention_heads", 1),
      add_decimal_option(*g, "--kv-heads", kv_heads, "num_key_value_heads", 1),
      add_decimal_option(*g, "--head-dim", head_dim, "head_dim (even)", 1),
      add_decimal_option(*g, "--intermediate", inter, "intermediate_size (multiple of 32)", 1),
      add_decimal_option(*g, "--experts", experts, "num_local_experts", 1),
      add_decimal_option(*g, "--topk", topk, "num_experts_per_tok", 1),
      add_decimal_option(*g, "--vocab", vocab, "vocab_size", 1),
      add_decimal_option(*g, "--window", window, "sliding_window", 1),
  };
  add_decimal_option(app, "--shards", shards,
                     "number of safetensors files (default: the preset's)", 1);
  app.add_flag("--no-stats", no_stats, "skip the reference forward and its figures");
  app.add_flag("--tokenizer-only", tokenizer_only,
               "write only DIR/tokenizer.json: o200k_harmony for 20b/120b (see --tokenizer), the "
               "tiny layout for tiny; the checkpoints also get it when it is available");
  app.add_option("--tokenizer", tokenizer_source,
                 "the o200k_harmony tokenizer.json that 20b/120b copy (default: "
                 "$PARITY_TOKENIZER_ORACLE_DIR/tokenizer.json, else "
                 "<build>/oracle/o200k_harmony/tokenizer.json from scripts/tokenizer_oracle.sh)");
  add_decimal_option(app, "--stats-positions", positions,
                     "positions in the reference forward (default: 16 for tiny, 2 for 20b/120b)",
                     1);
  app.add_flag("--progress,!--no-progress", progress,
               "progress bar on stderr (default: when it is a terminal)");
  if (const auto done = parse_command_line(app, "parity-synth", argc, argv)) return *done;

  SynthSpec spec = synth_preset(preset);
  spec.seed = seed;
  spec.magnitudes = parse_synth_magnitudes(magnitudes);
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
  // The statistics run the reference over this many positions: checked before writing anything.
  if (positions > std::min(c.max_position_embeddings, 4096))
    fail("--stats-positions {}: at most {} (the model's context, and 4096)", positions,
         std::min(c.max_position_embeddings, 4096));

  const std::string tokenizer_from = o200k_tokenizer_source(tokenizer_source);
  if (tokenizer_only) {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (!std::filesystem::is_directory(out))
      fail("{}: cannot create the output directory ({})", out,
           ec ? ec.message() : "not a directory");
    refuse_foreign_checkpoint(out);
    std::cout << write_tokenizer(spec, tokenizer_from, out, /*required=*/true) << "\n";
    return kExitOk;
  }

  const SynthResult r = write_synthetic_checkpoint(spec, out, progress);
  std::cout << fmt::format(
      "wrote {} (preset {}, seed {}, {} magnitudes): {:.3f} GB in {} safetensors file{}, {:.1f} s "
      "({:.0f} MB/s)\n",
      out, spec.preset, seed, magnitudes, double(r.bytes) / 1e9, spec.shards,
      spec.shards > 1 ? "s" : "", r.seconds,
      r.seconds > 0 ? double(r.bytes) / 1e6 / r.seconds : 0.0);
  std::cout << write_tokenizer(spec, tokenizer_from, out, /*required=*/false) << "\n";
  if (!no_stats) print_stats(out, spec, positions ? positions : preset == "tiny" ? 16 : 2);
  return kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-synth", [&] { return parity::synth_main(argc, argv); });
}
