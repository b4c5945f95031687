// Host-side planning for the device backend, kept apart from the device code so that it is
// tested without a GPU: the KV-cache cap, how each checkpoint tensor is placed on the device,
// buffer sizes, the packed layout of the scores/att rows, and the batch/sequence bookkeeping
// (the same validation as the CPU backends).
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity::device {

inline constexpr int kDefaultMaxContext = 4096;
inline constexpr int kDefaultRows = 64;  // parity-trace's default rows per step

// KV-cache positions per sequence: PARITY_DEVICE_MAX_CONTEXT when set (1 .. the model's
// max_position_embeddings), else min(4096, max_position_embeddings). `env` may be null.
int resolve_max_context(const Config& c, const char* env);
// Rows per step the activations are first sized for (PARITY_DEVICE_ROWS, default 64); a larger
// step grows them.
int resolve_initial_rows(const char* env);

// The device element type of a real checkpoint tensor (BF16, F16, F32); throws otherwise.
WeightType weight_type_of(const TensorView& t);

// Every checkpoint tensor the device keeps, placed in one allocation (256-byte aligned).
// Matrices, norm scales and MXFP4 blocks/scales are copied as stored; biases and sinks (small
// vectors read in kernel epilogues) are converted to float32, exactly.
struct WeightEntry {
  const TensorView* tensor = nullptr;
  bool to_f32 = false;
  size_t offset = 0, bytes = 0;
};
struct WeightPlan {
  std::vector<WeightEntry> entries;
  std::map<std::string, size_t> bytes_by_kind;  // "BF16", "U8 (MXFP4 blocks + scales)", ...
  size_t total = 0;
  const WeightEntry& find(const TensorView* t) const;  // throws if the tensor is not placed
};
WeightPlan plan_weights(const Model& m);

// Floats per row of a stage's output (all stages but scores/att, whose rows grow with pos).
size_t stage_row_floats(const Config& c, Stage s);
// Offsets of each row's [nH, pos + 2] block in the packed scores/att buffers; returns the total.
int64_t pack_scores(const Config& c, std::span<const int32_t> positions,
                    std::vector<int64_t>& offsets);

size_t kv_cache_bytes(const Config& c, int max_context);  // one sequence: K and V, all layers
// Stage outputs for `rows` rows plus the attention split workspace (scores/att excluded).
size_t activation_bytes(const Config& c, int rows, int max_context);
std::string format_bytes(size_t bytes);  // "1.50 GiB"

// The KV-cache bookkeeping of every sequence, validated like the CPU backends: token ids in the
// vocabulary, positions in the model's context and the device cache, each sequence's rows
// contiguous from its cached length (starting at or before it truncates the cache).
class SequenceTable {
 public:
  // Validates the batch and records the new lengths; on error nothing changes.
  void begin(const Batch& b, const Config& c, int max_context);
  int length(int seq) const;
  void clear() { length_.clear(); }

 private:
  std::map<int, int> length_;
};

}  // namespace parity::device
