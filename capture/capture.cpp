// The capture library behind parity_capture.h: a port's stage rows, checked against the stage
// list at the call, converted from the port's layout to ours, and written through the tracer's
// TraceWriter, so a capture is a trace like any other (format "gpt-oss-parity-trace").
#define PARITY_CAPTURE_BUILDING 1
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fmt/ranges.h>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/numerics.h"
#include "model/untrusted.h"
#include "parity_capture.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {

thread_local std::string g_last_error;

struct Refusal {
  int code;
  std::string message;
};

[[noreturn]] void refuse(int code, std::string message) {
  throw Refusal{code, std::move(message)};
}

// The layouts each stage can be declared in.
constexpr unsigned kRopeLayouts = PARITY_LAYOUT_ROPE_INTERLEAVED;
constexpr unsigned kQkvParts = PARITY_LAYOUT_QKV_Q | PARITY_LAYOUT_QKV_K | PARITY_LAYOUT_QKV_V;
constexpr unsigned kAllLayouts = PARITY_LAYOUT_ROPE_INTERLEAVED | PARITY_LAYOUT_SINK_FIRST |
                                 PARITY_LAYOUT_NO_SINK | PARITY_LAYOUT_GATE_UP_HALVES | kQkvParts;

unsigned layouts_for(Stage s) {
  switch (s) {
    case Stage::qkv:
      return kRopeLayouts | kQkvParts;
    case Stage::q_rope:
    case Stage::k_rope:
      return kRopeLayouts;
    case Stage::scores:
      return PARITY_LAYOUT_SINK_FIRST;
    case Stage::att:
      return PARITY_LAYOUT_SINK_FIRST | PARITY_LAYOUT_NO_SINK;
    case Stage::mlp1:
      return PARITY_LAYOUT_GATE_UP_HALVES;
    default:
      return 0;
  }
}

std::string layout_names(unsigned layout) {
  static constexpr std::pair<unsigned, const char*> kNames[] = {
      {PARITY_LAYOUT_ROPE_INTERLEAVED, "ROPE_INTERLEAVED"},
      {PARITY_LAYOUT_SINK_FIRST, "SINK_FIRST"},
      {PARITY_LAYOUT_NO_SINK, "NO_SINK"},
      {PARITY_LAYOUT_GATE_UP_HALVES, "GATE_UP_HALVES"},
      {PARITY_LAYOUT_QKV_Q, "QKV_Q"},
      {PARITY_LAYOUT_QKV_K, "QKV_K"},
      {PARITY_LAYOUT_QKV_V, "QKV_V"}};
  std::string s;
  for (const auto& [bit, n] : kNames)
    if ((layout & bit) != 0) s += (s.empty() ? "" : "|") + std::string(n);
  return s;
}

const char* capture_dtype_name(int dtype) {
  switch (dtype) {
    case PARITY_CAPTURE_F32:
      return "float32";
    case PARITY_CAPTURE_F16:
      return "float16";
    case PARITY_CAPTURE_BF16:
      return "bfloat16";
    case PARITY_CAPTURE_F64:
      return "float64";
    case PARITY_CAPTURE_I32:
      return "int32";
    default:
      return nullptr;
  }
}

size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case PARITY_CAPTURE_F16:
    case PARITY_CAPTURE_BF16:
      return 2;
    case PARITY_CAPTURE_F64:
      return 8;
    default:
      return 4;
  }
}

double element(const void* data, int dtype, size_t i) {
  switch (dtype) {
    case PARITY_CAPTURE_F32: {
      float f;
      std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4);
      return f;
    }
    case PARITY_CAPTURE_F16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return f16_to_float(h);
    }
    case PARITY_CAPTURE_BF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return bf16_to_float(h);
    }
    case PARITY_CAPTURE_F64: {
      double d;
      std::memcpy(&d, static_cast<const char*>(data) + 8 * i, 8);
      return d;
    }
    default: {
      int32_t v;
      std::memcpy(&v, static_cast<const char*>(data) + 4 * i, 4);
      return v;
    }
  }
}


