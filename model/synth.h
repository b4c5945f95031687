// Deterministic synthetic gpt-oss checkpoints in the hub layout: config.json, safetensors
// shards with model.safetensors.index.json, MXFP4 experts (blocks/scales U8), BF16 for the rest.
// The same (preset, seed, magnitudes) gives the same bytes on every machine.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace parity {

// How large the weights, and so the activations, are (the scales are in model/synth.cpp).
enum class SynthMagnitudes {
  // Every activation O(1): embeddings N(0, 1), norm weights near 1, small biases. The bytes
  // parity-synth wrote before this choice existed; the golden files are made from them.
  unit,
  // The magnitudes of real checkpoints: embedding rows of RMS ~0.03, norm weights of mean ~2.6
  // spread up to ~10, q/k/v/o biases and sinks of several units, and "massive activations":
  // a few residual channels pushed to hundreds by the first two layers and kept there.
  realistic,
};
std::string_view synth_magnitudes_name(SynthMagnitudes m);
// "unit" or "realistic"; throws parity::Error on anything else.
SynthMagnitudes parse_synth_magnitudes(std::string_view name);

struct SynthSpec {
  std::string preset;  // "tiny", "20b", "120b" or "custom"
  Config config;
  uint64_t seed = 0;
  int shards = 1;  // number of safetensors files
  SynthMagnitudes magnitudes = SynthMagnitudes::unit;
};

// Presets: tiny (seconds; CI), 20b and 120b (the real shapes). Throws on an unknown name.
SynthSpec synth_preset(const std::string& name);

// A residual channel that realistic magnitudes push to a massive value, and the value it is
// pushed to from layer 1 on (half of it after layer 0). Empty for unit magnitudes.
struct SynthOutlier {
  int channel = 0;
  double value = 0;
};
// Fixed by the seed and the hidden size; the same channels in every layer.
std::vector<SynthOutlier> synth_outliers(const SynthSpec& spec);

struct SynthResult {
  uint64_t bytes = 0;  // bytes written, all files
  double seconds = 0;
};

// Writes the checkpoint into out_dir (created if needed). Files appear only when complete.
SynthResult write_synthetic_checkpoint(const SynthSpec& spec, const std::string& out_dir,
                                       bool progress);

}  // namespace parity
