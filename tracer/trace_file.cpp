// HDF5 trace files through the HDF5 C++ API: TraceWriter writes one dataset per traced stage
// row under a temporary name and renames it into place on finish(); TraceReader checks that a
// file is a gpt-oss-parity trace, reads its metadata and indexes its datasets in execution
// order. Every HDF5 failure becomes a parity::Error naming the file.
#include "tracer/trace_file.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string_view>
#include <tuple>

#include "model/error.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

// ---- HDF5 error reporting ----------------------------------------------------------------
// HDF5 prints its error stack to stderr by default. We replace that printer with one that
// keeps only the innermost message (the one that says what really failed, e.g. "unable to
// open file: ... No such file or directory"), for the parity::Error we throw instead.

thread_local std::string g_last_hdf5_error;

herr_t keep_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err != nullptr && err->desc != nullptr) *static_cast<std::string*>(out) = err->desc;
  return 0;
}

herr_t record_hdf5_error(hid_t stack, void*) {
  g_last_hdf5_error.clear();
  H5Ewalk2(stack, H5E_WALK_UPWARD, keep_innermost, &g_last_hdf5_error);
  return 0;
}

void quiet_hdf5_errors() {
  H5::Exception::dontPrint();
  H5Eset_auto2(H5E_DEFAULT, record_hdf5_error, nullptr);
}

[[noreturn]] void fail_hdf5(const H5::Exception& e, const std::string& file, std::string_view doing) {
  std::string detail = g_last_hdf5_error.empty() ? e.getDetailMsg() : g_last_hdf5_error;
  g_last_hdf5_error.clear();
  fail("{}: {} failed (HDF5: {})", file, doing, detail);
}

// Runs body, turning any H5::Exception into a parity::Error naming the file.
template <typename F>
auto hdf5_call(const std::string& file, std::string_view doing, F&& body) -> decltype(body()) {
  g_last_hdf5_error.clear();  // only a failure inside body may explain its exception
  try {
    return body();
  } catch (const H5::Exception& e) {
    fail_hdf5(e, file, doing);
  }
}

// ---- attributes ----------------------------------------------------------------------------

H5::StrType utf8_string_type() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

void write_string_attr(H5::H5Object& obj, const char* name, const std::string& value) {
  const H5::StrType type = utf8_string_type();
  H5::Attribute a = obj.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
  a.write(type, value);
}

void write_int_attr(H5::H5Object& obj, const char* name, int32_t value) {
  H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I32LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_INT32, &value);
}

void write_int_array_attr(H5::H5Object& obj, const char* name, const std::vector<int32_t>& values) {
  const hsize_t n = values.size();
  H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I32LE, H5::DataSpace(1, &n));
  const int32_t none = 0;
  a.write(H5::PredType::NATIVE_INT32, values.empty() ? &none : values.data());
}

// Reads are checked: a missing or mistyped attribute names the file, object and attribute.
struct AttrReader {
  const std::string& file;
  const H5::H5Object& obj;
  std::string where;  // "/" or a dataset path

  bool has(const char* name) const { return obj.attrExists(name); }

  H5::Attribute open(const char* name, H5T_class_t cls, const char* expected) const {
    if (!obj.attrExists(name)) fail("{}: {} has no attribute \"{}\"", file, where, name);
    H5::Attribute a = obj.openAttribute(name);
    if (a.getTypeClass() != cls)
      fail("{}: attribute \"{}\" of {} is not {}", file, name, where, expected);
    return a;
  }

  std::string str(const char* name) const {
    H5::Attribute a = open(name, H5T_STRING, "a string");
    std::string value;
    a.read(a.getStrType(), value);
    return value;
  }

  std::vector<int32_t> ints(const char* name) const {
    H5::Attribute a = open(name, H5T_INTEGER, "an integer");
    const hssize_t n = a.getSpace().getSimpleExtentNpoints();
    std::vector<int32_t> values(size_t(std::max<hssize_t>(n, 0)));
    if (!values.empty()) a.read(H5::PredType::NATIVE_INT32, values.data());
    return values;
  }

  int32_t int1(const char* name) const {
    const auto v = ints(name);
    if (v.size() != 1)
      fail("{}: attribute \"{}\" of {} should be one integer, has {} values", file, name, where,
           v.size());
    return v[0];
  }

