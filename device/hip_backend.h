// The `hip` backend: every stage of the forward graph on the GPU (AMD through HIP, NVIDIA
// through device/hip_compat.h). Weights stay on the device in their checkpoint dtypes (MXFP4
// experts as blocks/scales, BF16/F16/F32 matrices; biases and sinks as exact float copies),
// activations and the KV cache are float32. One KV cache per sequence id, preallocated for
// PARITY_DEVICE_MAX_CONTEXT positions (default min(4096, the model's context)). No host
// synchronisation inside a step: the expert indices never leave the device; tracing (read)
// copies one row to the host only when called, write() copies one row back.
//
// This header includes no vendor header, so tools and tests include it with any compiler.
#pragma once
#include <memory>
#include <string>

#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity {

// True when a usable GPU is present (the runtime finds at least one device).
bool device_available();
// Why device_available() is false ("no devices", or the runtime's error); empty when it is true.
std::string device_unavailable_reason();

// Loads the model's weights onto the current device; throws parity::Error (with the sizes) when
// the model, one sequence's KV cache and the activations do not fit.
std::unique_ptr<Backend> make_hip_backend(const Model& m);

// Device-to-device copy bandwidth of the current device: `reps` copies of `bytes` timed with
// device events after one warm-up copy; the median, counting bytes read plus bytes written
// (2 x bytes per copy), in GB/s (1e9 bytes). The practical ceiling of a bandwidth-bound kernel.
double device_copy_bandwidth_gbs(size_t bytes, int reps);

}  // namespace parity
