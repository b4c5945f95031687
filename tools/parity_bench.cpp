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

Work work_per_token(const Model& m) {
  const Config& c = m.config;
  const double H = c.hidden_size, k = c.num_experts_per_tok, I = c.intermediate_size;
  Work w;
  const double attn = H * (c.q_dim() + 2.0 * c.kv_dim()) + c.q_dim() * H;
  const double moe = H * c.num_local_experts + k * (H * 2 * I + I * H);
  w.macs = c.num_hidden_layers * (attn + moe) + H * c.vocab_size;
  const auto bytes = [](const TensorView* t) { return t ? double(t->nbytes) : 0.0; };
  for (const auto& l : m.layers) {
    for (const Linear* lin : {&l.q, &l.k, &l.v, &l.o, &l.router})
      w.bytes += bytes(lin->weight) + bytes(lin->bias);
    for (const ExpertLinear* e : {&l.mlp1, &l.mlp2}) {
      const double per_expert =
          (bytes(e->blocks) + bytes(e->scales) + bytes(e->dense) + bytes(e->bias)) / e->experts;
      w.bytes += k * per_expert;
    }
  }
  w.bytes += bytes(m.lm_head.weight) + H * 2;  // lm_head plus one embedding row
  return w;
}

int bench_main(int argc, char** argv) {
  CLI::App app{"parity-bench: untraced forward wall time per position, with work per token"};
  std::string model = "tiny", models_dir, backend_name = "reference";
  int positions = 1, warmup = 0;
  bool quiet = false;
  app.add_option("--model", model, "checkpoint directory or preset")->capture_default_str();
  app.add_option("--models-dir", models_dir, "where presets live");
  app.add_option("--backend", backend_name, "reference, cpu-f32, hip")->capture_default_str();
  app.add_option("--positions", positions, "positions decoded one step each, from 0")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first (then the cache restarts at 0)")
      ->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "print only the first position and the summary");
  if (const auto done = parse_command_line(app, "parity-bench", argc, argv)) return *done;
  auto t0 = std::chrono::steady_clock::now();
  auto m = Model::load(resolve_model(model, models_dir));
  auto b = make_backend(backend_name, *m);
  const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Work w = work_per_token(*m);
  std::cout << fmt::format("model {} ({:.2f} GB of weights), backend {}, load {:.2f} s\n", m->dir,
                           double(m->weight_bytes()) / 1e9, b->name(), load);
  std::cout << fmt::format("work per token: {:.3f} G multiply-adds, {:.3f} GB of weights read\n",
                           w.macs / 1e9, w.bytes / 1e9);
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
  if (b->name() == "hip") {
#ifdef PARITY_HAVE_DEVICE
    const size_t copy_bytes = size_t(1) << 30;
    const double bw = device_copy_bandwidth_gbs(copy_bytes, 20);
    const double floor_s = w.bytes / (bw * 1e9);
    std::cout << fmt::format(
        "device copy bandwidth {:.1f} GB/s (1 GiB device-to-device copies, read + write, median of "
        "20)\n"
        "floor: {:.3f} GB of weights / {:.1f} GB/s = {:.3f} ms per token ({:.1f} tokens/s); "
        "measured {:.3f} ms = {:.2f} of the floor's speed\n",
        bw, w.bytes / 1e9, bw, floor_s * 1e3, 1 / floor_s, median * 1e3, floor_s / median);
#endif
  }
  return kExitOk;
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("parity-bench", [&] { return parity::bench_main(argc, argv); });
}
