// The `hip` backend: every stage of the forward graph on the GPU (AMD through HIP, NVIDIA
// through device/hip_compat.h), an adapter from the graph's Backend interface to the device
// runtime (device/runtime/: weights in their checkpoint dtypes, the activation arena, the paged
// KV cache, the step). No host synchronisation inside a step: the expert indices never leave
// the device; tracing (read) copies one row to the host only when called, write() copies one
// row back.
//
// This header includes no vendor header, so tools and tests include it with any compiler.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "device/runtime/copy_bandwidth.h"
#include "device/runtime/device.h"
#include "device/runtime/options.h"
#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity {

// Loads the model's weights onto the device `options` name; throws parity::Error (with the
// sizes) when the weights, the KV cache and the activations do not fit.
std::unique_ptr<Backend> make_hip_backend(const Model& m, const device::DeviceOptions& options);

// The same with the options of the environment (device::device_options_from_environment():
// PARITY_DEVICE_MAX_CONTEXT, PARITY_DEVICE_ROWS, PARITY_DEVICE_KV_BYTES, PARITY_DEVICE_SYNC; the
// memory report on standard error), as the tools call it.
std::unique_ptr<Backend> make_hip_backend(const Model& m);

// The `hip` backend over a tensor-parallel group (device/hip_group_backend.cpp): rank i on GPU
// devices[i] holds its part of the model (options.tensor_parallel.experts_split; the degree,
// rank and communicator are set here), every stage runs on all ranks at once, and the graph
// reads and writes the model's full rows, gathered from the ranks' and scattered to them; a row
// read tells how its ranks made it (StageData::shards). Throws parity::Error, one line, when the
// model cannot be split so, NCCL/RCCL cannot set the group up, or a rank's part does not fit.
std::unique_ptr<Backend> make_hip_group_backend(const Model& m,
                                                const device::DeviceOptions& options,
                                                std::span<const int> devices);

}  // namespace parity
