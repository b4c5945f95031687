// HDF5 trace files (HDF5 C API). Layout, for h5dump/h5py users:
//   /                         attributes: format="gpt-oss-parity-trace", format_version=2,
//                             backend, precision, config (JSON text), checkpoint_fingerprint,
//                             model_dir, tokens (int32[]), positions (int32[]), tool_version,
//                             commit, device (JSON text), created (ISO 8601 UTC)
//                             precision_policy (JSON: unit roundoffs, function ulps), replay
//                             (1 when the trace holds replay datasets), run (JSON: how it ran),
//                             run_id (shared by the reference and candidate traces of one run)
//   /pos_<P>/model/<stage>    model-scope stages (embedding, final_norm, logits, sampled)
//   /pos_<P>/layer_<L>/<stage>
//   /replay/pos_<P>/...       candidate traces: each stage re-run on the reference's inputs
//                             (its local result; model/lockstep.h)
//   /magnitude/pos_<P>/...    reference traces: per element, the sum of |terms| of the
//                             stage's sums (projections, scores, attn_out), for error bounds
//   /recompute/pos_<P>/...    reference traces of a capture: each stage recomputed by the
//                             reference from the capture's own inputs (model/recompute.h)
//   /recompute_magnitude/..., /recompute_bias/...
//                             the magnitude rows of those sums, and |bias| of the projections
//   /cache/layer_<L>/k_rope, v  a capture's KV-cache rows of positions 0..n-1 in one dataset
//                             each, [n, nKV, d], for every layer: the prefix the reference takes
//                             as its own cache instead of running it
// e.g. the logits at position 7 are /pos_7/model/logits, shape [vocab]. Real stages are
// float64 in reference traces and float32 in all others; topk_idx and sampled are int32.
// Expert stages (mlp1, swiglu, mlp2) are [k, n]: row i belongs to the expert in slot i of
// topk_idx. Dataset attributes: stage, layer (-1 at model scope), position, order (execution
// order within the position); a capture's dataset may carry layout, the port's layout as it
// recorded the row ("NO_SINK": the att row's sink column is 1 - the keys' sum, not the port's). A trace is written under a temporary name and renamed when
// complete. Format version 1 (no replay, magnitude, sampled, precision_policy) is still read.
//
// Written with the newest HDF5 file format (superblock 3, object headers 2: every metadata
// block carries a checksum, so a damaged file is a checksum error rather than a wild pointer),
// string attributes as fixed-length UTF-8 (no global heap, the one metadata structure without
// a checksum), and groups that track link creation order, so that h5ls and h5py list
// positions, layers and stages in the order they ran.
//
// A trace is untrusted input: the reader refuses anything it cannot vouch for (an attribute of
// the wrong type or shape, an order that is not its stage's execution order, a layout that is
// not one of the port layouts of its stage, a dataset whose shape, type or storage is not its
// stage's under the trace's config or whose size the file cannot hold, an empty group, a soft or
// external link, a config that is not a gpt-oss config) with one line naming the file, when it
// opens the file: every dataset is checked then, before anything reads its data. It never
// allocates more than the file could hold. A capture (TraceKind::capture: what a port wrote
// through the capture API) is held to its own layout besides: /pos_<P>/... rows and /cache
// rows only; the series parity-trace computes (/replay, /magnitude, /recompute...) and anything
// else are refused.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/forward.h"
#include "model/recompute.h"

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
  // The run both traces of one parity-trace run share (new_run_id()); "" = not recorded (format
  // version 1, other tools). The differ refuses a pair whose run ids are both set and differ:
  // a new reference beside a candidate left by an interrupted earlier run.
  std::string run_id;
};

// A fresh run id: 128 random bits as 32 lowercase hex digits.
std::string new_run_id();
// What a run id may be: 1 to 64 characters of [0-9A-Za-z-] (new_run_id()'s hex, or a UUID).
bool is_valid_run_id(std::string_view id);

std::string trace_dataset_path(int position, int layer, Stage s, Series series = Series::output);
// Where rank `rank`'s partial sum of a tensor-parallel group's row lives:
// /partials/rank_<rank>/pos_<P>/layer_<L>/<stage>.
std::string trace_partial_path(int rank, int position, int layer, Stage s);
std::string_view series_name(Series s);  // "output", "replay", "magnitude"

