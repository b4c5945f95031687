// The CPU backends: `reference` (every activation and accumulation in double; the oracle) and
// `cpu-f32` (the same ops in float with float accumulation; a realistic second path).
// Both are the same templated code; results are bitwise identical for any OpenMP thread count.
#pragma once
#include <memory>

#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity {

std::unique_ptr<Backend> make_reference_backend(const Model& model);
std::unique_ptr<Backend> make_cpu_f32_backend(const Model& model);

}  // namespace parity
