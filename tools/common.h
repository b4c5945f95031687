// Helpers shared by the CLI mains: model resolution (directory or preset), backend creation,
// and the error boundary that turns every parity::Error into one line and exit code 2.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/backend.h"
#include "model/checkpoint.h"

namespace parity {

// Exit codes shared by every tool (as h5diff): 0 no differences, 1 differences, 2 error.
inline constexpr int kExitOk = 0, kExitDiverged = 1, kExitError = 2;

// DIR, or a preset name (tiny, 20b, 120b) looked up as <models_dir>/<preset>. models_dir
// comes from the flag, else $PARITY_MODELS_DIR, else ./models. `tiny` is synthesized there
// on first use (a few seconds), so `--model tiny` works with no setup.
std::string resolve_model(const std::string& model, const std::string& models_dir_flag);

// "reference", "cpu-f32", "hip" (when built with a device backend).
std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model);
std::string default_candidate();  // hip when a device is present, else cpu-f32

// Runs body(); parity::Error and std::exception become "<tool>: error: ..." and exit 2.
int guarded_main(const char* tool, const std::function<int()>& body);

std::string iso8601_now();

}  // namespace parity