// One row being assembled from parts (expert slots, q/k/v) before it is written.
struct Partial {
  std::vector<double> values;
  std::vector<bool> have;  // per part
  bool all_f64 = true;
};

}  // namespace
}  // namespace parity

struct parity_capture {
  std::mutex mutex;
  std::string path;
  parity::Config config;
  std::vector<int32_t> tokens;
  std::unique_ptr<parity::TraceWriter> writer;
  std::map<std::tuple<int, int, int>, parity::Partial> partial;  // (position, layer, stage)
  std::set<std::tuple<int, int, int>> written;
  size_t refused = 0;
  std::string first_refusal;
  std::string abandoned;  // why the writer gave up ("" while writing)
  std::map<int, size_t> cache;  // layer -> cache rows recorded (parity_capture_record_cache)
};

namespace parity {
namespace {

using Key = std::tuple<int, int, int>;

std::string where(const parity_capture& c, std::string_view stage, int position, int layer,
                  int slot) {
  std::string s = fmt::format("capture {}: stage {}", c.path, stage);
  if (layer != kModelLayer) s += fmt::format(", layer {}", layer);
  s += fmt::format(", position {}", position);
  if (slot >= 0) s += fmt::format(", slot {}", slot);
  return s;
}

// Our index of element `i` of a head of `d` values stored in interleaved RoPE pairs.
size_t from_interleaved(size_t i, size_t d) {
  return (i % 2 == 0) ? i / 2 : d / 2 + i / 2;
}

// `layout`: the port's layout of the row, kept as the dataset's "layout" attribute (NO_SINK tells
// the diff that an att row's sink column is derived, not the port's).
void write_row(parity_capture& c, int position, int layer, Stage s, const std::vector<double>& v,
               bool f64, unsigned layout = PARITY_LAYOUT_DEFAULT) {
  StageData data;
  data.dims = stage_dims(c.config, s, position);
  if (is_decision(s)) {
    data.type = StageData::Type::I32;
    data.i32.assign(v.begin(), v.end());
  } else if (f64) {
    data.type = StageData::Type::F64;
    data.f64 = v;
  } else {
    data.type = StageData::Type::F32;
    data.f32.assign(v.begin(), v.end());
  }
  try {
    c.writer->record({position, layer, s, execution_order(c.config, layer, s), Series::output},
                     data, layout == PARITY_LAYOUT_DEFAULT ? std::string() : layout_names(layout));
  } catch (const Error& e) {
    c.abandoned = e.what();
    refuse(PARITY_CAPTURE_ERR_IO, e.what());
  }
  c.written.insert({position, layer, int(s)});
}

// Checks a record against the stage list and records it; with `dry_run`, only checks it (the
// data is not read).
void record(parity_capture& c, const char* stage_name, int position, int layer, int slot,
            const void* data, int dtype, size_t count, unsigned layout, bool dry_run = false) {
  if (!c.abandoned.empty())
    refuse(PARITY_CAPTURE_ERR_STATE,
           fmt::format("capture {}: abandoned earlier ({})", c.path, c.abandoned));
  if (stage_name == nullptr)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("capture {}: null stage name", c.path));
  const auto stage = stage_from_name(stage_name);
  if (!stage) {
    std::string names;
    for (const auto& si : kStages) names += (names.empty() ? "" : ", ") + std::string(si.name);
    refuse(PARITY_CAPTURE_ERR_STAGE,
           fmt::format("capture {}: unknown stage {} (position {}, layer {}); "
                       "the stages are {}",
                       c.path, one_line(stage_name, 64), position, layer, names));
  }
  const Stage s = *stage;
  const StageInfo& si = info(s);
  const Config& cfg = c.config;
  const std::string at = where(c, si.name, position, layer, slot);
  if (position < 0 || size_t(position) >= c.tokens.size())
    refuse(PARITY_CAPTURE_ERR_STAGE,
           fmt::format("{}: the capture has positions 0..{} (one per token)", at,
                       c.tokens.size() - 1));
  if (si.scope == Scope::Model && layer != kModelLayer)
    refuse(PARITY_CAPTURE_ERR_STAGE,
           fmt::format("{}: {} is a model-scope stage: record it with layer -1", at, si.name));
  if (si.scope != Scope::Model && (layer < 0 || layer >= cfg.num_hidden_layers))
    refuse(PARITY_CAPTURE_ERR_STAGE,
           fmt::format("{}: the model has layers 0..{}", at, cfg.num_hidden_layers - 1));
  if (slot != PARITY_CAPTURE_ALL_SLOTS &&
      (!is_per_expert(s) || slot < 0 || slot >= cfg.num_experts_per_tok))
    refuse(PARITY_CAPTURE_ERR_STAGE,
           is_per_expert(s)
               ? fmt::format("{}: expert slots are 0..{} (or -1 for all)", at,
                             cfg.num_experts_per_tok - 1)
               : fmt::format("{}: only mlp1, swiglu and mlp2 have expert slots; give slot -1", at));
  const char* dname = capture_dtype_name(dtype);
  if (dname == nullptr)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("{}: unknown dtype {}", at, dtype));
  if (is_decision(s) != (dtype == PARITY_CAPTURE_I32))
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           is_decision(s)
               ? fmt::format("{}: {} holds indices: record it as int32, not {}", at, si.name, dname)
               : fmt::format("{}: {} holds real values: int32 is for topk_idx and sampled", at,
                             si.name));
  if ((layout & ~kAllLayouts) != 0)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           fmt::format("{}: unknown layout bits {:#x}", at, layout & ~kAllLayouts));
  if ((layout & ~layouts_for(s)) != 0)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           fmt::format("{}: layout {} does not apply to stage {}", at,
                       layout_names(layout & ~layouts_for(s)), si.name));
  const unsigned parts = layout & kQkvParts;
  if (parts != 0 && (parts & (parts - 1)) != 0)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           fmt::format("{}: one qkv part per record ({})", at, layout_names(parts)));
  if (parts == PARITY_LAYOUT_QKV_V && (layout & PARITY_LAYOUT_ROPE_INTERLEAVED))
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           fmt::format("{}: ROPE_INTERLEAVED does not apply to the v part (v is not rotated)", at));
  if ((layout & PARITY_LAYOUT_SINK_FIRST) && (layout & PARITY_LAYOUT_NO_SINK))
    refuse(PARITY_CAPTURE_ERR_ARGUMENT,
           fmt::format("{}: SINK_FIRST and NO_SINK exclude each other", at));
  if (data == nullptr && count > 0)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("{}: null data", at));

  // The shape this record must have, in 64 bits.
  const std::vector<size_t> dims = stage_dims(cfg, s, position);
  uint64_t row = 1;
  for (size_t d : dims) row *= d;
  const uint64_t nH = uint64_t(cfg.num_attention_heads), d = uint64_t(cfg.head_dim);
  const uint64_t keys = uint64_t(position) + 1;
  uint64_t expected = row;
  std::string shape = fmt::format("[{}]", fmt::join(dims, ", "));
  size_t part_index = 0, num_parts = 1;
  uint64_t part_offset = 0;
  if (slot >= 0) {
    expected = dims[1];
    shape = fmt::format("[{}] (one slot of [{}, {}])", dims[1], dims[0], dims[1]);
    part_index = size_t(slot);
    num_parts = dims[0];
    part_offset = uint64_t(slot) * dims[1];
  } else if (parts != 0) {
    num_parts = 3;
    const uint64_t q = uint64_t(cfg.q_dim()), kv = uint64_t(cfg.kv_dim());
    part_index = parts == PARITY_LAYOUT_QKV_Q ? 0 : parts == PARITY_LAYOUT_QKV_K ? 1 : 2;
    expected = part_index == 0 ? q : kv;
    part_offset = part_index == 0 ? 0 : part_index == 1 ? q : q + kv;
    shape = fmt::format("[{}] (the {} part of qkv)", expected, "qkv"[part_index]);
  } else if (layout & PARITY_LAYOUT_NO_SINK) {
    expected = nH * keys;
    shape = fmt::format("[{}, {}] (keys 0..{} without the sink)", nH, keys, position);
  }
  if (uint64_t(count) != expected)
    refuse(PARITY_CAPTURE_ERR_SHAPE,
           fmt::format("{}: {} values of {}, but the row is {} = {} values", at, count, dname,
                       shape, expected));

  const Key key{position, layer, int(s)};
  if (c.written.contains(key))
    refuse(PARITY_CAPTURE_ERR_DUPLICATE, fmt::format("{}: recorded twice (each position, layer and "
                                                     "stage is recorded once)",
                                                     at));
  const auto pit = c.partial.find(key);
  if (num_parts == 1 && pit != c.partial.end())
    refuse(PARITY_CAPTURE_ERR_DUPLICATE,
           fmt::format("{}: recorded whole after some of its {} were recorded", at,
                       is_per_expert(s) ? "slots" : "parts"));
  if (num_parts > 1 && pit != c.partial.end() && pit->second.have.size() != num_parts)
    refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("{}: mixes expert slots and qkv parts", at));
  if (num_parts > 1 && pit != c.partial.end() && pit->second.have[part_index])
    refuse(PARITY_CAPTURE_ERR_DUPLICATE,
           fmt::format("{}: {} recorded twice", at, slot >= 0 ? "this slot" : "this part of qkv"));
  if (dry_run) return;

  // Convert into our layout.
  std::vector<double> v(size_t(expected), 0.0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = element(data, dtype, i);
  if (layout & PARITY_LAYOUT_ROPE_INTERLEAVED) {
    // Heads of d values: all of q_rope/k_rope, the q and k parts of qkv (v is not rotated).
    uint64_t end = v.size();
    if (s == Stage::qkv && parts == 0) end = uint64_t(cfg.q_dim()) + uint64_t(cfg.kv_dim());
    std::vector<double> head(static_cast<size_t>(d));
    for (uint64_t h = 0; h + d <= end; h += d) {
      for (size_t i = 0; i < size_t(d); ++i)
        head[from_interleaved(i, size_t(d))] = v[size_t(h) + i];
      std::copy(head.begin(), head.end(), v.begin() + std::ptrdiff_t(h));
    }
  }
  if (layout & PARITY_LAYOUT_SINK_FIRST) {
    const size_t cols = size_t(keys) + 1;
    for (size_t h = 0; h < size_t(nH); ++h) {
      double* r = v.data() + h * cols;
      std::rotate(r, r + 1, r + cols);  // [sink, k0..kp] -> [k0..kp, sink]
    }
  }
  if (layout & PARITY_LAYOUT_NO_SINK) {
    std::vector<double> full(static_cast<size_t>(row));
    const size_t cols = size_t(keys) + 1;
    for (size_t h = 0; h < size_t(nH); ++h) {
      double sum = 0;
      for (size_t j = 0; j < size_t(keys); ++j) {
        full[h * cols + j] = v[h * size_t(keys) + j];
        sum += v[h * size_t(keys) + j];
      }
      full[h * cols + size_t(keys)] = 1.0 - sum;
    }
    v = std::move(full);
  }
  if (layout & PARITY_LAYOUT_GATE_UP_HALVES) {
    const size_t I = size_t(cfg.intermediate_size);
    for (size_t r = 0; r < v.size() / (2 * I); ++r) {
      std::vector<double> inter(2 * I);
      for (size_t j = 0; j < I; ++j) {
        inter[2 * j] = v[r * 2 * I + j];
        inter[2 * j + 1] = v[r * 2 * I + I + j];
      }
      std::copy(inter.begin(), inter.end(), v.begin() + std::ptrdiff_t(r * 2 * I));
    }
  }
  if (is_decision(s))
    for (size_t i = 0; i < v.size(); ++i) {
      const uint64_t limit =
          uint64_t(s == Stage::topk_idx ? cfg.num_local_experts : cfg.vocab_size);
      if (v[i] < 0 || uint64_t(v[i]) >= limit)
        refuse(PARITY_CAPTURE_ERR_SHAPE,
               fmt::format("{}: element {} is {}, not an index below {}", at, i, v[i], limit));
    }

  const bool f64 = dtype == PARITY_CAPTURE_F64;
  if (num_parts == 1) {
    write_row(c, position, layer, s, v, f64, layout);
    return;
  }
  Partial& p = c.partial[key];
  if (p.have.empty()) {
    p.values.assign(size_t(row), 0.0);
    p.have.assign(num_parts, false);
  }
  std::copy(v.begin(), v.end(), p.values.begin() + std::ptrdiff_t(part_offset));
  p.have[part_index] = true;
  p.all_f64 = p.all_f64 && f64;
  if (std::all_of(p.have.begin(), p.have.end(), [](bool b) { return b; })) {
    const Partial done = std::move(p);
    c.partial.erase(key);
    write_row(c, position, layer, s, done.values, done.all_f64);
  }
}

