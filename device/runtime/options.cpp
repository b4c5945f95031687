#include "device/runtime/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

#include <fmt/ranges.h>

#include "model/config.h"
#include "model/error.h"
#include "model/untrusted.h"

namespace parity::device {

const char* all_reduce_name(AllReduce a) {
  return a == AllReduce::nccl ? "nccl" : "peer";
}

AllReduce parse_all_reduce(const std::string& name, const char* option) {
  if (name == "peer") return AllReduce::peer;
  if (name == "nccl") return AllReduce::nccl;
  fail("{} {}: give peer (peer stores where the GPUs reach each other, else NCCL) or nccl", option,
       quoted(name, 20));
}

void DeviceOptions::validate() const {
  if (device < -1) fail("device options: device index {} (use -1 for the current device)", device);
  if (max_context < 0)
    fail("device options: max_context {} must be 0 (the default) or positive", max_context);
  if (kv_block_size < 1 || kv_block_size > (1 << 16) || (kv_block_size & (kv_block_size - 1)) != 0)
    fail("device options: kv_block_size {} must be a power of two from 1 to 65536", kv_block_size);
  if (kv_sequences < 0) fail("device options: kv_sequences {} must not be negative", kv_sequences);
  if (!(kv_free_fraction > 0 && kv_free_fraction <= 1))
    fail("device options: kv_free_fraction {} must be in (0, 1]", kv_free_fraction);
  if (arena_rows < 1) fail("device options: arena_rows {} must be positive", arena_rows);
  if (max_step_rows < 0 || (max_step_rows > 0 && max_step_rows < arena_rows))
    fail("device options: max_step_rows {} must be 0 (no limit) or at least arena_rows {}",
         max_step_rows, arena_rows);
  const TensorParallel& tp = tensor_parallel;
  if (tp.degree < 1 || tp.rank < 0 || tp.rank >= tp.degree)
    fail("device options: tensor parallel rank {} of a group of {}", tp.rank, tp.degree);
  if (tp.degree > 1 && tp.comm == nullptr)
    fail("device options: a tensor parallel group of {} without its communicator", tp.degree);
  if (tp.degree > 1 && tp.experts_split != ExpertSplit::by_intermediate)
    fail("device options: the engine splits the experts {} only (not {})",
         expert_split_name(ExpertSplit::by_intermediate), expert_split_name(tp.experts_split));
}

int DeviceOptions::resolve_max_context(const Config& c) const {
  if (max_context == 0) return std::min(kDefaultMaxContext, c.max_position_embeddings);
  if (max_context > c.max_position_embeddings)
    fail(
        "device options: max_context {} (PARITY_DEVICE_MAX_CONTEXT) exceeds the model's context "
        "of {} positions",
        max_context, c.max_position_embeddings);
  return max_context;
}

int parse_positive_int(const std::string& value, const char* name) {
  // std::from_chars: no leading space, no sign (std::stol took " 5" and "+5").
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v <= 0 ||
      v > (1 << 30))
    fail("{}={}: expected a positive integer", name, quoted(value, 40));
  return v;
}

std::string_view precision_name(Precision p) {
  return p == Precision::bf16 ? "bf16" : "fp32";
}
std::vector<std::string_view> precision_names() {
  return {precision_name(Precision::fp32), precision_name(Precision::bf16)};
}
Precision parse_precision(std::string_view name, std::string_view option) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    if (name == precision_name(p)) return p;
  fail("{} {}: not a precision ({})", option, quoted(name, 40), fmt::join(precision_names(), ", "));
}

namespace {
const char* environment(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? v : nullptr;
}
}  // namespace

DeviceOptions device_options_from_environment() {
  DeviceOptions o;
  if (const char* v = environment("PARITY_DEVICE_MAX_CONTEXT"))
    o.max_context = parse_positive_int(v, "PARITY_DEVICE_MAX_CONTEXT");
  if (const char* v = environment("PARITY_DEVICE_ROWS"))
    o.arena_rows = parse_positive_int(v, "PARITY_DEVICE_ROWS");
  o.kv_sequences = kEnvironmentKvSequences;
  if (const char* v = environment("PARITY_DEVICE_KV_BYTES")) {
    o.kv_sequences = 0;
    if (std::string(v) != "free") o.kv_bytes = parity::parse_byte_size(v, "PARITY_DEVICE_KV_BYTES");
  }
  if (const char* v = environment("PARITY_DEVICE_SYNC"))
    o.sync_after_launch = std::string(v) != "0";
  if (const char* v = environment("PARITY_DEVICE_GRAPHS")) {
    const std::string g = v;
    if (g != "0" && g != "1") fail("PARITY_DEVICE_GRAPHS={}: expected 0 or 1", quoted(g));
    o.graphs = g == "1";
  }
  if (const char* v = environment("PARITY_DEVICE_PRECISION"))
    o.precision = parse_precision(v, "PARITY_DEVICE_PRECISION");
  o.log = [](const std::string& line) { std::cerr << line; };
  return o;
}

}  // namespace parity::device
