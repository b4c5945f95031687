// HDF5 trace files (HDF5 C++ API). Layout, for h5dump/h5py users:
//   /                         attributes: format="gpt-oss-parity-trace", format_version=1,
//                             backend, precision, config (JSON text), checkpoint_fingerprint,
//                             model_dir, tokens (int32[]), positions (int32[]), tool_version,
//                             commit, device (JSON text), created (ISO 8601 UTC)
//                             precision_policy (JSON: unit roundoffs, function ulps), replay
//                             (1 when the trace holds replay datasets), run (JSON: how it ran)
//   /pos_<P>/model/<stage>    model-scope stages (embedding, final_norm, logits, sampled)
//   /pos_<P>/layer_<L>/<stage>
//   /replay/pos_<P>/...       candidate traces: each stage re-run on the reference's inputs
//                             (its local result; model/lockstep.h)
//   /magnitude/pos_<P>/...    reference traces: per element, the sum of |terms| of the
//                             stage's sums (projections, scores, attn_out), for error bounds
// e.g. the logits at position 7 are /pos_7/model/logits, shape [vocab]. Real stages are
// float64 in reference traces and float32 in all others; topk_idx and sampled are int32.
// Expert stages (mlp1, swiglu, mlp2) are [k, n]: row i belongs to the expert in slot i of
// topk_idx. Dataset attributes: stage, layer (-1 at model scope), position, order (execution
// order within the position). A trace is written under a temporary name and renamed when
// complete. Format version 1 (no replay, magnitude, sampled, precision_policy) is still read.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/forward.h"

namespace parity {

inline constexpr const char* kTraceFormat = "gpt-oss-parity-trace";
inline constexpr int kTraceFormatVersion = 2;
inline constexpr int kOldestTraceFormatVersion = 1;

struct TraceMeta {
  std::string backend;
  std::string precision;
  nlohmann::json config;  // Config::to_json()
  std::string fingerprint;
  std::string model_dir;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::string tool_version;
  std::string commit;
  nlohmann::json device = nlohmann::json::object();
  std::string created;
  std::optional<PrecisionPolicy> precision_policy;  // absent in format version 1
  bool replay = false;                              // holds /replay datasets
  nlohmann::json run = nlohmann::json::object();    // run options (replay, generate, ...)
};

std::string trace_dataset_path(int position, int layer, Stage s, Series series = Series::output);
std::string_view series_name(Series s);  // "output", "replay", "magnitude"

// Observer that writes every wanted stage row into an HDF5 file. `positions` empty = all.
class TraceWriter : public Observer {
 public:
  TraceWriter(std::string path, TraceMeta meta, std::set<int> positions = {});
  ~TraceWriter() override;  // an unfinished trace is removed
  bool wants(int position, int layer, Stage s) const override;
  void record(const StageKey& key, const StageData& data) override;
  // The token list and positions written at finish() (a generating run learns them late).
  void set_tokens(std::vector<int32_t> tokens, std::vector<int32_t> positions);
  void finish();  // closes and renames into place
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TraceEntry {
  std::string path;
  StageKey key;
};

class TraceReader {
 public:
  explicit TraceReader(const std::string& path);  // throws naming the file if not a trace
  ~TraceReader();
  const TraceMeta& meta() const;
  const std::string& path() const;
  // The output datasets, sorted by (position, order); replay and magnitude datasets are found
  // by path (trace_dataset_path with their series).
  const std::vector<TraceEntry>& entries() const;
  bool has(const std::string& dataset_path) const;
  bool has_series(Series s) const;
  StageData read(const std::string& dataset_path) const;
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parity