// Runs one call's body: a failure sets this thread's message (one line: a path or value from the
// caller may hold control characters) and returns its code. Any failure of
// a call that `counts_as_refusal` (a record of some kind) marks the capture, so that close() does
// not write it: whatever refused the record, the capture lacks it.
int run_guarded(parity_capture* c, bool counts_as_refusal, const std::function<void()>& body) {
  int code = PARITY_CAPTURE_OK;
  try {
    body();
    return PARITY_CAPTURE_OK;
  } catch (const Refusal& r) {
    g_last_error = one_line(r.message);
    code = r.code;
  } catch (const Error& e) {
    g_last_error = one_line(e.what());
    code = PARITY_CAPTURE_ERR_IO;
  } catch (const std::bad_alloc&) {
    g_last_error = c != nullptr ? one_line(fmt::format("capture {}: out of memory", c->path))
                                : "capture: out of memory";
    code = PARITY_CAPTURE_ERR_IO;
  } catch (const std::exception& e) {
    g_last_error = one_line(std::string("capture: ") + e.what());
    code = PARITY_CAPTURE_ERR_IO;
  }
  if (c != nullptr && counts_as_refusal && code != PARITY_CAPTURE_ERR_STATE) {
    if (c->refused++ == 0) c->first_refusal = g_last_error;
  }
  return code;
}

