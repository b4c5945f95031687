// Precision policies: how a backend or a port rounds, stage by stage, as the numbers the error
// bounds (tracer/bounds.h) are derived from. A candidate declares its policy (a backend in code,
// a capture in its trace) and the differ verifies it: a stage whose error exceeds what its
// declared rounding allows did something other than round.
//
// One StagePrecision holds for every stage, and a stage may declare its own where it differs
// (transformers runs its RMSNorm in float32 inside a bfloat16 model). The fields:
//   storage       u_s  the unit roundoff of the format a stage's output is stored in (and so of
//                      the stored inputs the next stage reads)
//   accumulation  u_a  sums (dot products, softmax denominators, mean squares) and the
//                      arithmetic of elementary functions
//   intermediate  u_e  results a stage materializes between its operations: RoPE's cos/sin
//                      tables and products, the scaled scores, the softmax's subtraction of the
//                      maximum, SwiGLU's factors, the products of the routed sum. Fused kernels
//                      keep them in registers (u_e = u_a); an eager PyTorch port rounds each to
//                      its dtype
//   operand       u_o  stored inputs rounded to this before the arithmetic (BF16 operands of a
//                      tensor-core GEMM over float32 activations); 0: the inputs as stored
//   bias          u_b  a projection's sum rounded before its bias is added (`x @ W + b` as two
//                      operations); 0: the bias is a term of the sum
//   function_ulps F    exp, sin, cos, sqrt and division within F u_a
//   min_normal         below it a correct implementation may flush to zero
// The presets (preset_names(); python/parity_capture/precision.py is their Python twin) name the
// ports people run: float64, float32, bfloat16 and float16 (stored in that format, computed in
// float32 inside each stage), vllm-like, bf16-operands, transformers-f64/-f32/-bf16/-f16.
#pragma once
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/stages.h"

namespace parity {

inline constexpr double kUnitFloat64 = 0x1p-53, kUnitFloat32 = 0x1p-24, kUnitFloat16 = 0x1p-11,
                        kUnitBfloat16 = 0x1p-8;

struct StagePrecision {
  double storage = kUnitFloat32;
  double accumulation = kUnitFloat32;
  double intermediate = kUnitFloat32;
  double operand = 0;
  double bias = 0;
  double function_ulps = 4;
  double min_normal = 0x1p-126;
  friend bool operator==(const StagePrecision&, const StagePrecision&) = default;

  // The rounding between a value of the stage's input and the operand its arithmetic uses:
  //   inputs_exact  the input is the implementation's own stored value (the reference recomputes
  //                 a capture's stage from the capture's inputs): only a coarser operand format
  //                 rounds it again
  //   otherwise     the input is the reference's exact value, stored by the implementation
  //                 (replay): u_s, plus a coarser operand format's rounding
  double input_rounding(bool inputs_exact) const {
    const double extra = operand > storage ? operand : 0.0;
    return inputs_exact ? extra : storage + extra;
  }
};

// The storage formats a unit roundoff names: float64, float32, float16, bfloat16; "" otherwise.
std::string_view storage_format_name(double unit_roundoff);
// x rounded to nearest even in the storage format of `unit_roundoff` (one of the four above; any
// other leaves x as it is). A value the format cannot hold (float16 beyond 65504) stays as it is.
double round_to_storage(double x, double unit_roundoff);

struct PrecisionPolicy {
  std::string name;       // the preset's name; "" for one spelled out field by field
  StagePrecision all;     // every stage without its own
  std::array<std::optional<StagePrecision>, kNumStages> stages{};  // a stage's own

  const StagePrecision& at(Stage s) const {
    const auto& own = stages[size_t(s)];
    return own ? *own : all;
  }
  // The largest storage unit roundoff over the stages (a tolerance profile is chosen by it).
  double coarsest_storage() const;

  // {"name", the seven fields of `all` (as *_unit_roundoff, function_ulps, storage_min_normal),
  // "stages": {stage: {the fields where it differs}}}.
  nlohmann::json to_json() const;
  // Reads to_json()'s form; a stage's fields default to `all`'s, and `all`'s intermediate to its
  // accumulation, operand and bias to 0 (the form of format version 2 traces before these fields).
  // Throws parity::Error naming `source` unless every field is a finite number in range and
  // every stage name is a stage.
  static PrecisionPolicy from_json(const nlohmann::json& j, const std::string& source);
  // A named preset; throws parity::Error listing the presets for an unknown name.
  static PrecisionPolicy preset(std::string_view name);
  static std::vector<std::string_view> preset_names();
  static PrecisionPolicy float32(double function_ulps);
  static PrecisionPolicy float64();
  // One line: "transformers-bf16 (storage bfloat16, accumulation float32, ...; 6 stages differ)".
  std::string describe() const;
};

}  // namespace parity
