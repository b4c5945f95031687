// Helpers shared by the CLI mains: model resolution (directory or preset), backend creation,
// and the error boundary that turns every parity::Error into one line and exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "device/kernel_types.h"
#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/lockstep.h"
#include "tracer/differ.h"
#include "tracer/trace_file.h"

namespace parity {

// Exit codes shared by every tool (as h5diff): 0 no differences, 1 differences, 2 error.
inline constexpr int kExitOk = 0, kExitDiverged = 1, kExitError = 2;

// DIR, or a preset name (tiny, 20b, 120b) looked up as <models_dir>/<preset>. models_dir
// comes from the flag, else $PARITY_MODELS_DIR, else ./models. `tiny` is synthesized there
// on first use (a few seconds), so `--model tiny` works with no setup.
std::string resolve_model(const std::string& model, const std::string& models_dir_flag);

// Whether `name` names the device backend: hip, or its other names cuda and gpu.
bool is_device_backend(const std::string& name);

// "reference", "cpu-f32", "hip" (when built with a device backend; "cuda" and "gpu" name it too).
// The device backend takes its options from the environment (device_options_from_environment);
// `precision`, when given (a tool's --precision), replaces the products' precision
// (PARITY_DEVICE_PRECISION, else fp32). A host backend takes none or fp32.
// `tensor_parallel` > 1 (a tool's --tensor-parallel): the device backend over a group of that
// many GPUs (0, 1, ...), the model split over them (make_hip_group_backend); refused, one line,
// for a host backend, a degree the model cannot be split by, or more GPUs than the host has.
std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model,
                                      std::optional<device::Precision> precision = std::nullopt,
                                      int tensor_parallel = 1);
std::string default_candidate();  // hip when a device is present, else cpu-f32
// make_backend for `sequences` sequences of up to `context` positions decoded together: the
// device backend's KV cache holds them unless PARITY_DEVICE_KV_BYTES or
// PARITY_DEVICE_MAX_CONTEXT says otherwise (the host backends hold any number).
std::unique_ptr<Backend> make_batched_backend(
    const std::string& name, const Model& model, int sequences, int context,
    std::optional<device::Precision> precision = std::nullopt, int tensor_parallel = 1);

// The precision a tool's `--precision NAME` names for the backend of its --backend, checked
// before any work: an unknown name is parse_precision's error ("--precision NAME: not a
// precision (fp32, bf16)"); a host backend takes fp32 alone (cpu-f32 computes in float32, the
// reference in float64), bf16 with it is refused.
device::Precision backend_precision_option(const std::string& name, const std::string& backend);

// OpenMP workers that wait actively at barriers spin while another process holds the cores,
// which made a two-thread step hundreds of times slower on a busy machine. libgomp reads its
// wait policy only at startup, so when OMP_WAIT_POLICY is unset this re-executes the tool with
// it set to passive (a user's own setting is kept). Called first in every tool's main().
void prefer_passive_openmp_wait(char** argv);

// Runs body(); parity::Error and std::exception become one line "<tool>: error: ..." (control
// characters escaped, capped) and exit 2.
int guarded_main(const char* tool, const std::function<int()>& body);

// Adds --version (version, commit, build) to the app, parses argv, and handles the outcome:
// nullopt to go on; kExitOk after --help or --version; kExitError after a bad command line, with
// one line "<tool>: error: <what> (see --help)".
std::optional<int> parse_command_line(CLI::App& app, const char* tool, int argc, char** argv);

std::string iso8601_now();

// The golden data: <directory of this executable>/../share/gpt-oss-parity/golden when it exists
// (an installed tool), else the source tree's golden/ the build was configured from.
std::string default_golden_dir();

// Writes `text` to `path` as a whole or not at all: into a temporary file beside it, then
// renamed into place. Refuses a path that exists and is not a regular file (a directory, a
// device node); on any failure the temporary file is removed and the error names the path.
void write_file_atomically(const std::string& path, std::string_view text);

// For an output file named by `option` (--junit FILE, -o FILE), before any work: refuses a path
// whose directory does not exist or is not a directory, and a path that is a directory or another
// file that is not regular, so that a run never ends in an error about where its report goes.
void require_output_file_destination(const std::string& path, std::string_view option);

// The JUnit file of a run that failed with `error`: one error testcase with the tool's error line.
// When that file cannot be written either, throws one Error with the run's own error first and
// the JUnit failure after it, so that the real error is still what the user reads.
void write_junit_error_file(const std::string& path, const char* tool, const Error& error);

