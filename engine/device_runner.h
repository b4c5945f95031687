// The engine's production path: steps on the device runtime (device/runtime/runtime.h) with the
// kernels the traced `hip` backend runs (device/stage_launch.h), in the same order on the same
// buffers, so a row's logits are the traced ones bit for bit. What the engine does not need is
// left out: no per-stage bookkeeping, the epilogue (final_norm, lm_head) only for the rows that
// are sampled, and sampling on the device (launch_f32_sample; greedy rows take the argmax), so
// the only host synchronisation of a step is reading its sampled tokens. Finished sequences
// give their KV blocks back at once (paged cache, device/runtime/kv_cache_pool.h). The embedding
// and the layers of a step launch as one captured graph where the options allow
// (DeviceOptions::graphs; DeviceRuntime::run_step), the epilogue and sampling on their own.
//
// With `kernel_times`, each stage's kernels are timed with device events and summed per stage
// (launched one by one, no graph; the step then waits for its events; a diagnostic, not the
// serving path).
#pragma once
#include <memory>

#include "device/runtime/options.h"
#include "engine/step_runner.h"
#include "model/checkpoint.h"

namespace parity {

std::unique_ptr<StepRunner> make_device_runner(const Model& m, const device::DeviceOptions& o,
                                               bool kernel_times);

}  // namespace parity