  nlohmann::json json(const char* name) const {
    const std::string text = str(name);
    try {
      return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: attribute \"{}\" of {} is not valid JSON ({})", file, name, where, e.what());
    }
  }
};

std::optional<int> parse_index(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

std::string dims_text(const std::vector<size_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::string_view series_name(Series s) {
  switch (s) {
    case Series::output: return "output";
    case Series::replay: return "replay";
    case Series::magnitude: return "magnitude";
  }
  return "output";
}

namespace {
// The group a series' datasets live under: the root for outputs, /replay, /magnitude.
std::string series_prefix(Series s) {
  return s == Series::output ? std::string() : "/" + std::string(series_name(s));
}
}  // namespace

std::string trace_dataset_path(int position, int layer, Stage s, Series series) {
  const std::string prefix = series_prefix(series);
  if (layer == kModelLayer) return fmt::format("{}/pos_{}/model/{}", prefix, position, name(s));
  return fmt::format("{}/pos_{}/layer_{}/{}", prefix, position, layer, name(s));
}

// ---- TraceWriter -----------------------------------------------------------------------------

struct TraceWriter::Impl {
  std::string path;      // final name
  std::string tmp_path;  // written here until finish()
  std::set<int> positions;
  std::vector<int32_t> tokens, token_positions;  // written at finish()
  std::unique_ptr<H5::H5File> file;
  std::set<std::string> groups;
  std::set<std::string> datasets;
  bool finished = false;

  ~Impl() {
    if (finished) return;
    // An unfinished trace must not survive: close what is open, then remove the temp file.
    try {
      if (file) file->close();
    } catch (const H5::Exception&) {
    }
    file.reset();
    std::error_code ec;
    if (!tmp_path.empty()) fs::remove(tmp_path, ec);
  }

  void ensure_group(const std::string& group) {
    if (groups.insert(group).second) file->createGroup(group);
  }
};

TraceWriter::TraceWriter(std::string path, TraceMeta meta, std::set<int> positions)
    : impl_(std::make_unique<Impl>()) {
  quiet_hdf5_errors();
  if (path.empty()) fail("trace writer: empty output path");
  impl_->path = std::move(path);
  impl_->tmp_path = fmt::format("{}.tmp-{}", impl_->path, ::getpid());
  impl_->positions = std::move(positions);
  hdf5_call(impl_->path, "creating the trace", [&] {
    H5::FileAccPropList fapl;
    // The 1.8+ object format keeps large attributes (long token lists) in dense storage.
    fapl.setLibverBounds(H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    impl_->file = std::make_unique<H5::H5File>(impl_->tmp_path, H5F_ACC_TRUNC,
                                               H5::FileCreatPropList::DEFAULT, fapl);
    H5::Group root = impl_->file->openGroup("/");
    write_string_attr(root, "format", kTraceFormat);
    write_int_attr(root, "format_version", kTraceFormatVersion);
    write_string_attr(root, "backend", meta.backend);
    write_string_attr(root, "precision", meta.precision);
    write_string_attr(root, "config", meta.config.dump());
    write_string_attr(root, "checkpoint_fingerprint", meta.fingerprint);
    write_string_attr(root, "model_dir", meta.model_dir);
    write_string_attr(root, "tool_version", meta.tool_version);
    write_string_attr(root, "commit", meta.commit);
    write_string_attr(root, "device", meta.device.dump());
    write_string_attr(root, "created", meta.created);
    if (meta.precision_policy)
      write_string_attr(root, "precision_policy", meta.precision_policy->to_json().dump());
    write_int_attr(root, "replay", meta.replay ? 1 : 0);
    write_string_attr(root, "run", meta.run.dump());
  });
  impl_->tokens = std::move(meta.tokens);
  impl_->token_positions = std::move(meta.positions);
}

void TraceWriter::set_tokens(std::vector<int32_t> tokens, std::vector<int32_t> positions) {
  if (impl_->finished) fail("{}: set_tokens() after finish()", impl_->path);
  impl_->tokens = std::move(tokens);
  impl_->token_positions = std::move(positions);
}

TraceWriter::~TraceWriter() = default;

bool TraceWriter::wants(int position, int, Stage) const {
  return impl_->positions.empty() || impl_->positions.contains(position);
}

void TraceWriter::record(const StageKey& key, const StageData& data) {
  Impl& w = *impl_;
  if (w.finished) fail("{}: record() after finish(): the trace is already complete", w.path);
  const StageInfo& si = info(key.stage);
  const std::string ds_path = trace_dataset_path(key.position, key.layer, key.stage, key.series);
  if (key.position < 0) fail("{}: {}: negative position {}", w.path, ds_path, key.position);
  if ((si.scope == Scope::Model) != (key.layer == kModelLayer) || key.layer < kModelLayer)
    fail("{}: {}: stage {} is {}-scope but was recorded with layer {}", w.path, ds_path, si.name,
         scope_name(si.scope), key.layer);
  if (data.dims.empty()) fail("{}: {}: stage data has no dims", w.path, ds_path);
  size_t elements = 1;
  for (size_t d : data.dims) elements *= d;
  if (elements != data.size())
    fail("{}: {}: dims {} hold {} values but the data has {}", w.path, ds_path,
         dims_text(data.dims), elements, data.size());
  if (key.series == Series::magnitude && (si.kind == ValueKind::Index || data.type != StageData::Type::F64))
    fail("{}: {}: magnitudes are float64 rows of real stages", w.path, ds_path);
  if ((si.kind == ValueKind::Index) != (data.type == StageData::Type::I32))
    fail("{}: {}: stage {} holds {} values; int32 is for index stages only", w.path, ds_path,
         si.name, si.kind == ValueKind::Index ? "index" : "real");
  if (!w.datasets.insert(ds_path).second)
    fail("{}: {} recorded twice (each position, layer and stage is traced once)", w.path, ds_path);

  hdf5_call(w.path, "writing " + ds_path, [&] {
    const std::string prefix = series_prefix(key.series);
    if (!prefix.empty()) w.ensure_group(prefix);
    w.ensure_group(fmt::format("{}/pos_{}", prefix, key.position));
    w.ensure_group(ds_path.substr(0, ds_path.rfind('/')));
    std::vector<hsize_t> dims(data.dims.begin(), data.dims.end());
    const H5::DataSpace space(int(dims.size()), dims.data());
    const H5::PredType* file_type = &H5::PredType::IEEE_F64LE;
    const H5::PredType* mem_type = &H5::PredType::NATIVE_DOUBLE;
    const void* values = data.f64.data();
    if (data.type == StageData::Type::F32) {
      file_type = &H5::PredType::IEEE_F32LE;
      mem_type = &H5::PredType::NATIVE_FLOAT;
      values = data.f32.data();
    } else if (data.type == StageData::Type::I32) {
      file_type = &H5::PredType::STD_I32LE;
      mem_type = &H5::PredType::NATIVE_INT32;
      values = data.i32.data();
    }
    H5::DataSet ds = w.file->createDataSet(ds_path, *file_type, space);
    if (elements > 0) ds.write(values, *mem_type);
    write_string_attr(ds, "stage", std::string(si.name));
    write_int_attr(ds, "layer", key.layer);
    write_int_attr(ds, "position", key.position);
    write_int_attr(ds, "order", key.order);
  });
}

void TraceWriter::finish() {
  Impl& w = *impl_;
  if (w.finished) fail("{}: finish() called twice", w.path);
  hdf5_call(w.path, "closing the trace", [&] {
    H5::Group root = w.file->openGroup("/");
    write_int_array_attr(root, "tokens", w.tokens);
    write_int_array_attr(root, "positions", w.token_positions);
    w.file->flush(H5F_SCOPE_GLOBAL);
    w.file->close();
  });
  w.file.reset();
  std::error_code ec;
  fs::rename(w.tmp_path, w.path, ec);
  if (ec) fail("{}: cannot move the finished trace {} into place ({})", w.path, w.tmp_path, ec.message());
  w.finished = true;
}

// ---- TraceReader -----------------------------------------------------------------------------

struct TraceReader::Impl {
  std::string path;
  std::unique_ptr<H5::H5File> file;
  TraceMeta meta;
  std::vector<TraceEntry> entries;  // output series
  std::set<std::string> paths;      // every series
  std::set<Series> series;

  void read_meta(const H5::Group& root) {
    const AttrReader attrs{path, root, "/"};
    if (!attrs.has("format")) fail("{}: not a gpt-oss-parity trace (no \"format\" attribute)", path);
    const auto format = attrs.str("format");
    if (format != kTraceFormat)
      fail("{}: not a gpt-oss-parity trace (format is \"{}\", expected \"{}\")", path, format,
           kTraceFormat);
    const int version = attrs.int1("format_version");
    if (version < kOldestTraceFormatVersion || version > kTraceFormatVersion)
      fail("{}: not a gpt-oss-parity trace this build reads (format_version {}, expected {} to "
           "{})",
           path, version, kOldestTraceFormatVersion, kTraceFormatVersion);
    // Required: what the differ needs to pair two traces. Optional: descriptive facts, so that
    // traces written by other tools (h5py dumps of a PyTorch run) need not invent them.
    meta.backend = attrs.str("backend");
    meta.config = attrs.json("config");
    meta.fingerprint = attrs.str("checkpoint_fingerprint");
    auto optional_str = [&](const char* name) { return attrs.has(name) ? attrs.str(name) : ""; };
    meta.precision = optional_str("precision");
    meta.model_dir = optional_str("model_dir");
    meta.tool_version = optional_str("tool_version");
    meta.commit = optional_str("commit");
    meta.created = optional_str("created");
    if (attrs.has("device")) meta.device = attrs.json("device");
    if (attrs.has("tokens")) meta.tokens = attrs.ints("tokens");
    if (attrs.has("positions")) meta.positions = attrs.ints("positions");
    if (attrs.has("precision_policy"))
      meta.precision_policy =
          PrecisionPolicy::from_json(attrs.json("precision_policy"), path + " (precision_policy)");
    if (attrs.has("run")) meta.run = attrs.json("run");
  }

  // Child names of a group in one pass (H5Literate, the HDF5 1.10 API): asking for the i-th name of a group is
  // linear in its size, so a loop over indices would take quadratic time in the positions.
  static std::vector<std::string> child_names(const H5::Group& g) {
    std::vector<std::string> names;
    auto collect = [](hid_t, const char* child, const H5L_info_t*, void* out) -> herr_t {
      static_cast<std::vector<std::string>*>(out)->emplace_back(child);
      return 0;
    };
    hsize_t idx = 0;
    if (H5Literate(g.getId(), H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect, &names) < 0)
      throw H5::GroupIException("H5Literate", "cannot list a group's members");
    return names;
  }

  void index_datasets(const H5::Group& root) {
    index_series(root, "", Series::output);
    for (Series s : {Series::replay, Series::magnitude}) {
      const std::string group(series_name(s));
      if (!root.nameExists(group)) continue;
      if (root.childObjType(group) != H5O_TYPE_GROUP)
        fail("{}: /{} is not a group of {} datasets", path, group, group);
      index_series(root.openGroup(group), "/" + group, s);
    }
    std::sort(entries.begin(), entries.end(), [](const TraceEntry& x, const TraceEntry& y) {
      return std::tie(x.key.position, x.key.order, x.path) <
             std::tie(y.key.position, y.key.order, y.path);
    });
    meta.replay = series.contains(Series::replay);
  }

  void index_series(const H5::Group& top, const std::string& prefix, Series s) {
    for (const std::string& pos_name : child_names(top)) {
      if (!pos_name.starts_with("pos_")) continue;  // room for users' own annotations
      const auto position = parse_index(std::string_view(pos_name).substr(4));
      if (!position || top.childObjType(pos_name) != H5O_TYPE_GROUP)
        fail("{}: {}/{} is not a group named pos_<position>", path, prefix, pos_name);
      const H5::Group pos_group = top.openGroup(pos_name);
      for (const std::string& scope_name : child_names(pos_group)) {
        const std::string scope_path = prefix + "/" + pos_name + "/" + scope_name;
        std::optional<int> layer;
        if (scope_name == "model")
          layer = kModelLayer;
        else if (scope_name.starts_with("layer_"))
          layer = parse_index(std::string_view(scope_name).substr(6));
        if (!layer || pos_group.childObjType(scope_name) != H5O_TYPE_GROUP)
          fail("{}: {} is not a group named model or layer_<layer>", path, scope_path);
        const H5::Group scope_group = pos_group.openGroup(scope_name);
        for (const std::string& ds_name : child_names(scope_group))
          add_entry(scope_group, scope_path, ds_name, *position, *layer, s);
      }
    }
  }

  void add_entry(const H5::Group& group, const std::string& group_path, const std::string& name,
                 int position, int layer, Series s) {
    const std::string ds_path = group_path + "/" + name;
    const auto stage = stage_from_name(name);
    if (!stage || group.childObjType(name) != H5O_TYPE_DATASET)
      fail("{}: {} is not a dataset named after a stage", path, ds_path);
    if (is_model_scope(*stage) != (layer == kModelLayer))
      fail("{}: {}: stage {} does not belong in {}", path, ds_path, name, group_path);
    const H5::DataSet ds = group.openDataSet(name);
    const AttrReader attrs{path, ds, ds_path};
    const std::string stage_attr = attrs.str("stage");
    const int layer_attr = attrs.int1("layer"), position_attr = attrs.int1("position");
    if (stage_attr != name || layer_attr != layer || position_attr != position)
      fail("{}: {} has attributes stage={}, layer={}, position={} that disagree with its path",
           path, ds_path, stage_attr, layer_attr, position_attr);
    const StageKey key{position, layer, *stage, attrs.int1("order"), s};
    paths.insert(ds_path);
    series.insert(s);
    if (s == Series::output) entries.push_back({ds_path, key});
  }
};

TraceReader::TraceReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  quiet_hdf5_errors();
  impl_->path = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail("{}: cannot access ({})", path, ec.message());
    fail("{}: no such file", path);
  }
  if (fs::is_directory(status)) fail("{}: is a directory, not a trace file", path);
  if (!std::ifstream(path, std::ios::binary)) fail("{}: cannot open for reading", path);
  hdf5_call(path, "reading the trace", [&] {
    if (!H5::H5File::isHdf5(path))
      fail("{}: not an HDF5 file (a gpt-oss-parity trace is HDF5)", path);
    impl_->file = std::make_unique<H5::H5File>(path, H5F_ACC_RDONLY);
    const H5::Group root = impl_->file->openGroup("/");
    impl_->read_meta(root);
    impl_->index_datasets(root);
  });
}

TraceReader::~TraceReader() = default;

const TraceMeta& TraceReader::meta() const { return impl_->meta; }
const std::string& TraceReader::path() const { return impl_->path; }
const std::vector<TraceEntry>& TraceReader::entries() const { return impl_->entries; }
bool TraceReader::has(const std::string& dataset_path) const {
  return impl_->paths.contains(dataset_path);
}
bool TraceReader::has_series(Series s) const { return impl_->series.contains(s); }

StageData TraceReader::read(const std::string& dataset_path) const {
  const std::string& file = impl_->path;
  if (!has(dataset_path)) fail("{}: no dataset {}", file, dataset_path);
  return hdf5_call(file, "reading " + dataset_path, [&] {
    const H5::DataSet ds = impl_->file->openDataSet(dataset_path);
    const H5::DataSpace space = ds.getSpace();
    const int rank = space.getSimpleExtentNdims();
    std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
    if (rank > 0) space.getSimpleExtentDims(dims.data());
    StageData d;
    d.dims.assign(dims.begin(), dims.end());
    size_t n = 1;
    for (size_t x : d.dims) n *= x;
    const H5T_class_t cls = ds.getTypeClass();
    if (cls == H5T_FLOAT && ds.getFloatType().getSize() == 8) {
      d.type = StageData::Type::F64;
      d.f64.resize(n);
      if (n > 0) ds.read(d.f64.data(), H5::PredType::NATIVE_DOUBLE);
    } else if (cls == H5T_FLOAT && ds.getFloatType().getSize() == 4) {
      d.type = StageData::Type::F32;
      d.f32.resize(n);
      if (n > 0) ds.read(d.f32.data(), H5::PredType::NATIVE_FLOAT);
    } else if (cls == H5T_INTEGER && ds.getIntType().getSize() == 4 &&
               ds.getIntType().getSign() == H5T_SGN_2) {
      d.type = StageData::Type::I32;
      d.i32.resize(n);
      if (n > 0) ds.read(d.i32.data(), H5::PredType::NATIVE_INT32);
    } else {
      fail("{}: {} has an unsupported element type (expected float64, float32 or int32)", file,
           dataset_path);
    }
    return d;
  });
}

}  // namespace parity