// A capture replaces only a regular file (or nothing).
void refuse_non_regular_output(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    refuse(PARITY_CAPTURE_ERR_IO,
           fmt::format("capture {}: cannot access the output path ({})", path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode))
    refuse(PARITY_CAPTURE_ERR_IO,
           fmt::format("capture {}: is a directory; a capture is written to a file", path));
  if (!S_ISREG(st.st_mode))
    refuse(PARITY_CAPTURE_ERR_IO,
           fmt::format("capture {}: exists and is not a regular file; a capture replaces only a "
                       "regular file",
                       path));
}

}  // namespace
}  // namespace parity

extern "C" {

int parity_capture_open(parity_capture** out, const char* path, const char* model_dir,
                        const int32_t* tokens, size_t n_tokens,
                        const parity_capture_options* options) {
  using namespace parity;
  if (out == nullptr) {
    g_last_error = "capture: parity_capture_open needs somewhere to put the handle (out is null)";
    return PARITY_CAPTURE_ERR_ARGUMENT;
  }
  *out = nullptr;
  auto c = std::make_unique<parity_capture>();
  const int rc = run_guarded(nullptr, false, [&] {
    if (path == nullptr || *path == '\0')
      refuse(PARITY_CAPTURE_ERR_ARGUMENT, "capture: empty output path");
    c->path = path;
    refuse_non_regular_output(c->path);
    if (model_dir == nullptr || *model_dir == '\0')
      refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("capture {}: no model directory", c->path));
    if (tokens == nullptr || n_tokens == 0)
      refuse(PARITY_CAPTURE_ERR_MODEL, fmt::format("capture {}: no tokens", c->path));
    const std::string precision =
        options != nullptr && options->precision != nullptr ? options->precision : "float32";
    PrecisionPolicy policy;
    try {
      policy = PrecisionPolicy::preset(precision);
    } catch (const Error&) {
      refuse(PARITY_CAPTURE_ERR_ARGUMENT,
             fmt::format("capture {}: precision {} is not a preset ({})", c->path,
                         one_line(precision, 40), fmt::join(PrecisionPolicy::preset_names(), ", ")));
    }
    std::unique_ptr<Model> m;
    try {
      m = Model::load(model_dir);
    } catch (const Error& e) {
      refuse(PARITY_CAPTURE_ERR_MODEL, fmt::format("capture {}: {}", c->path, e.what()));
    }
    c->config = m->config;
    if (uint64_t(n_tokens) > uint64_t(c->config.max_position_embeddings))
      refuse(PARITY_CAPTURE_ERR_MODEL,
             fmt::format("capture {}: {} tokens, past the context of {} ({} positions)", c->path,
                         n_tokens, m->dir, c->config.max_position_embeddings));
    c->tokens.assign(tokens, tokens + n_tokens);
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= c->config.vocab_size)
        refuse(PARITY_CAPTURE_ERR_MODEL,
               fmt::format("capture {}: token id {} at position {} is out of range for {} "
                           "(vocabulary 0..{})",
                           c->path, tokens[i], i, m->dir, c->config.vocab_size - 1));
    TraceMeta meta;
    meta.backend = options != nullptr && options->port != nullptr && *options->port != '\0'
                       ? one_line(options->port, 200)
                       : "capture";
    meta.precision = fmt::format("{}, as declared by the port", precision);
    meta.precision_policy = policy;
    meta.config = c->config.to_json();
    meta.fingerprint = m->fingerprint;
    meta.model_dir = m->dir;
    meta.tool_version = PARITY_CAPTURE_TOOL_VERSION;
    meta.commit = PARITY_CAPTURE_COMMIT;
    meta.device = nlohmann::json::object();
    if (options != nullptr && options->device != nullptr)
      meta.device["description"] = one_line(options->device, 1000);
    meta.created = [] {
      char buf[32];
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
      return std::string(buf);
    }();
    meta.run = {{"capture", {{"api", "c"}, {"precision", precision}}}};
    meta.run_id = new_run_id();
    meta.tokens = c->tokens;
    for (size_t i = 0; i < n_tokens; ++i) meta.positions.push_back(int32_t(i));
    try {
      // The writer's temporary name is its own; finish() renames it into place, so the last
      // handle of a path to close is the file found there.
      c->writer = std::make_unique<TraceWriter>(c->path, std::move(meta));
    } catch (const Error& e) {
      refuse(PARITY_CAPTURE_ERR_IO, e.what());
    }
  });
  if (rc == PARITY_CAPTURE_OK) *out = c.release();
  return rc;
}

