// The engine's steps on a tensor-parallel group (device/runtime/shard_plan.h): one device runner
// (engine/device_runner.h) per GPU, each a rank holding its part of the model, joined by NCCL
// (RCCL on AMD) through device/runtime/communicator.h. Every rank runs every step on a thread of
// its own, in lockstep: the same batch, its own kernels, the all-reduces after o_proj and the
// experts and the logits' join meeting in the middle; every rank samples the same tokens from
// the same joined logits, and the runner checks that they do.
#pragma once
#include <memory>
#include <span>

#include "device/runtime/options.h"
#include "engine/step_runner.h"
#include "model/checkpoint.h"

namespace parity {

// A group of devices.size() ranks, rank i on GPU devices[i], each with `o` (its device and
// tensor_parallel set here). Throws parity::Error, one line, when the model cannot be split so,
// the build has no NCCL/RCCL, the library fails to set the group up, or the ranks' KV pools
// differ (o.kv_bytes gives them one size).
std::unique_ptr<StepRunner> make_tensor_parallel_runner(const Model& m,
                                                        const device::DeviceOptions& o,
                                                        std::span<const int> devices,
                                                        bool kernel_times);

}  // namespace parity
