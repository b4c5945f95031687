#include "engine/progress.h"

#include <fmt/format.h>

#include <algorithm>

namespace parity {

Progress::Progress(std::ostream& out, size_t total, bool tty, bool enabled)
    : out_(out),
      total_(total),
      tty_(tty),
      enabled_(enabled && total > 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, int64_t tokens) {
  if (!enabled_) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double tps = seconds > 0 ? double(tokens) / seconds : 0;
  const double eta = done > 0 ? seconds * double(total_ - done) / double(done) : 0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = int(double(kWidth) * double(done) / double(total_));
    out_ << fmt::format("\r[{}{}] {}/{} requests, {:.0f} tokens/s, ETA {:.0f} s   ",
                        std::string(size_t(filled), '#'), std::string(size_t(kWidth - filled), '.'),
                        done, total_, tps, eta)
         << std::flush;
    drawn_ = true;
    return;
  }
  const size_t tenth = done * 10 / total_;
  if (tenth > last_tenth_) {
    last_tenth_ = tenth;
    out_ << fmt::format("run: {}/{} requests, {:.0f} tokens/s, {:.1f} s, ETA {:.0f} s\n", done,
                        total_, tps, seconds, eta)
         << std::flush;
  }
}

void Progress::finish() {
  if (drawn_) out_ << "\n" << std::flush;
  drawn_ = false;
}

namespace {
double decode_rate(const EngineStats& s) {
  return s.decode_seconds > 0 ? double(s.decode_rows) / s.decode_seconds : 0;
}
double prefill_rate(const EngineStats& s) {
  return s.prefill_seconds > 0 ? double(s.prefill_rows) / s.prefill_seconds : 0;
}
double per_wall_second(const EngineStats& s, int64_t tokens) {
  return s.wall_seconds > 0 ? double(tokens) / s.wall_seconds : 0;
}
// vLLM's benchmark figures first (total and output tokens/s over the wall time, TTFT and TPOT),
// then the engine's own split of the step time between decode and prefill rows.
std::string stats_line(const EngineStats& s, double decode_tps, double prefill_tps) {
  return fmt::format(
      "{} requests ({} failed), {} prompt tokens, {} generated, wall {:.3f} s, total {:.1f} "
      "tokens/s, output {:.1f} tokens/s, TTFT p50 {:.1f} ms p99 {:.1f} ms, TPOT p50 {:.2f} ms p99 "
      "{:.2f} ms, decode {:.1f} tokens/s, prefill {:.1f} tokens/s",
      s.requests, s.failed, s.prompt_tokens, s.generated_tokens, s.wall_seconds,
      per_wall_second(s, s.prompt_tokens + s.generated_tokens),
      per_wall_second(s, s.generated_tokens), s.ttft_percentile(0.5) * 1e3,
      s.ttft_percentile(0.99) * 1e3, s.tpot_percentile(0.5) * 1e3, s.tpot_percentile(0.99) * 1e3,
      decode_tps, prefill_tps);
}
}  // namespace

std::string summary_text(const EngineStats& total, const std::vector<EngineStats>& per_worker,
                         const std::vector<std::string>& worker_names) {
  // Workers run side by side: the run's rates are the sum of theirs.
  double decode = decode_rate(total), prefill = prefill_rate(total);
  if (per_worker.size() > 1) {
    decode = prefill = 0;
    for (const EngineStats& w : per_worker) {
      decode += decode_rate(w);
      prefill += prefill_rate(w);
    }
  }
  std::string out = "run: " + stats_line(total, decode, prefill) + "\n";
  if (per_worker.size() > 1)
    for (size_t i = 0; i < per_worker.size(); ++i)
      out += fmt::format("run:   {}: {}\n", i < worker_names.size() ? worker_names[i] : "?",
                         stats_line(per_worker[i], decode_rate(per_worker[i]),
                                    prefill_rate(per_worker[i])));
  return out;
}

}  // namespace parity