int parity_capture_record(parity_capture* cap, const char* stage, int position, int layer, int slot,
                          const void* data, parity_capture_dtype dtype, size_t count,
                          unsigned layout) {
  if (cap == nullptr) return PARITY_CAPTURE_OK;
  const std::lock_guard lock(cap->mutex);
  return parity::run_guarded(cap, true, [&] {
    parity::record(*cap, stage, position, layer, slot, data, int(dtype), count, layout);
  });
}

int parity_capture_record_copy(parity_capture* cap, const char* stage, int position, int layer,
                               int slot, const void* src, parity_capture_dtype dtype, size_t count,
                               unsigned layout, parity_capture_copy_fn copy, void* user) {
  if (cap == nullptr) return PARITY_CAPTURE_OK;
  // Checked first (the data is not read), so a bad call copies nothing; a refusal here is a
  // refused record like any other.
  std::vector<unsigned char> host;
  {
    const std::lock_guard lock(cap->mutex);
    const int rc = parity::run_guarded(cap, true, [&] {
      if (copy == nullptr)
        parity::refuse(PARITY_CAPTURE_ERR_ARGUMENT,
                       fmt::format("capture {}: record_copy without a copy function", cap->path));
      parity::record(*cap, stage, position, layer, slot, src, int(dtype), count, layout, true);
      host.resize(count * parity::dtype_bytes(int(dtype)));  // count is the row's: checked above
    });
    if (rc != PARITY_CAPTURE_OK) return rc;
  }
  if (count > 0) {
    const int rc = copy(host.data(), src, host.size(), user);
    if (rc != 0) {
      const std::lock_guard lock(cap->mutex);
      return parity::run_guarded(cap, true, [&] {
        parity::refuse(PARITY_CAPTURE_ERR_COPY,
                       fmt::format("capture {}: stage {}, layer {}, position {}: the copy function "
                                   "failed (code {})",
                                   cap->path, parity::one_line(stage, 64), layer, position, rc));
      });
    }
  }
  return parity_capture_record(cap, stage, position, layer, slot, count > 0 ? host.data() : src,
                               dtype, count, layout);
}

