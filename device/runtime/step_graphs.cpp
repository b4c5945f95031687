#include "device/runtime/step_graphs.h"

#include <algorithm>

namespace parity::device {

hipGraphExec_t StepGraphs::capture(hipStream_t stream, const std::function<void()>& launch) {
  // Thread-local: another thread's unrelated calls (another device's runtime) are not refused.
  HIP_CHECK(hipStreamBeginCapture(stream, hipStreamCaptureModeThreadLocal));
  try {
    launch();
  } catch (...) {
    hipGraph_t partial = nullptr;
    (void)hipStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)hipGraphDestroy(partial);
    (void)hipGetLastError();
    throw;
  }
  hipGraph_t graph = nullptr;
  HIP_CHECK(hipStreamEndCapture(stream, &graph));
  hipGraphExec_t exec = nullptr;
  const hipError_t made = hipGraphInstantiateWithFlags(&exec, graph, 0);
  (void)hipGraphDestroy(graph);  // the executable graph keeps what it needs
  HIP_CHECK(made);
  return exec;
}

StepGraphs::Launch StepGraphs::run(const StepShape& shape, hipStream_t stream,
                                   const std::function<void()>& launch) {
  const bool repeated = previous_ == shape;
  previous_ = shape;
  ++clock_;
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.shape == shape; });
  if (it != entries_.end()) {
    it->last_used = clock_;
    HIP_CHECK(hipGraphLaunch(it->exec, stream));
    ++counts_.replayed;
    return Launch::replayed;
  }
  if (!repeated) {
    direct(launch);
    previous_ = shape;
    return Launch::direct;
  }
  if (int(entries_.size()) >= kCapacity) {
    auto lru =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    HIP_CHECK(hipStreamSynchronize(stream));  // it may be the graph of the step in flight
    (void)hipGraphExecDestroy(lru->exec);
    entries_.erase(lru);
  }
  const hipGraphExec_t exec = capture(stream, launch);
  entries_.push_back(Entry{shape, exec, clock_});
  HIP_CHECK(hipGraphLaunch(exec, stream));
  ++counts_.captured;
  return Launch::captured;
}

StepGraphs::Launch StepGraphs::direct(const std::function<void()>& launch) {
  previous_.reset();
  launch();
  ++counts_.direct;
  return Launch::direct;
}

void StepGraphs::clear() {
  for (const Entry& e : entries_) (void)hipGraphExecDestroy(e.exec);
  entries_.clear();
  previous_.reset();
}

}  // namespace parity::device