// Observer that writes every wanted stage row into an HDF5 file. `positions` empty = all.
class TraceWriter : public Observer {
 public:
  // Refuses an output path that exists and is not a regular file, and a meta whose config is
  // not a gpt-oss config or whose run_id is malformed.
  TraceWriter(std::string path, TraceMeta meta, std::set<int> positions = {});
  ~TraceWriter() override;  // an unfinished trace is removed
  bool wants(int position, int layer, Stage s) const override;
  // Refuses (and writes nothing for) a row whose dims are not its stage's at that position under
  // meta.config, whose type is not its stage's kind, or that was recorded before.
  void record(const StageKey& key, const StageData& data) override;
  // The same, with the dataset's "layout" attribute (a capture's record in a port's layout).
  void record(const StageKey& key, const StageData& data, std::string_view layout);
  // A tensor-parallel rank's partial sum of the row `key` names, before the all-reduce:
  // trace_partial_path(rank, ...), a row of the stage's shape: beside the rows, read by the
  // differ where a bound needs them (moe_out's, from mlp2's partial sums) and there to be
  // inspected (h5dump, h5py).
  void record_partial(const StageKey& key, int rank, const StageData& data) override;
  // The KV-cache rows of positions 0..rows.count-1 of `layer` (/cache/layer_<L>), as float64 or
  // float32. Once per layer.
  void record_cache(int layer, const KvRows& rows, bool f64);
  // The run attribute written at finish() (what a run learns as it goes), in place of meta.run.
  void set_run(nlohmann::json run);
  // The token list and positions written at finish() (a generating run learns them late).
  void set_tokens(std::vector<int32_t> tokens, std::vector<int32_t> positions);
  // Closes and renames into place. A failed HDF5 call anywhere (a full disk) abandons the trace:
  // the file is closed once, the temporary file removed, and one Error names the trace and the
  // HDF5 error; later calls are refused.
  void finish();
  // The name the trace is written under until finish() renames it: the path, the process id and
  // a count of the process's writers (two writers of one path never share it).
  const std::string& temporary_path() const;
  // The temporary name the next writer of `path` in this process takes.
  static std::string next_temporary_path(const std::string& path);
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TraceEntry {
  std::string path;
  StageKey key;
};

// What a file is read as: any trace (users' own annotations beside the rows are skipped), or a
// port's capture, which holds its stage rows and KV-cache rows and nothing else.
enum class TraceKind { trace, capture };

class TraceReader {
 public:
  // Throws naming the file (and the object) if it is not a trace, or not a capture.
  explicit TraceReader(const std::string& path, TraceKind kind = TraceKind::trace);
  ~TraceReader();
  const TraceMeta& meta() const;
  const Config& config() const;  // meta().config, validated
  const std::string& path() const;
  // The output datasets, sorted by (position, order); replay and magnitude datasets are found
  // by path (trace_dataset_path with their series).
  const std::vector<TraceEntry>& entries() const;
  bool has(const std::string& dataset_path) const;
  bool has_series(Series s) const;
  // The dataset's "layout" attribute, "" when it has none.
  std::string layout(const std::string& dataset_path) const;
  // How a tensor-parallel group made the dataset's row (its "shards", "shard_problem" and
  // "shard_problem_rank" attributes, checked against the row when the file was opened); nullopt
  // for a row of one device. read() returns it with the values.
  std::optional<RowShards> shards(const std::string& dataset_path) const;
  // The rank groups of /partials (a tensor-parallel group's partial sums, TraceWriter::
  // record_partial): rank_0 .. rank_<n-1>; 0 when the trace has none. Their rows are found by
  // trace_partial_path, read by read() and listed by no entry.
  int partial_ranks() const;
  // The KV-cache rows a capture recorded in bulk (/cache): how many positions (0..n-1) they
  // cover, the same for every layer; 0 when the trace has none. Throws naming the file when a
  // layer lacks them or the layers disagree.
  int cache_length() const;
  // Those rows of one layer (as float64), after the shape and size checks of every read.
  KvRows cache_rows(int layer) const;
  // Checks the dataset's shape against its stage's rule, its element type against its stage's
  // kind, and its size against the file's, before allocating (as opening did); throws naming
  // file and dataset.
  StageData read(const std::string& dataset_path) const;
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A trace's output rows as the candidate of a recompute (model/recompute.h).
class TraceCandidateRows final : public CandidateRows {
 public:
  explicit TraceCandidateRows(const TraceReader& t) : t_(t) {}
  bool has(int position, int layer, Stage s) const override;
  StageData read(int position, int layer, Stage s) const override;

 private:
  const TraceReader& t_;
};

}  // namespace parity
