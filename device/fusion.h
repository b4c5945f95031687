// Which stage outputs the device's fused kernels write beyond their own, written once: the `hip`
// backend (device/hip_backend.cpp) reads it to decide when a covered stage must recompute, the
// launch map (device/stage_launch.cpp) to launch nothing for a covered stage, and the production
// engine (engine/device_runner.cpp) to leave covered stages out of its launch sequence. Host
// arithmetic only: the table is tested on machines without a GPU.
//
// Fusion keeps every stage boundary visible: a fused kernel writes every stage output it
// covers, so a traced step reads each stage's own output. When the graph overwrites an output
// (injection, replay) that a covered part was computed from, the covered stage's launch
// recomputes that part from the written values with its own kernel (`recompute` of
// launch_stage): `recompute_when` lists those outputs.
//
// The MMA kernels' BF16 split of an input is a second kind of fusion (the producer of a norm,
// the attention output or swiglu writes the split its consumer reads); the runtime records whose
// split each scratch holds (DeviceRuntime::split_holds), and a write forgets them.
#pragma once
#include <span>

#include "model/stages.h"

namespace parity::device {

// What of the covered stage the producer's kernel computes.
enum class Covers {
  output,            // the covered stage's whole output: its launch runs nothing
  attention_output,  // the whole output where a fused attention kernel runs: the decode kernel
                     // at decode-sized steps (attention_decode_fuses in device/kernels.h), the
                     // bf16 precision's MMA kernel at every step (attention_mma_fuses; att only
                     // in a traced step, from the scores it writes there); otherwise its own
  kv_append,         // the covered stage's append of this step's rows to the KV cache
};

struct Fusion {
  Stage covered;
  Stage producer;  // runs earlier in the same layer, and writes the covered part
  Covers covers;
  // Outputs whose overwrite since the producer ran makes the covered part stale: the covered
  // stage's launch then recomputes it from them.
  std::span<const Stage> recompute_when;
};

// Every fusion of the device path, in stage order of the covered stage.
std::span<const Fusion> fusions();

// The fusion of stage `s`, or null when nothing covers any part of it.
const Fusion* fusion_of(Stage s);

// Whether an earlier kernel of its layer writes all of `s` at every step size (the engine's
// launch sequence leaves such stages out).
bool fused_into_producer(Stage s);

// Whether stage `s`'s covered part must be recomputed, given which outputs were overwritten
// since they were last computed (`overwritten(stage)`).
template <typename Overwritten>
bool covered_part_stale(Stage s, const Overwritten& overwritten) {
  const Fusion* f = fusion_of(s);
  if (f == nullptr) return false;
  for (Stage w : f->recompute_when)
    if (overwritten(w)) return true;
  return false;
}

}  // namespace parity::device