int parity_capture_close(parity_capture** handle) {
  if (handle == nullptr || *handle == nullptr) return PARITY_CAPTURE_OK;
  std::unique_ptr<parity_capture> owned(std::exchange(*handle, nullptr));
  return parity::run_guarded(nullptr, false, [&] {
    using namespace parity;
    parity_capture& c = *owned;
    if (!c.abandoned.empty())
      refuse(PARITY_CAPTURE_ERR_STATE,
             fmt::format("capture {}: not written: abandoned earlier ({})", c.path, c.abandoned));
    if (c.refused > 0)
      refuse(PARITY_CAPTURE_ERR_STATE,
             fmt::format("capture {}: not written: {} record(s) were refused; the first: {}",
                         c.path, c.refused, c.first_refusal));
    if (!c.partial.empty()) {
      const auto& [key, p] = *c.partial.begin();
      const auto [position, layer, stage] = key;
      const Stage s = Stage(stage);
      std::vector<size_t> missing;
      for (size_t i = 0; i < p.have.size(); ++i)
        if (!p.have[i]) missing.push_back(i);
      const std::string what = is_per_expert(s)
                                   ? fmt::format("expert slot(s) {}", fmt::join(missing, ", "))
                                   : fmt::format("the {} part(s)", [&] {
                                       std::string n;
                                       for (size_t i : missing)
                                         n += (n.empty() ? "" : ", ") + std::string(1, "qkv"[i]);
                                       return n;
                                     }());
      refuse(PARITY_CAPTURE_ERR_STATE,
             fmt::format(
                 "{}: incomplete: {} never recorded ({} incomplete row(s) in all); not written",
                 where(c, name(s), position, layer, -1), what, c.partial.size()));
    }
    if (!c.cache.empty()) {
      for (int layer = 0; layer < c.config.num_hidden_layers; ++layer)
        if (!c.cache.contains(layer))
          refuse(PARITY_CAPTURE_ERR_STATE,
                 fmt::format("capture {}: cache rows of layer {} never recorded (the other "
                             "layers' are); not written",
                             c.path, layer));
      const size_t n = c.cache.begin()->second;
      for (const auto& [position, layer, stage] : c.written)
        if (size_t(position) < n)
          refuse(PARITY_CAPTURE_ERR_STATE,
                 fmt::format("capture {}: rows at position {} lie inside the cache prefix 0..{}: "
                             "record a position's stage rows or its cache rows, not both; not "
                             "written",
                             c.path, position, n - 1));
    }
    std::vector<int32_t> positions(c.tokens.size());
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = int32_t(i);
    c.writer->set_tokens(c.tokens, positions);
    c.writer->finish();
  });
}

