// parity-bench: wall time of a backend's untraced forward, one position per step, with the
// work it must do (multiply-adds and weight bytes read per token) so figures can be set
// against the machine's floor. A benchmark, never a test: record results in docs/measurements.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include "model/error.h"
#include "model/forward.h"
#include "tools/common.h"
#ifdef PARITY_HAVE_DEVICE
#include "device/hip_backend.h"
#endif

namespace parity {
namespace {

struct Work {
  double macs = 0;   // multiply-adds per token at position 0 (attention over one key)
  double bytes = 0;  // weight bytes read per token
};

double bytes(const TensorView* t) {
  return t ? double(t->nbytes) : 0.0;
}

// Weight bytes every token reads: the attention projections, the routers and lm_head.
double dense_bytes(const Model& m) {
  double b = bytes(m.lm_head.weight);
  for (const auto& l : m.layers)
    for (const Linear* lin : {&l.q, &l.k, &l.v, &l.o, &l.router})
      b += bytes(lin->weight) + bytes(lin->bias);
  return b;
}

// Weight bytes of one expert of a layer's mlp1 and mlp2 together.
double expert_bytes(const LayerWeights& l) {
  double b = 0;
  for (const ExpertLinear* e : {&l.mlp1, &l.mlp2})
    b += (bytes(e->blocks) + bytes(e->scales) + bytes(e->dense) + bytes(e->bias)) / e->experts;
  return b;
}

// The bytes a batched decode step must read: the dense weights once, each expert a row of the
// step selected once (what grouping the (row, slot) pairs by expert buys: without it each pair
// reads its expert), and the KV cache rows attention reads.
struct StepBytes {
  double dense = 0;         // attention, router, lm_head, the embedding rows
  double experts = 0;       // the selected experts, each once per layer
  double experts_rows = 0;  // the same read once per (row, slot) pair
  double kv = 0;            // K and V rows read by the step's attention (float32 cache)
  double distinct = 0;      // selected experts per layer, mean over the layers
};

Work work_per_token(const Model& m) {
  const Config& c = m.config;
  const double H = c.hidden_size, k = c.num_experts_per_tok, I = c.intermediate_size;
  Work w;
  const double attn = H * (c.q_dim() + 2.0 * c.kv_dim()) + c.q_dim() * H;
  const double moe = H * c.num_local_experts + k * (H * 2 * I + I * H);
  w.macs = c.num_hidden_layers * (attn + moe) + H * c.vocab_size;
  w.bytes = dense_bytes(m) + H * 2;  // plus one embedding row
  for (const auto& l : m.layers) w.bytes += k * expert_bytes(l);
  return w;
}

// The device's copy bandwidth (1 GiB device-to-device copies), for the floor; 0 without a device.
double copy_bandwidth_gbs(const Backend& b) {
#ifdef PARITY_HAVE_DEVICE
  if (b.name() == "hip") return device_copy_bandwidth_gbs(size_t(1) << 30, 20);
#endif
  (void)b;
  return 0;
}

// The token of sequence s at position p: different per sequence so that the rows route apart.
int32_t bench_token(const Config& c, int s, int p) {
  return int32_t((1 + 7919ll * p + 104729ll * s) % c.vocab_size);
}

Batch decode_batch(const Config& c, int batch, int p) {
  Batch b;
  for (int s = 0; s < batch; ++s) {
    b.tokens.push_back(bench_token(c, s, p));
    b.positions.push_back(p);
    b.seqs.push_back(s);
  }
  return b;
}

// One untimed decode step at position p whose selected experts are read back layer by layer:
// the step's bytes (StepBytes) as the routing of real rows makes them.
StepBytes census_step(Backend& b, const Model& m, int batch, int p) {
  const Config& c = m.config;
  const Batch step = decode_batch(c, batch, p);
  StepBytes sb;
  sb.dense = dense_bytes(m) + double(batch) * c.hidden_size * 2;  // + the embedding rows
  b.begin_step(step);
  walk_graph(c, [&](int layer, Stage s) {
    b.run(s, layer);
    if (s != Stage::topk_idx) return;
    std::vector<bool> used(size_t(c.num_local_experts), false);
    for (int r = 0; r < batch; ++r) {
      const StageData idx = b.read(s, layer, r);
      for (size_t i = 0; i < idx.size(); ++i) {
        const auto e = int64_t(idx.at(i));
        if (e >= 0 && e < c.num_local_experts) used[size_t(e)] = true;
      }
    }
    const double n = double(std::count(used.begin(), used.end(), true));
    const double per_expert = expert_bytes(m.layers[size_t(layer)]);
    sb.experts += n * per_expert;
    sb.experts_rows += double(batch) * c.num_experts_per_tok * per_expert;
    sb.distinct += n / c.num_hidden_layers;
    const double keys = c.sliding(layer) ? std::min(p + 1, c.sliding_window) : double(p + 1);
    sb.kv += double(batch) * keys * 2.0 * c.kv_dim() * sizeof(float);
  });
  return sb;
}

// --batch B: B sequences decoded together, one row each per step, after an untimed prefill of
// `start` positions per sequence; the aggregate tokens/s and the step's bytes against the floor.
int bench_batched(Backend& b, const Model& m, int batch, int start, int positions, int warmup) {
  const Config& c = m.config;
  const auto sync = [&] { return b.read(Stage::logits, kModelLayer, 0); };
  for (int i = 0; i < warmup; ++i) {
    forward(b, decode_batch(c, batch, i));
    sync();
  }
  if (warmup > 0) b.reset();
  for (int s = 0; s < batch && start > 0; ++s) {  // the prefill: one step per sequence
    Batch pre;
    for (int p = 0; p < start; ++p) {
      pre.tokens.push_back(bench_token(c, s, p));
      pre.positions.push_back(p);
      pre.seqs.push_back(s);
    }
    forward(b, pre);
  }
  if (start > 0) sync();
  std::vector<double> times;
  for (int i = 0; i < positions; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    forward(b, decode_batch(c, batch, start + i));
    const StageData logits = sync();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!std::isfinite(logits.at(0)))
      fail("batch {} at position {}: non-finite logits from backend {}", batch, start + i,
           b.name());
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const StepBytes sb = census_step(b, m, batch, start + positions);
  std::cout << fmt::format(
      "batch {}: median {:.3f} ms per step over {} steps at positions {}..{} (min {:.3f}, max "
      "{:.3f}): {:.1f} tokens/s\n",
      batch, median * 1e3, times.size(), start, start + positions - 1, times.front() * 1e3,
      times.back() * 1e3, batch / median);
  const double weights = sb.dense + sb.experts;
  std::cout << fmt::format(
      "bytes per step (the routing of the step after, read back): weights {:.3f} GB (dense "
      "{:.3f}, experts {:.3f}: {:.1f} of {} experts per layer selected, each read once; once per "
      "(row, slot) pair would be {:.3f}), KV cache {:.3f} GB\n",
      weights / 1e9, sb.dense / 1e9, sb.experts / 1e9, sb.distinct, c.num_local_experts,
      sb.experts_rows / 1e9, sb.kv / 1e9);
  if (const double bw = copy_bandwidth_gbs(b); bw > 0) {
    const double floor_s = (weights + sb.kv) / (bw * 1e9);
    std::cout << fmt::format(
        "device copy bandwidth {:.1f} GB/s; floor: {:.3f} GB / {:.1f} GB/s = {:.3f} ms per step "
        "({:.1f} tokens/s); measured {:.3f} ms = {:.2f} of the floor's speed\n",
        bw, (weights + sb.kv) / 1e9, bw, floor_s * 1e3, batch / floor_s, median * 1e3,
        floor_s / median);
  }
  return kExitOk;
}

int bench_main(int argc, char** argv) {
  CLI::App app{"parity-bench: untraced forward wall time per position, with work per token"};
  std::string model = "tiny", models_dir, backend_name = "reference", precision_name;
  int positions = 1, warmup = 0, batch = 1, start = 0;
  bool quiet = false;
  app.add_option("--model", model, "checkpoint directory or preset")->capture_default_str();
  app.add_option("--models-dir", models_dir, "where presets live");
  app.add_option("--backend", backend_name, "reference, cpu-f32, hip")->capture_default_str();
  auto* o_precision = app.add_option(
      "--precision", precision_name,
      "hip: the precision of the products, fp32 (exact) or bf16 (each product's input rounded "
      "once to BF16, FP32 accumulation); default PARITY_DEVICE_PRECISION, else fp32; a host "
      "backend takes fp32 alone");
  add_decimal_option(app, "--positions", positions, "positions decoded one step each, from 0", 1);
  app.add_option("--warmup", warmup, "untimed steps first (then the cache restarts at 0)")
      ->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "print only the first position and the summary");
  app.add_option("--batch", batch,
                 "sequences decoded together, one row each per step (aggregate tokens/s, the "
                 "step's bytes against the floor)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--start", start,
                 "with --batch: positions prefilled per sequence (untimed) before the timed steps")
      ->check(CLI::Range(0, ConfigLimits::kMaxContext))
      ->capture_default_str();
  if (const auto done = parse_command_line(app, "parity-bench", argc, argv)) return *done;
  std::optional<device::Precision> precision;
  if (o_precision->count() > 0) precision = backend_precision_option(precision_name, backend_name);
  auto t0 = std::chrono::steady_clock::now();
  auto m = Model::load(resolve_model(model, models_dir));
  // The positions a sequence reaches: the prefill, the timed steps (or the warmup's), the census.
  const int64_t batched_context = int64_t(start) + std::max(positions, warmup) + 1;
  if (batch > 1 && batched_context > m->config.max_position_embeddings)
    fail("--start {} and --positions {}: {} positions per sequence exceed the model's context {}",
         start, positions, batched_context, m->config.max_position_embeddings);
  auto b = batch > 1
               ? make_batched_backend(backend_name, *m, batch, int(batched_context), precision)
               : make_backend(backend_name, *m, precision);
  const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Work w = work_per_token(*m);
  std::cout << fmt::format("model {} ({:.2f} GB of weights), backend {}, load {:.2f} s\n", m->dir,
                           double(m->weight_bytes()) / 1e9, b->name(), load);
  std::cout << fmt::format("work per token: {:.3f} G multiply-adds, {:.3f} GB of weights read\n",
                           w.macs / 1e9, w.bytes / 1e9);
  if (batch > 1) return bench_batched(*b, *m, batch, start, positions, warmup);
  // One step: the graph's calls, then the logits row back to the host, as a decoder does; the
  // read is the step's only synchronisation, so the time is the device's full step latency.
  const auto step = [&](int p) {
    forward(*b, Batch::single(int32_t((1 + 7919ll * p) % m->config.vocab_size), p));
    return b->read(Stage::logits, kModelLayer, 0);
  };
  for (int i = 0; i < warmup; ++i) step(i);
  if (warmup > 0) b->reset();
  std::vector<double> times;
  for (int p = 0; p < positions; ++p) {
    t0 = std::chrono::steady_clock::now();
    const StageData logits = step(p);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!std::isfinite(logits.at(0)))
      fail("position {}: non-finite logits from backend {}", p, b->name());
    if (!quiet || p == 0)
      std::cout << fmt::format("position {}: {:.3f} ms ({:.2f} GMAC/s, {:.1f} GB/s of weights)\n",
                               p, times.back() * 1e3, w.macs / times.back() / 1e9,
                               w.bytes / times.back() / 1e9);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::cout << fmt::format(
      "median {:.3f} ms per position over {} positions (min {:.3f}, max {:.3f}): "
      "{:.1f} tokens/s at batch 1, {:.1f} GB/s of weights\n",
      median * 1e3, times.size(), times.front() * 1e3, times.back() * 1e3, 1 / median,
      w.bytes / median / 1e9);
  if (const double bw = copy_bandwidth_gbs(*b); bw > 0) {
    const double floor_s = w.bytes / (bw * 1e9);
    std::cout << fmt::format(
        "device copy bandwidth {:.1f} GB/s (1 GiB device-to-device copies, read + write, median of "
        "20)\n"
        "floor: {:.3f} GB of weights / {:.1f} GB/s = {:.3f} ms per token ({:.1f} tokens/s); "
        "measured {:.3f} ms = {:.2f} of the floor's speed\n",
        bw, w.bytes / 1e9, bw, floor_s * 1e3, 1 / floor_s, median * 1e3, floor_s / median);
  }
  return kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-bench", [&] { return parity::bench_main(argc, argv); });
}
