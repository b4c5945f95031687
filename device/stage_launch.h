// The kernels of one stage call of the forward graph (model/forward.h) for every row of the
// runtime's current step: the one place that maps (stage, layer) to kernel launches. The parity
// backend (device/hip_backend.cpp) calls it stage by stage between its reads and writes; the
// production engine (engine/device_runner.cpp) calls it for every stage of every layer. Both
// therefore run the same kernels in the same order on the same buffers.
//
// Fused kernels write every stage output they cover (device/fusion.h, the one table of them);
// a covered stage launches nothing for its covered part unless the call is a recompute (an
// output it was computed from was overwritten since: injection, replay; covered_part_stale), in
// which case it recomputes that part with its own kernel.
#pragma once
#include "device/runtime/runtime.h"
#include "model/stages.h"

namespace parity::device {

// How a stage is called:
//   untraced   a step nothing reads between its kernels (the engine, an untraced step of the
//              parity backend): a fused kernel may leave out what only a trace reads (the bf16
//              attention's scores and att)
//   traced     every stage's output is read after its call
//   recompute  traced, and an output the stage's covered part was computed from was overwritten
//              since (covered_part_stale): that part is recomputed with the stage's own kernel
enum class StageCall { untraced, traced, recompute };
// The rows a recompute covers, [first, end) of the step (the rows whose inputs were written):
// the stages whose recomputing kernel gives other bits than the fused one (attn_out of the bf16
// attention) recompute only those; every other stage recomputes all rows, to the same bits.
struct StaleRows {
  int first = 0, end = 0;
};

// Launches stage `s` of `layer` (kModelLayer for model-scope stages) on rt's stream over the
// current step's rows. The epilogue stages (final_norm, logits, sampled) run on every row;
// sampled takes each row's argmax.
void launch_stage(DeviceRuntime& rt, Stage s, int layer, StageCall call, StaleRows stale = {});

// The rows of the step the serving engine samples, in device memory.
struct SampledRows {
  const int32_t* rows = nullptr;  // the step row of each sample
  int count = 0;
  // Each sample's parameters (launch_f32_sample: greedy, temperature, top-k, top-p, seed); null:
  // every sample greedy (argmax).
  const SampleParams* params = nullptr;
  int32_t* tokens = nullptr;  // out: the sampled tokens
};

// Launches epilogue stage `s` (final_norm, logits or sampled) over `rows` only: final_norm
// gathers their resid_ffn rows first (the arena's sampled_rows scratch), logits and sampled then
// hold `rows.count` rows, and sampled writes rows.tokens.
void launch_sampled_stage(DeviceRuntime& rt, Stage s, const SampledRows& rows);

}  // namespace parity::device
