// A step's kernels launched as one captured graph (HIP graphs; CUDA graphs through
// device/hip_compat.h): the few hundred launches of a decode step become one, replayed for every
// later step of the same shape. The kernels read everything that changes from step to step -- the
// rows' tokens and positions, the block tables -- from device memory (device/runtime/step.h), so
// a graph serves every step whose launches take the same arguments from the host: the rows, the
// attention grids' position bound (DeviceRuntime::launch_max_pos) and query tile count, and the
// buffers' addresses.
// The owner clears the graphs when a buffer moves (the arena or the step grows).
//
// Only untraced steps run through a graph: a traced step launches stage by stage and reads each
// stage's output between launches (every layer's own values), as before.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "device/hip_compat.h"

namespace parity::device {

// What a step's launches take from the host besides the buffers' addresses.
struct StepShape {
  int rows = 0;
  int launch_max_pos = 0;
  int query_tiles = 0;   // the attention grids' tiles (Step::device_query_tiles)
  int single_tiles = 0;  // of which the leading ones of one row each (QueryTiles::singles)
  friend bool operator==(const StepShape&, const StepShape&) = default;
};

class StepGraphs {
 public:
  enum class Launch { direct, captured, replayed };
  struct Counts {
    int64_t direct = 0, captured = 0, replayed = 0;
  };
  // Graphs kept at most (the least recently used goes first).
  static constexpr int kCapacity = 16;

  StepGraphs() = default;
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Launches a step's kernels (`launch` enqueues them on `stream`, nothing else): replays the
  // graph of `shape` when there is one; captures one when the previous step had this shape too
  // (a shape seen once, a prefill chunk, is not worth a capture), then launches it; else launches
  // directly. A launcher's exception ends the capture, and the stream is usable again.
  Launch run(const StepShape& shape, hipStream_t stream, const std::function<void()>& launch);
  // Launches directly, counted as such (graphs off).
  Launch direct(const std::function<void()>& launch);
  // Destroys every graph. The caller has waited for the stream (a graph may be in flight).
  void clear();

  const Counts& counts() const { return counts_; }
  int size() const { return int(entries_.size()); }

 private:
  struct Entry {
    StepShape shape;
    hipGraphExec_t exec = nullptr;
    uint64_t last_used = 0;
  };
  hipGraphExec_t capture(hipStream_t stream, const std::function<void()>& launch);

  std::vector<Entry> entries_;
  std::optional<StepShape> previous_;
  uint64_t clock_ = 0;
  Counts counts_;
};

}  // namespace parity::device
