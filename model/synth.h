// Deterministic synthetic gpt-oss checkpoints in the hub layout: config.json, safetensors
// shards with model.safetensors.index.json, MXFP4 experts (blocks/scales U8), BF16 for the rest.
// The same (preset, seed) gives the same bytes on every machine.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace parity {

struct SynthSpec {
  std::string preset;  // "tiny", "20b", "120b" or "custom"
  Config config;
  uint64_t seed = 0;
  int shards = 1;  // number of safetensors files
};

// Presets: tiny (seconds; CI), 20b and 120b (the real shapes). Throws on an unknown name.
SynthSpec synth_preset(const std::string& name);

struct SynthResult {
  uint64_t bytes = 0;  // bytes written, all files
  double seconds = 0;
};

// Writes the checkpoint into out_dir (created if needed). Files appear only when complete.
SynthResult write_synthetic_checkpoint(const SynthSpec& spec, const std::string& out_dir,
                                       bool progress);

}  // namespace parity
