// Fuzzes parity-trace --candidate-trace: a port's capture, mutated, read as a capture, checked
// against the model, recomputed by the reference and judged, with every report rendered.
//
// Input: a sequence of edits, decoded from the bytes, applied to one small valid capture of the
// tiny model (made once per process: tokens 1, 2; KV-cache rows of position 0 for every layer;
// the model-scope and layer-0 stage rows of position 1, float32): drop a dataset, add an object
// (a junk dataset or group, a series parity-trace computes, a soft link, a position or layer
// group), set an attribute to another value, type or shape, replace a dataset by one of another
// shape or type, add position groups (empty, or copies of a real one), add KV-cache rows, move a
// link, overwrite a row's values (NaN, infinities, huge numbers). The edits are made on an
// in-memory copy of the capture (HDF5's core driver), written once to a scratch file, which is
// what the tool reads. The seeds in fuzz/corpus/candidate_trace_fuzz/ are
// edit sequences: none (the valid capture, judged in full), and one of each kind above.
//
// parity::Error is the tool's answer to a bad capture: it must be one line and short. Every
// report of a judged capture must be printable text (the text, HTML and JUnit reports) or valid
// JSON. Anything else is a finding: a crash, a sanitizer report, another exception, a hang, or
// memory beyond libFuzzer's limit.
#include <hdf5.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/forward.h"
#include "model/recompute.h"
#include "model/synth.h"
#include "tools/common.h"
#include "tracer/capture_check.h"
#include "tracer/differ.h"
#include "tracer/escape.h"
#include "tracer/report.h"
#include "tracer/trace_file.h"

namespace {
using namespace parity;

// The capture's rows as a port records them: float32, of the stages of `layer` 0 and the model
// scope at `position` 1 only (a small file, a cheap recompute).
class PortRows final : public Observer {
 public:
  explicit PortRows(TraceWriter& w) : w_(w) {}
  bool wants(int position, int layer, Stage) const override {
    return position == 1 && (layer == kModelLayer || layer == 0);
  }
  void record(const StageKey& key, const StageData& data) override {
    if (data.type != StageData::Type::F64) {
      w_.record(key, data);
      return;
    }
    StageData narrow;
    narrow.type = StageData::Type::F32;
    narrow.dims = data.dims;
    narrow.f32.assign(data.f64.begin(), data.f64.end());
    w_.record(key, narrow);
  }

 private:
  TraceWriter& w_;
};

struct Setup {
  std::string dir, capture_path, reference_path;
  std::unique_ptr<Model> model;
  std::vector<unsigned char> image;   // the valid capture's bytes
  std::vector<std::string> datasets;  // its datasets' paths
};

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET)
    static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
  return 0;
}

const Setup& setup() {
  static const Setup s = [] {
    Setup s;
    s.dir = fuzz::process_temp_dir("candidate_trace_fuzz");
    s.capture_path = s.dir + "/capture.h5";
    s.reference_path = s.dir + "/reference.h5";
    write_synthetic_checkpoint(synth_preset("tiny"), s.dir + "/tiny", false);
    s.model = Model::load(s.dir + "/tiny");
    const Model& m = *s.model;
    auto reference = make_backend("reference", m);
    TraceMeta meta = trace_meta(*reference, m);
    meta.backend = "fuzz-port";
    meta.precision = "float32, as declared by the port";
    meta.precision_policy = PrecisionPolicy::preset("float32");
    meta.run = {{"capture", {{"api", "c"}, {"precision", "float32"}}}};
    meta.run_id = new_run_id();
    meta.tokens = {1, 2};
    meta.positions = {0, 1};
    {
      TraceWriter w(s.capture_path, meta);
      PortRows rows(w);
      reference->reset();
      forward(*reference, Batch::single(1, 0), nullptr);
      for (int layer = 0; layer < m.config.num_hidden_layers; ++layer) {
        const auto kv = reference->cache_rows(0, layer, 0, 1);
        if (!kv) std::abort();
        w.record_cache(layer, *kv, false);
      }
      forward(*reference, Batch::single(2, 1), &rows);
      w.finish();
    }
    std::ifstream in(s.capture_path, std::ios::binary);
    s.image.assign(std::istreambuf_iterator<char>(in), {});
    const hid_t f = H5Fopen(s.capture_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0 || H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &s.datasets) < 0)
      std::abort();
    H5Fclose(f);
    if (s.datasets.empty()) std::abort();
    return s;
  }();
  return s;
}

