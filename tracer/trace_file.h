// HDF5 trace files (HDF5 C++ API). Layout, for h5dump/h5py users:
//   /                         attributes: format="gpt-oss-parity-trace", format_version=1,
//                             backend, precision, config (JSON text), checkpoint_fingerprint,
//                             model_dir, tokens (int32[]), positions (int32[]), tool_version,
//                             commit, device (JSON text), created (ISO 8601 UTC)
//   /pos_<P>/model/<stage>    model-scope stages (embedding, final_norm, logits)
//   /pos_<P>/layer_<L>/<stage>
// e.g. the logits at position 7 are /pos_7/model/logits, shape [vocab]. Real stages are
// float64 in reference traces and float32 in all others; topk_idx is int32. Expert stages
// (mlp1, swiglu, mlp2) are [k, n]: row i belongs to the expert in slot i of topk_idx.
// Dataset attributes: stage, layer (-1 at model scope), position, order (execution order
// within the position). A trace is written under a temporary name and renamed when complete.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/forward.h"

namespace parity {

inline constexpr const char* kTraceFormat = "gpt-oss-parity-trace";
inline constexpr int kTraceFormatVersion = 1;

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
};

std::string trace_dataset_path(int position, int layer, Stage s);

// Observer that writes every wanted stage row into an HDF5 file. `positions` empty = all.
class TraceWriter : public Observer {
 public:
  TraceWriter(std::string path, TraceMeta meta, std::set<int> positions = {});
  ~TraceWriter() override;  // an unfinished trace is removed
  bool wants(int position, int layer, Stage s) const override;
  void record(const StageKey& key, const StageData& data) override;
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
  const std::vector<TraceEntry>& entries() const;  // sorted by (position, order)
  bool has(const std::string& dataset_path) const;
  StageData read(const std::string& dataset_path) const;
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parity