int parity_capture_record_cache(parity_capture* cap, int layer, size_t count, const void* k,
                                const void* v, parity_capture_dtype dtype, unsigned layout) {
  if (cap == nullptr) return PARITY_CAPTURE_OK;
  const std::lock_guard lock(cap->mutex);
  return parity::run_guarded(cap, true, [&] {
    using namespace parity;
    parity_capture& c = *cap;
    const std::string at = fmt::format("capture {}: cache of layer {}", c.path, layer);
    if (layer < 0 || layer >= c.config.num_hidden_layers)
      refuse(PARITY_CAPTURE_ERR_STAGE,
             fmt::format("{}: the model has layers 0..{}", at, c.config.num_hidden_layers - 1));
    const int d = int(dtype);
    if (d != PARITY_CAPTURE_F32 && d != PARITY_CAPTURE_F16 && d != PARITY_CAPTURE_BF16 &&
        d != PARITY_CAPTURE_F64)
      refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("{}: dtype {} is not a real dtype", at, d));
    if ((layout & ~unsigned(PARITY_LAYOUT_ROPE_INTERLEAVED)) != 0)
      refuse(PARITY_CAPTURE_ERR_ARGUMENT,
             fmt::format("{}: layout {} does not apply to cache rows", at,
                         layout_names(layout & ~unsigned(PARITY_LAYOUT_ROPE_INTERLEAVED))));
    if (count == 0 || count > c.tokens.size())
      refuse(PARITY_CAPTURE_ERR_SHAPE,
             fmt::format("{}: {} rows, but the capture has {} tokens", at, count, c.tokens.size()));
    if (k == nullptr || v == nullptr)
      refuse(PARITY_CAPTURE_ERR_ARGUMENT, fmt::format("{}: k or v is a null pointer", at));
    if (c.cache.contains(layer)) refuse(PARITY_CAPTURE_ERR_DUPLICATE, at + ": recorded twice");
    if (!c.cache.empty() && c.cache.begin()->second != count)
      refuse(PARITY_CAPTURE_ERR_SHAPE,
             fmt::format("{}: {} rows, but the layers recorded before have {}: every layer caches "
                         "the same positions",
                         at, count, c.cache.begin()->second));
    const size_t dh = size_t(c.config.head_dim), row = size_t(c.config.num_key_value_heads) * dh;
    KvRows rows;
    rows.count = int(count);
    rows.k.resize(count * row);
    rows.v.resize(count * row);
    for (size_t i = 0; i < count * row; ++i) {
      // ROPE_INTERLEAVED: element 2j (2j + 1) of a head is our j (j + d/2).
      const size_t in_head = i % dh, ours = (layout & PARITY_LAYOUT_ROPE_INTERLEAVED) != 0
                                                 ? i - in_head + from_interleaved(in_head, dh)
                                                 : i;
      rows.k[ours] = element(k, d, i);
      rows.v[i] = element(v, d, i);
    }
    try {
      c.writer->record_cache(layer, rows, d == PARITY_CAPTURE_F64);
    } catch (const Error& e) {
      c.abandoned = e.what();
      refuse(PARITY_CAPTURE_ERR_IO, e.what());
    }
    c.cache[layer] = count;
  });
}