// The fuzz input, read a field at a time; 0 once it is used up.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }
  uint8_t u8() { return p_ == end_ ? 0 : *p_++; }
  uint16_t u16() { return uint16_t(u8() | (u8() << 8)); }
  uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[u8() % v.size()];
  }
  std::string bytes(size_t max) {
    std::string s(size_t(u8()) % (max + 1), '\0');
    for (char& c : s) c = char(u8());
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

const std::vector<std::string> kNames = {
    "junk",    "replay",  "magnitude", "recompute", "cache",  "pos_7",  "pos_01", "pos_4096",
    "layer_0", "layer_9", "model",     "qkv",       "logits", "k_rope", "v",      "layer_1"};
const std::vector<std::string> kParents = {
    "/", "/pos_1", "/pos_1/layer_0", "/pos_1/model", "/cache", "/cache/layer_0"};
const std::vector<std::string> kIntAttributes = {"order",          "layer",  "position",
                                                 "first_position", "tokens", "positions",
                                                 "format_version", "replay"};
const std::vector<std::string> kStringAttributes = {
    "stage",     "layout", "backend", "checkpoint_fingerprint", "run_id",
    "precision", "config", "run",     "precision_policy",       "format",
    "device"};
const std::vector<std::string> kStrings = {"NO_SINK",
                                           "SINK_FIRST|NO_SINK",
                                           "ROPE_INTERLEAVED",
                                           "qkv",
                                           "att",
                                           "{}",
                                           "[]",
                                           "null",
                                           "{\"capture\":{}}",
                                           "gpt-oss-parity-trace",
                                           "\x1b[2J\x07",
                                           "\xff\xfe",
                                           "",
                                           "{\"name\":\"float32\"}",
                                           "0123456789abcdef0123456789abcdef"};

void write_string_attribute(hid_t obj, const std::string& name, const std::string& value) {
  H5Adelete(obj, name.c_str());
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, value.size() + 1);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, type, value.c_str());
    H5Aclose(a);
  }
  H5Sclose(space);
  H5Tclose(type);
}

void write_int_attribute(hid_t obj, const std::string& name, Input& in) {
  H5Adelete(obj, name.c_str());
  const uint8_t shape = in.u8();
  const hsize_t n = shape % 4;  // 0: scalar, else a list of n
  const hid_t space = n == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  const bool real = (shape & 0x10) != 0;
  std::array<int64_t, 4> ints{};
  std::array<double, 4> reals{};
  for (size_t i = 0; i < 4; ++i) {
    ints[i] = (shape & 0x20) != 0 ? int64_t(int32_t(in.u32())) : int64_t(in.u8() % 24) - 2;
    reals[i] = double(ints[i]) + 0.5;
  }
  const hid_t a = H5Acreate2(obj, name.c_str(), real ? H5T_IEEE_F64LE : H5T_STD_I64LE, space,
                             H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, real ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64,
             real ? static_cast<const void*>(reals.data()) : ints.data());
    H5Aclose(a);
  }
  H5Sclose(space);
}

