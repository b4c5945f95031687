// The kernels of one stage call of the forward graph (model/forward.h) for every row of the
// runtime's current step: the one place that maps (stage, layer) to kernel launches. The parity
// backend (device/hip_backend.cpp) calls it stage by stage between its reads and writes; the
// production engine (engine/device_runner.cpp) calls it for every stage of every layer. Both
// therefore run the same kernels in the same order on the same buffers.
//
// Fused kernels write every stage output they cover (device/hip_backend.cpp lists them); the
// stages they cover launch nothing unless `recompute` says their fused producer's output was
// overwritten since it ran (injection, replay), in which case they recompute from it. Likewise
// scores appends k_rope and v to the KV cache (q_rope's kernel did) only with `recompute`: when
// either was overwritten since.
#pragma once
#include "device/runtime/runtime.h"
#include "model/stages.h"

namespace parity::device {

// Launches stage `s` of `layer` (kModelLayer for model-scope stages) on rt's stream over the
// current step's rows. The epilogue stages (final_norm, logits, sampled) run on every row.
void launch_stage(DeviceRuntime& rt, Stage s, int layer, bool recompute);

// Whether `s` is covered by an earlier fused kernel of its layer (launch_stage launches nothing
// for it unless asked to recompute).
bool fused_into_producer(Stage s);

}  // namespace parity::device
