// What a person running `run` sees while it works: on a terminal, one line redrawn in place
// (requests done of all, generated tokens per second, time left); otherwise a plain line at each
// tenth of the requests. Then the summary, the figures of vLLM's `bench serve`: requests, prompt
// and generated tokens, wall time, total ((prompt + generated) / wall) and output tokens per
// second, time to first token and time per output token p50/p99; then the engine's decode and
// prefill tokens per second (each step's time shared between its rows); and one such line per GPU
// or rank.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace parity {

class Progress {
 public:
  // `tty`: redraw one line (a terminal); otherwise plain lines. `enabled` false: silent.
  Progress(std::ostream& out, size_t total, bool tty, bool enabled);
  // Called now and then with the requests completed and the tokens they generated.
  void update(size_t done, int64_t tokens);
  void finish();  // ends the redrawn line

 private:
  std::ostream& out_;
  size_t total_ = 0;
  bool tty_ = false, enabled_ = true, drawn_ = false;
  size_t last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// The summary lines: the whole run, then (with more than one) each worker's, labelled by
// `worker_names`.
std::string summary_text(const EngineStats& total, const std::vector<EngineStats>& per_worker,
                         const std::vector<std::string>& worker_names);

}  // namespace parity