herr_t copy_attribute(hid_t src, const char* name, const H5A_info_t*, void* dst) {
  const hid_t a = H5Aopen(src, name, H5P_DEFAULT);
  if (a < 0) return 0;
  const hid_t type = H5Aget_type(a), space = H5Aget_space(a);
  std::vector<unsigned char> buffer(size_t(H5Aget_storage_size(a)) + 64);
  if (type >= 0 && space >= 0 && H5Tis_variable_str(type) == 0 &&
      H5Aread(a, type, buffer.data()) >= 0) {
    const hid_t b =
        H5Acreate2(*static_cast<hid_t*>(dst), name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (b >= 0) {
      H5Awrite(b, type, buffer.data());
      H5Aclose(b);
    }
  }
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  H5Aclose(a);
  return 0;
}

// The dataset at `path` again, of dims and type from the input, with its attributes.
void reshape_dataset(hid_t f, const std::string& path, Input& in) {
  const hid_t old = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  if (old < 0) return;
  const std::string tmp = path + "_old";
  H5Lmove(f, path.c_str(), f, tmp.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  const int rank = 1 + in.u8() % 3;
  std::array<hsize_t, 3> dims{};
  for (int i = 0; i < rank; ++i) dims[size_t(i)] = in.u8() % 40;
  const uint8_t which = in.u8() % 4;
  const hid_t type = which == 0   ? H5T_IEEE_F32LE
                     : which == 1 ? H5T_IEEE_F64LE
                     : which == 2 ? H5T_STD_I32LE
                                  : H5T_STD_I16LE;
  const hid_t space = H5Screate_simple(rank, dims.data(), nullptr);
  hid_t ds = H5Dcreate2(f, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds >= 0) {
    H5Aiterate2(old, H5_INDEX_NAME, H5_ITER_INC, nullptr, copy_attribute, &ds);
    H5Dclose(ds);
  }
  H5Sclose(space);
  H5Dclose(old);
  H5Ldelete(f, tmp.c_str(), H5P_DEFAULT);
}

// Every element of the dataset at `path` set to one value from the input.
void overwrite_values(hid_t f, const std::string& path, Input& in) {
  const hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  if (ds < 0) return;
  const hid_t space = H5Dget_space(ds);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  static const double kValues[] = {0.0, -0.0, 1e30, -1e30, 1e-40, 0.5, 7.0, -7.0};
  const uint8_t pick = in.u8();
  double value = kValues[pick % 8];
  if ((pick & 0x08) != 0) value = std::numeric_limits<double>::quiet_NaN();
  if ((pick & 0x10) != 0) value = std::numeric_limits<double>::infinity();
  if ((pick & 0x20) != 0) value = double(int32_t(in.u32()));
  if (n > 0 && n < (1 << 20)) {
    std::vector<double> values(size_t(n), value);
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  }
  H5Sclose(space);
  H5Dclose(ds);
}

void apply_edit(hid_t f, Input& in) {
  const Setup& s = setup();
  switch (in.u8() % 10) {
    case 0:  // drop a dataset
      H5Ldelete(f, in.pick(s.datasets).c_str(), H5P_DEFAULT);
      break;
    case 1: {  // add an object: a group, a dataset, a soft link
      const std::string& parent = in.pick(kParents);
      const std::string path = (parent == "/" ? std::string() : parent) + "/" + in.pick(kNames);
      const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      switch (in.u8() % 3) {
        case 0: {
          const hid_t g = H5Gcreate2(f, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
          if (g >= 0) H5Gclose(g);
          break;
        }
        case 1: {
          const hsize_t n = 1 + in.u8() % 8;
          const hid_t space = H5Screate_simple(1, &n, nullptr);
          const hid_t ds =
              H5Dcreate2(f, path.c_str(), H5T_STD_I32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
          if (ds >= 0) H5Dclose(ds);
          H5Sclose(space);
          break;
        }
        default:
          H5Lcreate_soft(in.pick(s.datasets).c_str(), f, path.c_str(), lcpl, H5P_DEFAULT);
      }
      H5Pclose(lcpl);
      break;
    }
    case 2: {  // an integer attribute of a dataset or the root: another value, type or shape
      const std::string& object = (in.u8() & 1) != 0 ? in.pick(s.datasets) : std::string("/");
      const hid_t o = H5Oopen(f, object.c_str(), H5P_DEFAULT);
      if (o < 0) break;
      write_int_attribute(o, in.pick(kIntAttributes), in);
      H5Oclose(o);
      break;
    }
    case 3: {  // a string attribute: a known interesting value, or bytes of the input
      const std::string& object = (in.u8() & 1) != 0 ? in.pick(s.datasets) : std::string("/");
      const hid_t o = H5Oopen(f, object.c_str(), H5P_DEFAULT);
      if (o < 0) break;
      const std::string& name = in.pick(kStringAttributes);
      write_string_attribute(o, name, (in.u8() & 1) != 0 ? in.pick(kStrings) : in.bytes(48));
      H5Oclose(o);
      break;
    }
    case 4:  // another shape or type
      reshape_dataset(f, in.pick(s.datasets), in);
      break;
    case 5: {  // position groups: empty, or copies of position 1
      // Copies are few (each is a position of rows to copy); empty groups up to 2,000.
      const bool copies = (in.u8() & 1) != 0;
      const int count = copies ? 1 + in.u8() % 16 : 1 + int(in.u8()) * (1 + in.u8() % 8);
      const int first = 2 + in.u8() % 8;
      for (int p = first; p < first + count && p < 2100; ++p) {
        const std::string name = "/pos_" + std::to_string(p);
        if (copies) {
          H5Ocopy(f, "/pos_1", f, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        } else {
          const hid_t g = H5Gcreate2(f, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
          if (g >= 0) H5Gclose(g);
        }
      }
      break;
    }
    case 6: {  // KV-cache rows of another count or shape
      const std::string path = "/cache/layer_" + std::to_string(in.u8() % 6) + "/" +
                               ((in.u8() & 1) != 0 ? "k_rope" : "v");
      H5Ldelete(f, path.c_str(), H5P_DEFAULT);
      const hsize_t dims[3] = {hsize_t(in.u8() % 4), hsize_t(2 + in.u8() % 2 * (in.u8() % 3)),
                               hsize_t(16 - in.u8() % 2)};
      const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      const hid_t space = H5Screate_simple(3, dims, nullptr);
      const hid_t ds =
          H5Dcreate2(f, path.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
      if (ds >= 0) H5Dclose(ds);
      H5Sclose(space);
      H5Pclose(lcpl);
      break;
    }
    case 7: {  // a dataset moved to another name
      const std::string& from = in.pick(s.datasets);
      const std::string to = from.substr(0, from.rfind('/') + 1) + in.pick(kNames);
      H5Lmove(f, from.c_str(), f, to.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      break;
    }
    case 8:  // other values
      overwrite_values(f, in.pick(s.datasets), in);
      break;
    default:  // the root's token list
      write_int_attribute(f, (in.u8() & 1) != 0 ? "tokens" : "positions", in);
  }
}

// The capture with the input's edits, at `path`: the valid capture's bytes are written there,
// opened with HDF5's core driver (the whole file in memory, every edit made there) and written
// back once when it closes.
void write_edited_capture(const std::string& path, Input& in) {
  const Setup& s = setup();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(s.image.data()), std::streamsize(s.image.size()));
    if (!out) std::abort();
  }
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, true);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  if (f < 0) std::abort();
  for (int edits = 0; !in.done() && edits < 12; ++edits) apply_edit(f, in);
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
}

// What parity-trace --candidate-trace does with the capture, up to its reports.
void judge(const std::string& capture_path) {
  const Setup& s = setup();
  const Model& m = *s.model;
  const TraceReader capture(capture_path, TraceKind::capture);
  const CaptureCheck check = check_capture(capture, m, nullptr);
  const PrecisionPolicy policy =
      capture.meta().precision_policy.value_or(PrecisionPolicy::float32(4));
  auto reference = make_backend("reference", m);
  reference->reset();
  for (int layer = 0; layer < m.config.num_hidden_layers && check.cached > 0; ++layer)
    reference->load_cache(kRecomputeSequence, layer, capture.cache_rows(layer));
  trace_recompute(*reference, m, capture, policy, 64, s.reference_path,
                  {{"candidate_trace", capture_path}}, check.cached);
  const TraceReader b(s.reference_path);
  DiffOptions options;
  options.capture = true;
  Criterion criterion = Criterion::derived();
  criterion.policy = policy;
  const DiffResult r = diff_traces(capture, b, criterion, options);
  for (ReportFormat f : {ReportFormat::Text, ReportFormat::Html, ReportFormat::Junit}) {
    const std::string report = render_report(r, f);
    FUZZ_REQUIRE(printable_text(report) == report);
  }
  FUZZ_REQUIRE(nlohmann::json::accept(render_report(r, ReportFormat::Json)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = setup();
  Input in(data, size);
  write_edited_capture(s.capture_path, in);
  try {
    judge(s.capture_path);
  } catch (const Error& e) {
    // CANDIDATE_TRACE_FUZZ_VERBOSE=1 shows what each input was refused for (reproducing one).
    static const bool verbose = std::getenv("CANDIDATE_TRACE_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    fuzz::check_message(e);
  }
  return 0;
}