int parity_capture_append_tokens(parity_capture* cap, const int32_t* tokens, size_t n_tokens) {
  if (cap == nullptr) return PARITY_CAPTURE_OK;
  const std::lock_guard lock(cap->mutex);
  return parity::run_guarded(cap, false, [&] {
    using namespace parity;
    parity_capture& c = *cap;
    if (n_tokens > 0 && tokens == nullptr)
      refuse(PARITY_CAPTURE_ERR_ARGUMENT,
             fmt::format("capture {}: append_tokens: {} tokens at a null pointer", c.path, n_tokens));
    if (uint64_t(c.tokens.size()) + uint64_t(n_tokens) > uint64_t(c.config.max_position_embeddings))
      refuse(PARITY_CAPTURE_ERR_MODEL,
             fmt::format("capture {}: {} tokens, past the context of {} positions", c.path,
                         uint64_t(c.tokens.size()) + uint64_t(n_tokens),
                         c.config.max_position_embeddings));
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= c.config.vocab_size)
        refuse(PARITY_CAPTURE_ERR_MODEL,
               fmt::format("capture {}: token id {} at position {} is out of range (vocabulary "
                           "0..{})",
                           c.path, tokens[i], c.tokens.size() + i, c.config.vocab_size - 1));
    c.tokens.insert(c.tokens.end(), tokens, tokens + n_tokens);
  });
}

void parity_capture_abandon(parity_capture** handle) {
  if (handle != nullptr) delete std::exchange(*handle, nullptr);
}

const char* parity_capture_last_error(void) {
  return parity::g_last_error.c_str();
}

size_t parity_capture_row_elements(const parity_capture* cap, const char* stage, int position) {
  if (cap == nullptr || stage == nullptr || position < 0) return 0;
  const auto s = parity::stage_from_name(stage);
  if (!s) return 0;
  size_t n = 1;
  for (size_t d : parity::stage_dims(cap->config, *s, position)) n *= d;
  return n;
}

}  // extern "C"