// A trace's metadata from the backend that writes it and the model it runs: backend name,
// precision (text and policy), config, checkpoint fingerprint, model directory, device facts,
// tool version, commit, creation time.
TraceMeta trace_meta(const Backend& backend, const Model& model);

// run_lockstep with a TraceWriter on each side, both traces finished (with the run's tokens,
// generated ones included) and in place when it returns; `run_facts` goes into both traces'
// `run` attribute.
// The reference trace of a candidate trace the reference cannot replay (a capture, or any trace
// without replay): the reference's own rows and, recomputed from the candidate's own inputs, each
// stage the candidate holds (model/recompute.h), at the candidate's positions, into
// `reference_path`; the candidate's inputs are rounded to `policy`'s storage. The run attribute
// holds run_facts and what the recompute saw of the candidate's values ("recompute"); the run id
// is the candidate's. With first_position > 0 the reference's recompute sequence already holds the
// candidate's KV rows of the positions before it (Backend::load_cache): only the recomputed rows
// from there on are traced (RecomputeOptions::first_position).
RecomputeResult trace_recompute(Backend& reference, const Model& model, const TraceReader& candidate,
                                const PrecisionPolicy& policy, int step_rows,
                                const std::string& reference_path, nlohmann::json run_facts,
                                int first_position = 0);

// 0, 1, ..., n - 1: the positions of a trace's token list.
std::vector<int32_t> positions_of(size_t n);

LockstepResult trace_lockstep(Backend& reference, Backend& candidate, const Model& model,
                              const LockstepOptions& options, const std::string& reference_path,
                              const std::string& candidate_path,
                              const nlohmann::json& run_facts = nlohmann::json::object());

// The criterion of the command-line flags shared by parity-trace and parity-diff: a fixed
// tolerance when --atol/--rtol, --profile or a profile name as --tolerance is given (with the
// --stage-tol overrides), else the derived bounds with --lambda and --bound-safety; --judge.
// Throws parity::Error on a bad value.
struct CriterionFlags {
  std::string tolerance = "derived";  // "derived" or a profile name
  std::string profile;                // a profile name, or empty
  bool explicit_abs_rel = false;
  double atol = 0, rtol = 0;
  std::vector<std::string> stage_tolerances;  // STAGE=ATOL,RTOL
  double lambda = BoundOptions{}.lambda, safety = 1;
  std::string judge;  // "local", "accumulated" or empty
};
Criterion criterion_from_flags(const CriterionFlags& flags);

// The precision presets, "float64, float32, ...", for --help.
std::string preset_list();

// Adds the criterion flags above to a tool's command line (--tolerance, --profile, --atol and
// --rtol, --stage-tol, --lambda, --bound-safety, --judge); `judge_help` says what --judge
// defaults to in that tool. explicit_abs_rel is set when --atol is given.
void add_criterion_options(CLI::App& app, CriterionFlags& flags, const std::string& judge_help);

// A list of token ids, "t0,t1,..." or repeated: CLI11 converts each value (an int32 out of
// range is an error, never wrapped); an empty value ("1,,2", or "" as its own argument) is an
// error rather than a silent token 0.
CLI::Option* add_token_list_option(CLI::App& app, const std::string& name,
                                   std::vector<int32_t>& tokens, const std::string& help);

// An integer option read as decimal digits alone (CLI11 reads 010 as octal and 0x10 as hex, and
// saturates a 64-bit value at 2^64 - 1) and at least `min`: a bad value is one line naming the
// option, e.g. "--max-batch: 0 is not a positive count".
CLI::Option* add_decimal_option(CLI::App& app, const std::string& name, int& value,
                                const std::string& help, int min);
CLI::Option* add_decimal_option(CLI::App& app, const std::string& name, uint64_t& value,
                                const std::string& help);

// A check for options whose empty value would silently mean "the default": --gpus "" is refused.
CLI::Validator non_empty_value();

// parity-diff's selection flags (--stage, --layer, --position, --exclude; object paths are the
// tool's positionals) into a DiffSelection; throws parity::Error naming a bad value.
struct SelectionFlags {
  std::vector<std::string> stages, layers, paths, excluded;
  std::vector<int> positions;
};
void add_selection_options(CLI::App& app, SelectionFlags& flags);
DiffSelection selection_from_flags(const SelectionFlags& flags);

}  // namespace parity
