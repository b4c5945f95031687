// Tests of the HDF5 trace files: round trip of all dtypes and metadata, layout and attributes as
// h5py/h5dump users see them, entry ordering, atomic writes, and the reader refusing files that
// are not traces. Then the trace as untrusted input, one test per class of hostile or broken
// file (crafted with the HDF5 C API from a good trace): every refusal is a parity::Error naming
// the file, never a crash, a hang or an allocation the file cannot back; and the writer on a
// full disk.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "model/error.h"
#include "tests/test_util.h"
#include "tracer/differ.h"
#include "tracer/profiles.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

Config small_config() { return test::small_config(); }

TraceMeta small_meta(const Config& c, const std::string& backend) {
  TraceMeta m;
  m.backend = backend;
  m.precision = backend == "reference" ? "float64" : "float32";
  m.config = c.to_json();
  m.fingerprint = "fp-0123456789abcdef";
  m.model_dir = "/models/small";
  m.tokens = {3, 1, 4};
  m.positions = {0, 1, 2};
  m.tool_version = "0.1.0";
  m.commit = "abc123";
  m.device = {{"name", "test device"}, {"driver", "1.2"}};
  m.created = "2024-01-02T03:04:05Z";
  return m;
}

StageData make_row(const Config& c, Stage s, int pos, StageData::Type type, double seed) {
  StageData d;
  d.type = type;
  d.dims = stage_dims(c, s, pos);
  size_t n = 1;
  for (size_t x : d.dims) n *= x;
  for (size_t i = 0; i < n; ++i) {
    const double v = seed + 0.25 * double(i) - 1.0;
    if (type == StageData::Type::F64) d.f64.push_back(v);
    if (type == StageData::Type::F32) d.f32.push_back(float(v));
    if (type == StageData::Type::I32) d.i32.push_back(int32_t(i % size_t(c.num_local_experts)));
  }
  return d;
}

StageKey key(const Config& c, int pos, int layer, Stage s) {
  return {pos, layer, s, execution_order(c, layer, s)};
}

TEST(TraceFile, DatasetPaths) {
  EXPECT_EQ(trace_dataset_path(7, kModelLayer, Stage::logits), "/pos_7/model/logits");
  EXPECT_EQ(trace_dataset_path(0, 1, Stage::qkv), "/pos_0/layer_1/qkv");
}

TEST(TraceFile, RoundTripsDtypesMetadataAndOrder) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("trace.h5");
  const TraceMeta meta = small_meta(c, "cpu-f32");

  StageData scores = make_row(c, Stage::scores, 1, StageData::Type::F64, 0.5);
  scores.f64[1] = -std::numeric_limits<double>::infinity();  // a masked key
  const StageData embedding = make_row(c, Stage::embedding, 0, StageData::Type::F64, 1.0);
  const StageData qkv = make_row(c, Stage::qkv, 0, StageData::Type::F32, 2.0);
  const StageData topk = make_row(c, Stage::topk_idx, 0, StageData::Type::I32, 0);
  const StageData logits = make_row(c, Stage::logits, 0, StageData::Type::F32, 3.0);
  {
    TraceWriter w(path, meta);
    // Recorded out of order: the reader sorts by (position, order).
    w.record(key(c, 1, 0, Stage::scores), scores);
    w.record(key(c, 0, kModelLayer, Stage::logits), logits);
    w.record(key(c, 0, 1, Stage::topk_idx), topk);
    w.record(key(c, 0, 0, Stage::qkv), qkv);
    w.record(key(c, 0, kModelLayer, Stage::embedding), embedding);
    w.finish();
  }

  const TraceReader r(path);
  EXPECT_EQ(r.path(), path);
  const TraceMeta& m = r.meta();
  EXPECT_EQ(m.backend, meta.backend);
  EXPECT_EQ(m.precision, meta.precision);
  EXPECT_EQ(m.config, meta.config);
  EXPECT_EQ(m.fingerprint, meta.fingerprint);
  EXPECT_EQ(m.model_dir, meta.model_dir);
  EXPECT_EQ(m.tokens, meta.tokens);
  EXPECT_EQ(m.positions, meta.positions);
  EXPECT_EQ(m.tool_version, meta.tool_version);
  EXPECT_EQ(m.commit, meta.commit);
  EXPECT_EQ(m.device, meta.device);
  EXPECT_EQ(m.created, meta.created);

  const std::vector<std::string> expected_order = {
      "/pos_0/model/embedding", "/pos_0/layer_0/qkv", "/pos_0/layer_1/topk_idx",
      "/pos_0/model/logits", "/pos_1/layer_0/scores"};
  ASSERT_EQ(r.entries().size(), expected_order.size());
  for (size_t i = 0; i < expected_order.size(); ++i) {
    const TraceEntry& e = r.entries()[i];
    EXPECT_EQ(e.path, expected_order[i]);
    const auto s = stage_from_name(e.path.substr(e.path.rfind('/') + 1));
    ASSERT_TRUE(s);
    EXPECT_EQ(e.key.stage, *s);
    EXPECT_EQ(e.key.order, execution_order(c, e.key.layer, e.key.stage));
  }
  EXPECT_EQ(r.entries()[2].key.layer, 1);
  EXPECT_EQ(r.entries()[3].key.layer, kModelLayer);
  EXPECT_EQ(r.entries()[4].key.position, 1);

  const StageData e2 = r.read("/pos_0/model/embedding");
  EXPECT_EQ(e2.type, StageData::Type::F64);
  EXPECT_EQ(e2.dims, embedding.dims);
  EXPECT_EQ(e2.f64, embedding.f64);
  const StageData q2 = r.read("/pos_0/layer_0/qkv");
  EXPECT_EQ(q2.type, StageData::Type::F32);
  EXPECT_EQ(q2.dims, (std::vector<size_t>{size_t(c.qkv_dim())}));
  EXPECT_EQ(q2.f32, qkv.f32);
  const StageData t2 = r.read("/pos_0/layer_1/topk_idx");
  EXPECT_EQ(t2.type, StageData::Type::I32);
  EXPECT_EQ(t2.i32, topk.i32);
  const StageData s2 = r.read("/pos_1/layer_0/scores");
  EXPECT_EQ(s2.dims, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(s2.f64[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(s2.f64[0], scores.f64[0]);
  EXPECT_TRUE(r.has("/pos_0/model/logits"));
  EXPECT_FALSE(r.has("/pos_0/model/final_norm"));
  expect_error([&] { (void)r.read("/pos_0/model/final_norm"); }, {path, "/pos_0/model/final_norm"});

  // What an h5py/h5dump user sees: little-endian IEEE/int types and the dataset attributes.
  H5::H5File f(path, H5F_ACC_RDONLY);
  EXPECT_TRUE(f.openDataSet("/pos_0/model/embedding").getDataType() == H5::PredType::IEEE_F64LE);
  EXPECT_TRUE(f.openDataSet("/pos_0/layer_0/qkv").getDataType() == H5::PredType::IEEE_F32LE);
  EXPECT_TRUE(f.openDataSet("/pos_0/layer_1/topk_idx").getDataType() == H5::PredType::STD_I32LE);
  const H5::DataSet ds = f.openDataSet("/pos_0/layer_1/topk_idx");
  std::string stage_attr;
  const H5::Attribute sa = ds.openAttribute("stage");
  sa.read(sa.getStrType(), stage_attr);
  EXPECT_EQ(stage_attr, "topk_idx");
  int32_t layer = 0, position = -1, order = -1;
  ds.openAttribute("layer").read(H5::PredType::NATIVE_INT32, &layer);
  ds.openAttribute("position").read(H5::PredType::NATIVE_INT32, &position);
  ds.openAttribute("order").read(H5::PredType::NATIVE_INT32, &order);
  EXPECT_EQ(layer, 1);
  EXPECT_EQ(position, 0);
  EXPECT_EQ(order, execution_order(c, 1, Stage::topk_idx));
  std::string format;
  const H5::Attribute fa = f.openGroup("/").openAttribute("format");
  fa.read(fa.getStrType(), format);
  EXPECT_EQ(format, kTraceFormat);
  int32_t version = 0;
  f.openGroup("/").openAttribute("format_version").read(H5::PredType::NATIVE_INT32, &version);
  EXPECT_EQ(version, kTraceFormatVersion);
}

TEST(TraceFile, LongTokenListsFitInAttributes) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("long.h5");
  TraceMeta meta = small_meta(c, "reference");
  meta.tokens.assign(100000, 5);
  meta.positions.clear();
  for (int i = 0; i < 100000; ++i) meta.positions.push_back(i);
  TraceWriter w(path, meta);
  w.finish();
  const TraceReader r(path);
  EXPECT_EQ(r.meta().tokens.size(), 100000u);
  EXPECT_EQ(r.meta().positions.back(), 99999);
  EXPECT_TRUE(r.entries().empty());
}

TEST(TraceFile, WriteIsAtomic) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("atomic.h5");
  TraceWriter w(path, small_meta(c, "reference"));
  const std::string tmp = w.temporary_path();
  EXPECT_NE(tmp.find(fmt::format("{}.tmp-{}-", path, ::getpid())), std::string::npos) << tmp;
  w.record(key(c, 0, kModelLayer, Stage::embedding),
           make_row(c, Stage::embedding, 0, StageData::Type::F64, 1));
  EXPECT_FALSE(fs::exists(path)) << "a trace must not appear under its final name before finish()";
  EXPECT_TRUE(fs::exists(tmp));
  w.finish();
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(dir.count(), 1u);
  expect_error([&] { w.record(key(c, 1, kModelLayer, Stage::embedding),
                              make_row(c, Stage::embedding, 1, StageData::Type::F64, 1)); },
               {path, "after finish"});
  expect_error([&] { w.finish(); }, {path, "twice"});
}

TEST(TraceFile, UnfinishedTraceIsRemoved) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("crashed.h5");
  {
    TraceWriter w(path, small_meta(c, "reference"));
    w.record(key(c, 0, kModelLayer, Stage::embedding),
             make_row(c, Stage::embedding, 0, StageData::Type::F64, 1));
    EXPECT_EQ(dir.count(), 1u);  // the temp file
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(dir.count(), 0u) << "the temp file of an unfinished trace must be removed";
}

TEST(TraceFile, WantsOnlyTheRequestedPositions) {
  const Config c = small_config();
  TempDir dir;
  TraceWriter all(dir.file("all.h5"), small_meta(c, "reference"));
  EXPECT_TRUE(all.wants(0, 0, Stage::qkv));
  EXPECT_TRUE(all.wants(42, kModelLayer, Stage::logits));
  TraceWriter some(dir.file("some.h5"), small_meta(c, "reference"), {2, 5});
  EXPECT_TRUE(some.wants(2, 1, Stage::mlp1));
  EXPECT_TRUE(some.wants(5, kModelLayer, Stage::logits));
  EXPECT_FALSE(some.wants(3, 1, Stage::mlp1));
}

TEST(TraceFile, RecordRejectsInconsistentRows) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("bad.h5");
  TraceWriter w(path, small_meta(c, "cpu-f32"));
  StageData wrong_dims = make_row(c, Stage::qkv, 0, StageData::Type::F32, 0);
  wrong_dims.dims = {3};
  expect_error([&] { w.record(key(c, 0, 0, Stage::qkv), wrong_dims); }, {path, "/pos_0/layer_0/qkv", "dims"});
  const StageData float_topk = make_row(c, Stage::topk_idx, 0, StageData::Type::F32, 0);
  expect_error([&] { w.record(key(c, 0, 0, Stage::topk_idx), float_topk); }, {path, "topk_idx"});
  const StageData emb = make_row(c, Stage::embedding, 0, StageData::Type::F32, 0);
  expect_error([&] { w.record(key(c, 0, 0, Stage::embedding), emb); }, {path, "model-scope"});
  w.record(key(c, 0, kModelLayer, Stage::embedding), emb);
  expect_error([&] { w.record(key(c, 0, kModelLayer, Stage::embedding), emb); }, {path, "twice"});
}

TEST(TraceFile, WriterNamesAnUncreatableFile) {
  const Config c = small_config();
  const std::string path = "/nonexistent-parity-dir/sub/trace.h5";
  expect_error([&] { TraceWriter w(path, small_meta(c, "reference")); }, {path});
}

TEST(TraceFile, ReaderRefusesMissingAndNonHdf5Files) {
  TempDir dir;
  const std::string missing = dir.file("missing.h5");
  expect_error([&] { TraceReader r(missing); }, {missing, "no such file"});
  const std::string text = dir.file("notes.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  expect_error([&] { TraceReader r(text); }, {text, "not an HDF5 file"});
  expect_error([&] { TraceReader r(dir.file("")); }, {"directory"});
}

// Files made here for the reader are in the newest format: older ones are refused before their
// attributes are looked at (ReaderRefusesFilesWithoutChecksums).
H5::FileAccPropList latest_format() {
  H5::FileAccPropList fapl;
  fapl.setLibverBounds(H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  return fapl;
}

TEST(TraceFile, ReaderRefusesHdf5FilesThatAreNotTraces) {
  TempDir dir;
  const std::string plain = dir.file("plain.h5");
  {
    H5::H5File f(plain, H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, latest_format());
    const hsize_t n = 4;
    const double values[4] = {1, 2, 3, 4};
    f.createDataSet("x", H5::PredType::IEEE_F64LE, H5::DataSpace(1, &n))
        .write(values, H5::PredType::NATIVE_DOUBLE);
  }
  expect_error([&] { TraceReader r(plain); }, {plain, "not a gpt-oss-parity trace"});

  const std::string other_format = dir.file("other.h5");
  const std::string future = dir.file("future.h5");
  for (const auto& [path, format, version] :
       {std::tuple{other_format, std::string("something-else"), 1},
        std::tuple{future, std::string(kTraceFormat), kTraceFormatVersion + 1}}) {
    H5::H5File f(path, H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, latest_format());
    H5::Group root = f.openGroup("/");
    const H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    root.createAttribute("format", st, H5::DataSpace(H5S_SCALAR)).write(st, format);
    const int32_t v = version;
    root.createAttribute("format_version", H5::PredType::STD_I32LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT32, &v);
  }
  expect_error([&] { TraceReader r(other_format); }, {other_format, "not a gpt-oss-parity trace", "something-else"});
  expect_error([&] { TraceReader r(future); },
               {future, "not a gpt-oss-parity trace", fmt::format("format_version {}", kTraceFormatVersion + 1)});
}

TEST(TraceFile, ReaderRefusesATruncatedTrace) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("whole.h5");
  {
    TraceWriter w(path, small_meta(c, "reference"));
    for (int pos = 0; pos < 4; ++pos)
      w.record(key(c, pos, kModelLayer, Stage::logits),
               make_row(c, Stage::logits, pos, StageData::Type::F64, pos));
    w.finish();
  }
  const std::string cut = dir.file("cut.h5");
  fs::copy_file(path, cut);
  fs::resize_file(cut, fs::file_size(path) / 2);
  try {
    TraceReader r(cut);
    for (const auto& e : r.entries()) (void)r.read(e.path);
    ADD_FAILURE() << "a truncated trace was read without error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
  }
}

// ---- the trace as untrusted input ------------------------------------------------------------

// A small trace: per position the embedding, layer 0's qkv and scores, layer 1's topk_idx and
// the logits, plus a replay row (candidate) or a magnitude row (reference) of qkv.
void write_small_trace(const std::string& path, const Config& c, const TraceMeta& meta,
                       int positions = 2) {
  TraceWriter w(path, meta);
  const bool reference = meta.backend == "reference";
  const auto real = reference ? StageData::Type::F64 : StageData::Type::F32;
  for (int pos = 0; pos < positions; ++pos) {
    w.record(key(c, pos, kModelLayer, Stage::embedding), make_row(c, Stage::embedding, pos, real, pos));
    w.record(key(c, pos, 0, Stage::qkv), make_row(c, Stage::qkv, pos, real, 1));
    w.record(key(c, pos, 0, Stage::scores), make_row(c, Stage::scores, pos, real, 2));
    w.record(key(c, pos, 1, Stage::topk_idx), make_row(c, Stage::topk_idx, pos, StageData::Type::I32, 0));
    w.record(key(c, pos, kModelLayer, Stage::logits), make_row(c, Stage::logits, pos, real, 3));
    StageKey side = key(c, pos, 0, Stage::qkv);
    side.series = reference ? Series::magnitude : Series::replay;
    w.record(side, make_row(c, Stage::qkv, pos, real, 4));
  }
  w.finish();
}

// Opens the trace and reads every dataset it indexes, as the differ does.
size_t read_everything(const std::string& path) {
  const TraceReader r(path);
  size_t read = 0;
  for (const TraceEntry& e : r.entries()) {
    (void)r.read(e.path);
    ++read;
    for (Series s : {Series::replay, Series::magnitude}) {
      const std::string side = trace_dataset_path(e.key.position, e.key.layer, e.key.stage, s);
      if (r.has(side)) {
        (void)r.read(side);
        ++read;
      }
    }
  }
  return read;
}

void expect_refused(const std::string& path, std::initializer_list<std::string> parts) {
  expect_error([&] { (void)read_everything(path); }, parts);
}

// An HDF5 id of the crafting code below, closed at scope exit.
struct Id {
  hid_t id;
  herr_t (*closer)(hid_t);
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  Id(const Id&) = delete;
  ~Id() {
    if (id >= 0) closer(id);
  }
  operator hid_t() const { return id; }
};

Id string_type(size_t size) {  // size 0: variable length
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, size == 0 ? H5T_VARIABLE : size);
  return Id(H5Tcopy(t), H5Tclose);
}

Id simple_space(std::vector<hsize_t> dims) {
  return Id(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
}

// Replaces attribute `name` of `object` by one of the given type and dataspace.
void replace_attr(const std::string& file, const char* object, const char* name, hid_t type,
                  hid_t space, const void* values) {
  const Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  ASSERT_GE(f.id, 0) << file;
  const Id o(H5Oopen(f, object, H5P_DEFAULT), H5Oclose);
  ASSERT_GE(o.id, 0) << object;
  if (H5Aexists(o, name) > 0) {
    ASSERT_GE(H5Adelete(o, name), 0);
  }
  const Id a(H5Acreate2(o, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ASSERT_GE(a.id, 0) << name;
  if (values != nullptr) {
    ASSERT_GE(H5Awrite(a, type, values), 0) << name;
  }
}

// Adds dataset `path` of the given type, dims and creation properties with the four dataset
// attributes; its data is never written (nor, with late allocation, stored), so it may
// declare far more than the file holds.
void add_dataset(const std::string& file, const std::string& path, hid_t type,
                 std::vector<hsize_t> dims, const std::string& stage, int32_t layer,
                 int32_t position, int32_t order, hid_t dcpl = H5P_DEFAULT) {
  const Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  ASSERT_GE(f.id, 0) << file;
  const Id space = simple_space(dims);
  const Id ds(H5Dcreate2(f, path.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  ASSERT_GE(ds.id, 0) << path;
  const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
  const Id st = string_type(stage.size() + 1);
  const Id sa(H5Acreate2(ds, "stage", st, scalar, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ASSERT_GE(H5Awrite(sa, st, stage.c_str()), 0);
  const std::pair<const char*, int32_t> ints[3] = {{"layer", layer}, {"position", position}, {"order", order}};
  for (const auto& [name, value] : ints) {
    const Id a(H5Acreate2(ds, name, H5T_STD_I32LE, scalar, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT32, &value), 0);
  }
}

// Replaces dataset `path` of a trace of config c by one of the given type, dims and creation
// properties (see add_dataset).
void replace_dataset(const std::string& file, const Config& c, const std::string& path, hid_t type,
                     std::vector<hsize_t> dims, hid_t dcpl = H5P_DEFAULT) {
  {
    const Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(H5Ldelete(f, path.c_str(), H5P_DEFAULT), 0) << path;
  }
  // /pos_<P>/<scope>/<stage>
  const size_t a = path.find('_') + 1, b = path.find('/', a), s = path.rfind('/') + 1;
  const int position = std::stoi(path.substr(a, b - a));
  const std::string scope = path.substr(b + 1, s - b - 2);
  const int layer = scope == "model" ? kModelLayer : std::stoi(scope.substr(6));
  const std::string stage = path.substr(s);
  add_dataset(file, path, type, std::move(dims), stage, layer, position,
              execution_order(c, layer, *stage_from_name(stage)), dcpl);
}

// Class 1: a string attribute with 0 or 1000 elements (a simple dataspace, not a scalar) was
// read as one and crashed; an integer attribute of the wrong rank or size was read blindly.
TEST(TraceFile, RootAttributesOfTheWrongTypeOrShapeAreRefused) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("good.h5");
  write_small_trace(good, c, small_meta(c, "reference"));
  const std::vector<const char*> thousand(1000, "gpt-oss-parity-trace");
  int cases = 0;
  for (const char* name : {"format", "config", "backend", "checkpoint_fingerprint"}) {
    for (size_t string_size : {size_t(0), size_t(24)}) {  // variable and fixed length
      for (const std::vector<hsize_t>& dims : {std::vector<hsize_t>{0}, std::vector<hsize_t>{1000}}) {
        const std::string path = dir.file(fmt::format("attr-{}.h5", cases++));
        fs::copy_file(good, path);
        const Id type = string_type(string_size);
        const Id space = simple_space(dims);
        std::vector<char> fixed(1000 * 24, 'x');
        const void* values = dims[0] == 0 ? nullptr
                             : string_size == 0 ? static_cast<const void*>(thousand.data())
                                                : fixed.data();
        replace_attr(path, "/", name, type, space, values);
        expect_refused(path, {path, fmt::format("\"{}\"", name), fmt::format("holds {} values", dims[0])});
      }
      const std::string path = dir.file(fmt::format("attr-{}.h5", cases++));
      fs::copy_file(good, path);
      const Id null_space(H5Screate(H5S_NULL), H5Sclose);
      replace_attr(path, "/", name, string_type(string_size), null_space, nullptr);
      expect_refused(path, {path, fmt::format("\"{}\"", name), "holds 0 values"});
    }
    // Not a string at all.
    const std::string path = dir.file(fmt::format("attr-{}.h5", cases++));
    fs::copy_file(good, path);
    const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
    const int32_t seven = 7;
    replace_attr(path, "/", name, H5T_STD_I32LE, scalar, &seven);
    expect_refused(path, {path, fmt::format("\"{}\"", name), "not a string"});
  }

  // One string in a one-element simple dataspace is one string: read.
  const std::string one = dir.file("one-element.h5");
  fs::copy_file(good, one);
  const char* backend = "cpu-f32";
  replace_attr(one, "/", "backend", string_type(0), simple_space({1}), &backend);
  EXPECT_EQ(TraceReader(one).meta().backend, "cpu-f32");

  // Integers: the wrong count, rank, class or range.
  struct IntCase {
    const char* name;
    std::vector<hsize_t> dims;
    hid_t type;
    const char* says;
  };
  const int64_t big[4] = {int64_t(1) << 40, 2, 3, 4};
  const double reals[4] = {1, 2, 3, 4};
  for (const IntCase& k : {IntCase{"format_version", {3}, H5T_STD_I64LE, "should be one integer"},
                           IntCase{"format_version", {1}, H5T_STD_I64LE, "outside the int32 range"},
                           IntCase{"format_version", {1}, H5T_IEEE_F64LE, "not an integer"},
                           IntCase{"tokens", {2, 2}, H5T_STD_I64LE, "2 dimensions"},
                           IntCase{"tokens", {4}, H5T_IEEE_F64LE, "not a list of integers"},
                           IntCase{"positions", {2}, H5T_STD_I64LE, "outside the int32 range"}}) {
    const std::string path = dir.file(fmt::format("attr-{}.h5", cases++));
    fs::copy_file(good, path);
    const hid_t mem = H5Tget_class(k.type) == H5T_FLOAT ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
    const Id space = simple_space(k.dims);
    {
      const Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      ASSERT_GE(H5Adelete(f, k.name), 0);
      const Id a(H5Acreate2(f, k.name, k.type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      ASSERT_GE(H5Awrite(a, mem, mem == H5T_NATIVE_DOUBLE ? static_cast<const void*>(reals) : big), 0);
    }
    expect_refused(path, {path, fmt::format("\"{}\"", k.name), k.says});
  }
}

// Class 10: the dataset attributes stage, layer, position and order of the wrong type or shape.
TEST(TraceFile, DatasetAttributesOfTheWrongTypeOrShapeAreRefused) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("good.h5");
  write_small_trace(good, c, small_meta(c, "cpu-f32"));
  const char* ds = "/pos_0/layer_0/qkv";
  const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
  const Id null_space(H5Screate(H5S_NULL), H5Sclose);
  const Id two = simple_space({2});
  const Id thousand_space = simple_space({1000});
  const int32_t pair[2] = {0, 0};
  const double real = 0;
  const char* text = "0";
  const std::vector<const char*> thousand(1000, "qkv");
  struct Case {
    const char* name;
    hid_t type, space;
    const void* values;
    const char* says;
  };
  const Id vlen = string_type(0);
  const Id fixed = string_type(2);
  int n = 0;
  for (const Case& k : {Case{"layer", fixed, scalar, text, "not an integer"},
                        Case{"order", H5T_STD_I32LE, two, pair, "should be one integer"},
                        Case{"position", H5T_IEEE_F64LE, scalar, &real, "not an integer"},
                        Case{"layer", H5T_STD_I32LE, null_space, nullptr, "holds 0 values"},
                        Case{"stage", H5T_STD_I32LE, scalar, pair, "not a string"},
                        Case{"stage", vlen, thousand_space, thousand.data(), "holds 1000 values"}}) {
    const std::string path = dir.file(fmt::format("ds-attr-{}.h5", n++));
    fs::copy_file(good, path);
    const hid_t mem = k.type == H5T_IEEE_F64LE ? H5T_NATIVE_DOUBLE
                      : k.type == H5T_STD_I32LE ? H5T_NATIVE_INT32
                                                : k.type;
    {
      const Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      const Id o(H5Oopen(f, ds, H5P_DEFAULT), H5Oclose);
      ASSERT_GE(H5Adelete(o, k.name), 0);
      const Id a(H5Acreate2(o, k.name, k.type, k.space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      ASSERT_GE(a.id, 0);
      if (k.values != nullptr) {
        ASSERT_GE(H5Awrite(a, mem, k.values), 0);
      }
    }
    expect_error([&] { TraceReader r(path); }, {path, ds, fmt::format("\"{}\"", k.name), k.says});
  }
}

// Class 2: a dataset is checked before it is read: its shape against its stage's rule under the
// trace's config, its type against its stage's kind, its size against the file's, and where its
// data lives.
TEST(TraceFile, DatasetsAreCheckedBeforeTheyAreRead) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("good.h5");
  write_small_trace(good, c, small_meta(c, "reference"));
  EXPECT_EQ(read_everything(good), 12u);
  int n = 0;
  auto variant = [&] {
    const std::string path = dir.file(fmt::format("ds-{}.h5", n++));
    fs::copy_file(good, path);
    return path;
  };

  // 2^40 elements (8 TB) declared in a file of a few KB: refused by the stage rule, before any
  // allocation, whether contiguous (never allocated) or chunked.
  const hsize_t huge = hsize_t(1) << 40;
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_0/model/logits", H5T_IEEE_F64LE, {huge});
    expect_refused(path, {path, "/pos_0/model/logits", fmt::format("[{}]", huge), "[16]"});
  }
  {
    const std::string path = variant();
    const Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    const hsize_t chunk = 1024;
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Pset_deflate(dcpl, 6);
    replace_dataset(path, c, "/pos_1/model/logits", H5T_IEEE_F64LE, {huge}, dcpl);
    expect_refused(path, {path, "/pos_1/model/logits", fmt::format("[{}]", huge)});
  }
  // The wrong shape of the right size, and the wrong rank.
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_0/layer_0/qkv", H5T_IEEE_F64LE, {4, 4});
    expect_refused(path, {path, "/pos_0/layer_0/qkv", "holds [4, 4] values", "qkv row at position 0 is [16]"});
    // Already when the trace opens: a tool that writes its outputs after opening its inputs
    // never starts on a file with a dataset of the wrong shape.
    expect_error([&] { TraceReader r(path); }, {path, "/pos_0/layer_0/qkv", "holds [4, 4] values"});
  }
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_1/layer_0/scores", H5T_IEEE_F64LE, {2, 2});
    expect_refused(path, {path, "/pos_1/layer_0/scores", "[2, 2]", "is [2, 3]"});
  }
  // The wrong element type for the stage's kind.
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_0/layer_1/topk_idx", H5T_IEEE_F32LE, {2});
    expect_refused(path, {path, "/pos_0/layer_1/topk_idx", "not int32"});
  }
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_0/model/logits", H5T_STD_I32LE, {16});
    expect_refused(path, {path, "/pos_0/model/logits", "not float64 or float32"});
  }
  {
    const std::string path = variant();
    replace_dataset(path, c, "/pos_0/model/logits", H5T_STD_I16LE, {16});
    expect_refused(path, {path, "/pos_0/model/logits", "not float64 or float32"});
  }
  // Data kept outside the trace: external storage naming a device, which a read would open.
  {
    const std::string path = variant();
    const Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    ASSERT_GE(H5Pset_external(dcpl, "/dev/zero", 0, 16 * 8), 0);
    replace_dataset(path, c, "/pos_0/model/logits", H5T_IEEE_F64LE, {16}, dcpl);
    expect_refused(path, {path, "/pos_0/model/logits", "external storage"});
  }

  // A config whose rule gives a large row (vocab 2^20: logits [2^20], 8 MB in float64), and a
  // logits dataset of exactly that shape that the file cannot hold: refused by size.
  Config wide = c;
  wide.vocab_size = 1 << 20;
  const std::string wide_path = dir.file("wide.h5");
  {
    TraceWriter w(wide_path, small_meta(wide, "reference"));
    w.record(key(wide, 0, kModelLayer, Stage::embedding),
             make_row(wide, Stage::embedding, 0, StageData::Type::F64, 1));
    w.finish();
  }
  add_dataset(wide_path, "/pos_0/model/logits", H5T_IEEE_F64LE, {hsize_t(1) << 20}, "logits",
              kModelLayer, 0, execution_order(wide, kModelLayer, Stage::logits));
  ASSERT_LT(fs::file_size(wide_path), size_t(1) << 20);
  // Refused when the trace opens, before anything reads a dataset.
  expect_error([&] { TraceReader r(wide_path); },
               {wide_path, "/pos_0/model/logits", "declares 8388608 bytes"});

  // Links that are not the trace's own: refused when indexing, before anything follows them.
  for (bool external : {false, true}) {
    const std::string path = variant();
    {
      const Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      ASSERT_GE(H5Ldelete(f, "/pos_0/model/logits", H5P_DEFAULT), 0);
      const herr_t made =
          external ? H5Lcreate_external("/dev/stdin", "/x", f, "/pos_0/model/logits", H5P_DEFAULT, H5P_DEFAULT)
                   : H5Lcreate_soft("/pos_1/model/logits", f, "/pos_0/model/logits", H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(made, 0);
    }
    expect_error([&] { TraceReader r(path); }, {path, "/pos_0/model/logits", "soft or external link"});
  }
  // Paths that are not the layout's: a layer the config does not have, a non-canonical index.
  for (const auto& [from, to] : {std::pair{"/pos_0/layer_1", "/pos_0/layer_2"},
                                 std::pair{"/pos_1", "/pos_01"}}) {
    const std::string path = variant();
    {
      const Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      ASSERT_GE(H5Lmove(f, from, f, to, H5P_DEFAULT, H5P_DEFAULT), 0);
    }
    expect_error([&] { TraceReader r(path); }, {path, to});
  }

  // A config that is not a gpt-oss config: refused at open.
  {
    const std::string path = variant();
    const std::string config = R"({"hidden_size": 8})";
    const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
    replace_attr(path, "/", "config", string_type(config.size() + 1), scalar, config.c_str());
    expect_error([&] { TraceReader r(path); }, {path, "not a gpt-oss config", "vocab_size"});
  }
}

// Class 3: damaged bytes anywhere in a trace (a flipped bit in the link heap made HDF5 free an
// invalid pointer) end in parity::Error or, where the damage hits raw data, in values read;
// never in a crash. The newest file format's checksums turn metadata damage into errors. Run
// this under the sanitizer build (-DPARITY_SANITIZE=address,undefined) to see every stray read.
TEST(TraceFile, DamagedBytesAreAnErrorNeverACrash) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("good.h5");
  TraceMeta meta = small_meta(c, "cpu-f32");
  meta.run_id = new_run_id();
  // Position 0 holds every stage: its layer groups have more links than fit in the object
  // header, so their links live in dense storage (a fractal heap and B-trees), where a damaged
  // byte used to make HDF5 free an invalid pointer.
  {
    TraceWriter w(good, meta);
    walk_graph(c, [&](int layer, Stage s) {
      w.record(key(c, 0, layer, s), make_row(c, s, 0, is_decision(s) ? StageData::Type::I32 : StageData::Type::F32, 1));
    });
    StageKey replay = key(c, 0, 0, Stage::qkv);
    replay.series = Series::replay;
    w.record(replay, make_row(c, Stage::qkv, 0, StageData::Type::F32, 2));
    w.record(key(c, 1, kModelLayer, Stage::embedding), make_row(c, Stage::embedding, 1, StageData::Type::F32, 3));
    w.record(key(c, 1, 0, Stage::scores), make_row(c, Stage::scores, 1, StageData::Type::F32, 4));
    w.finish();
  }
  {
    const Id f(H5Fopen(good.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    const Id g(H5Gopen2(f, "/pos_0/layer_0", H5P_DEFAULT), H5Gclose);
    H5G_info_t info{};
    ASSERT_GE(H5Gget_info(g, &info), 0);
    ASSERT_EQ(info.storage_type, H5G_STORAGE_TYPE_DENSE);
  }
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  // Superblock version 3 (after the 8-byte signature): the format whose metadata has checksums.
  ASSERT_GT(bytes.size(), 9u);
  EXPECT_EQ(int(bytes[8]), 3) << "the trace is not written in the newest file format";

  const std::string damaged = dir.file("damaged.h5");
  std::mt19937 rng(20261122);
  size_t fine = 0, refused = 0, trials = 0;
  auto attempt = [&](const std::string& content) {
    {
      std::ofstream out(damaged, std::ios::binary | std::ios::trunc);
      out.write(content.data(), std::streamsize(content.size()));
    }
    ++trials;
    try {
      (void)read_everything(damaged);
      ++fine;
    } catch (const Error& e) {
      ++refused;
      const std::string what = e.what();
      EXPECT_NE(what.find(damaged), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  // Every byte of the first 2 KB (superblock, root object header, its attributes), then a
  // stride over the rest, each with a random non-zero xor; then truncations.
  const size_t stride = std::max<size_t>(1, bytes.size() / 2500);
  for (size_t at = 0; at < bytes.size(); at += at < 2048 ? 1 : stride) {
    std::string copy = bytes;
    copy[at] = char(uint8_t(copy[at]) ^ uint8_t(1 + rng() % 255));
    attempt(copy);
  }
  for (size_t length : {size_t(0), size_t(7), size_t(48), size_t(512), bytes.size() / 3,
                        bytes.size() / 2, bytes.size() - 1})
    attempt(bytes.substr(0, length));
  std::printf("damaged trace: %zu tried, %zu read, %zu refused (file of %zu bytes)\n", trials,
              fine, refused, bytes.size());
  EXPECT_GT(refused, 0u);

  // Variable-length strings, as in traces written before fixed-length strings and in h5py's:
  // they live in the global heap, which has no checksum (a damaged object size there made
  // HDF5 copy past its buffers). Every byte of the heap's objects is damaged in turn.
  const std::string legacy = dir.file("legacy.h5");
  fs::copy_file(good, legacy);
  const std::string config = c.to_json().dump(), device = meta.device.dump();
  const std::vector<std::pair<const char*, std::string>> strings = {
      {"backend", "cpu-f32"}, {"config", config}, {"created", meta.created}, {"device", device},
      {"run", "{}"}};
  {
    const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
    for (const auto& [name, value] : strings) {
      const char* text = value.c_str();
      replace_attr(legacy, "/", name, string_type(0), scalar, &text);
    }
  }
  {
    const TraceReader r(legacy);
    EXPECT_EQ(r.meta().config, c.to_json());
    EXPECT_EQ(r.meta().backend, "cpu-f32");
    EXPECT_EQ(r.meta().device, meta.device);
  }
  {
    std::ifstream in(legacy, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  const size_t heap = bytes.find("GCOL");
  ASSERT_NE(heap, std::string::npos) << "no global heap in the crafted trace";
  trials = fine = refused = 0;
  for (size_t at = heap; at < std::min(bytes.size(), heap + 1024); ++at) {
    std::string copy = bytes;
    copy[at] = char(uint8_t(copy[at]) ^ uint8_t(1 + rng() % 255));
    attempt(copy);
  }
  std::printf("damaged global heap: %zu tried, %zu read, %zu refused\n", trials, fine, refused);
  EXPECT_GT(refused, 0u);
}

// Class 3, files of other tools: HDF5's default (1.6) object format has no metadata checksums,
// and HDF5 1.10 crashes on a damaged object header of that format (a flipped byte in an
// attribute message made H5Aexists copy past its buffer). Such a file is refused by its
// superblock version, before HDF5 reads any object, with the way to convert it.
TEST(TraceFile, ReaderRefusesFilesWithoutChecksums) {
  TempDir dir;
  const std::string old_format = dir.file("h5py-default.h5");
  {
    H5::H5File f(old_format, H5F_ACC_TRUNC);  // the library's default: the oldest format
    H5::Group root = f.openGroup("/");
    const H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    root.createAttribute("format", st, H5::DataSpace(H5S_SCALAR)).write(st, std::string(kTraceFormat));
  }
  expect_error([&] { TraceReader r(old_format); },
               {old_format, "without metadata checksums", "superblock version 0", "h5repack --latest"});
  // A user block moves the superblock to 512: found there too.
  const std::string with_userblock = dir.file("userblock.h5");
  {
    H5::FileCreatPropList fcpl;
    fcpl.setUserblock(512);
    H5::H5File f(with_userblock, H5F_ACC_TRUNC, fcpl);
  }
  expect_error([&] { TraceReader r(with_userblock); }, {with_userblock, "without metadata checksums"});
}

// Class 4: JSON attributes are untrusted text: out-of-range numbers, deep nesting and garbage
// end in one line naming the file that never echoes the value whole.
TEST(TraceFile, JsonAttributesAreUntrusted) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("good.h5");
  write_small_trace(good, c, small_meta(c, "reference"));
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  std::string long_garbage(1 << 20, 'z');
  long_garbage[5000] = '\n';
  nlohmann::json config = c.to_json();
  std::string huge_number = config.dump();
  huge_number.replace(huge_number.find("\"rms_norm_eps\":") + 15, 0, "1e400, \"x\":");
  int n = 0;
  for (const auto& [name, value, says] :
       {std::tuple<const char*, std::string, const char*>{"config", huge_number, "out of range"},
        {"config", deep, "deeper than"},
        {"device", deep, "deeper than"},
        {"run", long_garbage, "not valid JSON"},
        {"precision_policy", "{\"storage_unit_roundoff\": 1e400}", "out of range"},
        {"config", "[1, 2, 3]", "not a gpt-oss config"}}) {
    const std::string path = dir.file(fmt::format("json-{}.h5", n++));
    fs::copy_file(good, path);
    const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
    replace_attr(path, "/", name, string_type(value.size() + 1), scalar, value.c_str());
    try {
      TraceReader r(path);
      ADD_FAILURE() << name << ": accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
      EXPECT_LT(what.size(), 600u) << "the value is echoed whole: " << what.substr(0, 600);
      EXPECT_EQ(what.find('\n'), std::string::npos) << what.substr(0, 600);
    }
  }
}

// Class 5: a FIFO or a device given as a trace hung the reader (and, as the output, the writer).
TEST(TraceFile, FifosAndDevicesAreRefused) {
  const Config c = small_config();
  TempDir dir;
  const std::string fifo = dir.file("fifo.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { TraceReader r(fifo); }, {fifo, "not a regular file"});
  expect_error([&] { TraceReader r("/dev/null"); }, {"/dev/null", "not a regular file"});
  expect_error([&] { TraceReader r("/dev/zero"); }, {"/dev/zero", "not a regular file"});

  expect_error([&] { TraceWriter w(fifo, small_meta(c, "reference")); }, {fifo, "not a regular file"});
  expect_error([&] { TraceWriter w("/dev/null", small_meta(c, "reference")); },
               {"/dev/null", "not a regular file"});
  const std::string sub = dir.file("sub");
  fs::create_directory(sub);
  expect_error([&] { TraceWriter w(sub, small_meta(c, "reference")); }, {sub, "directory"});
  // A FIFO squatting on the temporary name is not replaced either.
  const std::string out = dir.file("out.h5");
  const std::string tmp_fifo = TraceWriter::next_temporary_path(out);
  ASSERT_EQ(::mkfifo(tmp_fifo.c_str(), 0600), 0);
  expect_error([&] { TraceWriter w(out, small_meta(c, "reference")); }, {out, "temporary name"});
  EXPECT_TRUE(fs::is_fifo(tmp_fifo));
  EXPECT_TRUE(fs::is_fifo(fifo));
  // A regular file is replaced.
  std::ofstream(dir.file("old.h5")) << "an old trace\n";
  write_small_trace(dir.file("old.h5"), c, small_meta(c, "reference"));
  EXPECT_EQ(read_everything(dir.file("old.h5")), 12u);
}

// Class 6: indexing is one pass per group (H5Literate); indexing by position number was
// quadratic in the positions (4,000 positions took 51 s). Now well under a second (0.54 s on
// the 2-core CI machine; docs/measurements.md); the 20 s limit only tells linear from quadratic
// and leaves room for a loaded machine and the sanitizers.
TEST(TraceFile, IndexingIsLinearInThePositions) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("long.h5");
  constexpr int kPositions = 4000;
  {
    TraceWriter w(path, small_meta(c, "cpu-f32"));
    for (int pos = 0; pos < kPositions; ++pos) {
      w.record(key(c, pos, kModelLayer, Stage::embedding),
               make_row(c, Stage::embedding, pos, StageData::Type::F32, pos));
      w.record(key(c, pos, 1, Stage::topk_idx),
               make_row(c, Stage::topk_idx, pos, StageData::Type::I32, 0));
    }
    w.finish();
  }
  const auto start = std::chrono::steady_clock::now();
  const TraceReader r(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("indexed %d positions (%zu datasets) in %.3f s\n", kPositions, r.entries().size(), seconds);
  ASSERT_EQ(r.entries().size(), size_t(2 * kPositions));
  EXPECT_LT(seconds, 20.0);
  EXPECT_EQ(r.entries().back().path, fmt::format("/pos_{}/layer_1/topk_idx", kPositions - 1));
  for (size_t i = 1; i < r.entries().size(); ++i)
    ASSERT_LE(std::tie(r.entries()[i - 1].key.position, r.entries()[i - 1].key.order),
              std::tie(r.entries()[i].key.position, r.entries()[i].key.order));
}

// Runs body in a forked child and returns what it reports. The child leaves with _exit, so the
// parent's exit handlers (temporary directories) do not run twice; with run_hdf5_cleanup it
// first runs HDF5's own exit-time cleanup (H5close), which is where a file that failed to close
// crashes the process.
struct ChildReport {
  bool crashed = false;
  int signal = 0;
  std::string text;
};
template <typename F>
ChildReport in_child(bool run_hdf5_cleanup, F&& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string text;
    try {
      text = body();
    } catch (const std::exception& e) {
      text = std::string("unexpected exception: ") + e.what();
    }
    if (run_hdf5_cleanup) H5close();
    (void)!::write(fds[1], text.data(), text.size());
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildReport report;
  char buffer[4096];
  for (ssize_t got; (got = ::read(fds[0], buffer, sizeof buffer)) > 0;) report.text.append(buffer, size_t(got));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  report.crashed = !WIFEXITED(status);
  report.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return report;
}

// Writes positions until the writer throws; reports the error line and what is left in `dir`.
std::string write_until_refused(const std::string& dir, const Config& c) {
  const std::string path = dir + "/trace.h5";
  try {
    TraceWriter w(path, small_meta(c, "reference"));
    for (int pos = 0; pos < 100000; ++pos) {
      w.record(key(c, pos, kModelLayer, Stage::embedding),
               make_row(c, Stage::embedding, pos, StageData::Type::F64, pos));
      w.record(key(c, pos, kModelLayer, Stage::logits),
               make_row(c, Stage::logits, pos, StageData::Type::F64, pos));
    }
    w.finish();
    return "FAIL: the whole trace was written";
  } catch (const Error& e) {
    std::string left;
    for (const auto& entry : fs::directory_iterator(dir)) left += " " + entry.path().filename().string();
    return fmt::format("ERROR {}\nLEFT{}", e.what(), left);
  }
}

void check_abandoned(const ChildReport& r, const std::string& path, const char* cause) {
  ASSERT_FALSE(r.crashed) << "the writer's process died of signal " << r.signal << "; it reported: " << r.text;
  ASSERT_EQ(r.text.rfind("ERROR ", 0), 0u) << r.text;
  const std::string line = r.text.substr(6, r.text.find('\n') - 6);
  EXPECT_NE(line.find(path), std::string::npos) << line;
  EXPECT_NE(line.find("HDF5"), std::string::npos) << line;
  EXPECT_NE(line.find(cause), std::string::npos) << line;
  EXPECT_NE(line.find("removed"), std::string::npos) << line;
  EXPECT_EQ(r.text.substr(r.text.find('\n') + 1), "LEFT") << "files left behind";
}

// Class 7, a real full disk: a 256 KB tmpfs, mounted in a user and mount namespace of a forked
// child (no root needed; skipped where unprivileged namespaces are off). HDF5's write fails
// with ENOSPC inside record() or finish(); the trace must be abandoned with one error, its
// temporary file removed, and the process must survive HDF5's exit-time cleanup (before, the
// file was closed twice and the process died of SIGSEGV).
TEST(TraceFile, FullDiskAbandonsTheTraceCleanly) {
  const Config c = small_config();
  TempDir dir;
  const std::string mount_point = dir.file("small-disk");
  fs::create_directory(mount_point);
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  const ChildReport r = in_child(true, [&]() -> std::string {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      return std::string("SKIP unshare: ") + std::strerror(errno);
    auto write_file = [](const char* file, const std::string& text) {
      std::ofstream out(file);
      out << text;
      return bool(out.flush());
    };
    if (!write_file("/proc/self/setgroups", "deny") ||
        !write_file("/proc/self/uid_map", fmt::format("0 {} 1\n", uid)) ||
        !write_file("/proc/self/gid_map", fmt::format("0 {} 1\n", gid)))
      return "SKIP cannot map the user into the namespace";
    if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=256k") != 0)
      return std::string("SKIP mount: ") + std::strerror(errno);
    return write_until_refused(mount_point, c);
  });
  if (r.text.rfind("SKIP", 0) == 0) GTEST_SKIP() << "no small filesystem to fill: " << r.text;
  check_abandoned(r, mount_point + "/trace.h5", "No space left on device");
  std::printf("%s\n", r.text.substr(0, r.text.find('\n')).c_str());
}

// Class 7, a file size limit: RLIMIT_FSIZE at 64 KB with SIGXFSZ ignored (by default the signal
// kills the process), so writes past the limit fail with EFBIG inside HDF5. The limit applies
// to every regular file, the in-memory one the writer redirects an abandoned trace to included,
// so HDF5 cannot close the file here and its exit-time cleanup would crash: this child skips
// that cleanup, and the test checks the error line and that no file is left behind.
TEST(TraceFile, FileSizeLimitAbandonsTheTrace) {
  const Config c = small_config();
  TempDir dir;
  const std::string out_dir = dir.file("limited");
  fs::create_directory(out_dir);
  const ChildReport r = in_child(false, [&]() -> std::string {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return "FAIL setrlimit";
    return write_until_refused(out_dir, c);
  });
  check_abandoned(r, out_dir + "/trace.h5", "File too large");
  // errno's text, not HDF5's dump of the failed call (a -1 printed as an unsigned size).
  EXPECT_EQ(r.text.find("18446744073709551615"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("bytes actually written"), std::string::npos) << r.text;
}

// Class 8: the two traces of one run share a run id; the differ refuses a pair from two runs
// (a new reference beside an old candidate) and still pairs traces without one.
TEST(TraceFile, RunIdPairsTheTracesOfOneRun) {
  const Config c = small_config();
  TempDir dir;
  const std::string id = new_run_id();
  EXPECT_EQ(id.size(), 32u);
  EXPECT_TRUE(is_valid_run_id(id));
  EXPECT_NE(id, new_run_id());
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_FALSE(is_valid_run_id(""));
  EXPECT_FALSE(is_valid_run_id("run 1"));
  EXPECT_FALSE(is_valid_run_id(std::string(65, 'a')));

  auto traces = [&](const std::string& tag, const std::string& a_id, const std::string& b_id) {
    TraceMeta a = small_meta(c, "cpu-f32"), b = small_meta(c, "reference");
    a.run_id = a_id;
    b.run_id = b_id;
    const std::string a_path = dir.file(tag + "-candidate.h5"), b_path = dir.file(tag + "-reference.h5");
    write_small_trace(a_path, c, a);
    write_small_trace(b_path, c, b);
    return std::pair{a_path, b_path};
  };
  const Criterion criterion = Criterion::fixed(tolerance_profile("bf16"));

  const auto [a_same, b_same] = traces("same", id, id);
  EXPECT_EQ(TraceReader(a_same).meta().run_id, id);
  EXPECT_NO_THROW((void)diff_traces(TraceReader(a_same), TraceReader(b_same), criterion));

  const std::string other = new_run_id();
  const auto [a_stale, b_new] = traces("stale", other, id);
  expect_error(
      [&, &a_stale = a_stale, &b_new = b_new] {
        (void)diff_traces(TraceReader(a_stale), TraceReader(b_new), criterion);
      },
      {a_stale, b_new, "different runs", id, other});

  const auto [a_none, b_some] = traces("none", "", id);
  EXPECT_EQ(TraceReader(a_none).meta().run_id, "");
  EXPECT_NO_THROW((void)diff_traces(TraceReader(a_none), TraceReader(b_some), criterion));

  TraceMeta bad = small_meta(c, "reference");
  bad.run_id = "not a run id\n";
  const std::string bad_path = dir.file("bad.h5");
  expect_error([&] { TraceWriter w(bad_path, bad); }, {bad_path, "run_id"});
  // A malformed run_id in a file is refused by the reader too.
  const std::string forged = dir.file("forged.h5");
  fs::copy_file(b_same, forged);
  const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
  const std::string forged_id = "bad id\x1b[2J";
  replace_attr(forged, "/", "run_id", string_type(forged_id.size() + 1), scalar, forged_id.c_str());
  expect_error([&] { TraceReader r(forged); }, {forged, "run_id"});
}

// The writer refuses a meta whose config is not a gpt-oss config: its trace could not be read.
TEST(TraceFile, WriterRefusesAConfigThatIsNotGptOss) {
  TempDir dir;
  const std::string path = dir.file("no-config.h5");
  TraceMeta meta = small_meta(small_config(), "reference");
  meta.config = nlohmann::json::object();
  expect_error([&] { TraceWriter w(path, meta); }, {path, "not a gpt-oss config"});
  EXPECT_EQ(dir.count(), 0u);
}

// Class 9: groups track and index link creation order, so h5ls and h5py list positions, layers
// and stages in the order they ran (by name, pos_10 would come before pos_2).
TEST(TraceFile, GroupsKeepCreationOrder) {
  const Config c = small_config();
  TempDir dir;
  const std::string path = dir.file("ordered.h5");
  {
    TraceWriter w(path, small_meta(c, "cpu-f32"));
    for (int pos = 0; pos < 12; ++pos)
      walk_graph(c, [&](int layer, Stage s) {
        if (pos > 0 && layer != 0) return;
        w.record(key(c, pos, layer, s),
                 make_row(c, s, pos, is_decision(s) ? StageData::Type::I32 : StageData::Type::F32, 1));
      });
    w.finish();
  }
  auto names_in_creation_order = [&](const char* group) {
    std::vector<std::string> names;
    const Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    const Id g(H5Gopen2(f, group, H5P_DEFAULT), H5Gclose);
    const Id gcpl(H5Gget_create_plist(g), H5Pclose);
    unsigned flags = 0;
    H5Pget_link_creation_order(gcpl, &flags);
    EXPECT_EQ(flags, unsigned(H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED)) << group;
    hsize_t idx = 0;
    auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
      static_cast<std::vector<std::string>*>(out)->push_back(name);
      return 0;
    };
    EXPECT_GE(H5Literate(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, &names), 0) << group;
    return names;
  };
  std::vector<std::string> positions;
  for (int pos = 0; pos < 12; ++pos) positions.push_back(fmt::format("pos_{}", pos));
  EXPECT_EQ(names_in_creation_order("/"), positions);
  EXPECT_EQ(names_in_creation_order("/pos_0"), (std::vector<std::string>{"model", "layer_0", "layer_1"}));
  std::vector<std::string> layer0;
  walk_graph(c, [&](int layer, Stage s) {
    if (layer == 0) layer0.emplace_back(name(s));
  });
  EXPECT_EQ(names_in_creation_order("/pos_0/layer_0"), layer0);
  const TraceReader r(path);
  for (size_t i = 1; i < r.entries().size(); ++i)
    ASSERT_LE(std::tie(r.entries()[i - 1].key.position, r.entries()[i - 1].key.order),
              std::tie(r.entries()[i].key.position, r.entries()[i].key.order));
}



// A trace of two positions as a port's capture writes it: stage rows only, an att row in the
// NO_SINK layout.
void write_capture(const std::string& path, const Config& c) {
  TraceWriter w(path, small_meta(c, "my-port"));
  const auto real = StageData::Type::F32;
  for (int pos = 0; pos < 2; ++pos) {
    w.record(key(c, pos, kModelLayer, Stage::embedding), make_row(c, Stage::embedding, pos, real, 1));
    w.record(key(c, pos, 0, Stage::qkv), make_row(c, Stage::qkv, pos, real, 2));
    w.record(key(c, pos, 1, Stage::att), make_row(c, Stage::att, pos, real, 3), "NO_SINK");
  }
  w.finish();
}

// Copies `path` to a new file of `dir` and applies `edit` to it through the HDF5 C API.
template <typename F>
std::string edited_copy(const TempDir& dir, const std::string& path, const std::string& tag, F&& edit) {
  const std::string copy = dir.file(tag + ".h5");
  fs::copy_file(path, copy);
  const Id f(H5Fopen(copy.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  EXPECT_GE(f.id, 0) << copy;
  edit(hid_t(f));
  return copy;
}

// Class 11: what a capture is. parity-trace --candidate-trace read a capture with a junk
// dataset, the series parity-trace itself computes (/replay, /magnitude), an order that is not
// its stage's, or 2,000 empty position groups as if it were sound. A capture holds its stage
// rows and KV-cache rows only; every trace holds no empty group and orders its rows as they ran.
TEST(TraceFile, CapturesHoldTheirRowsAndNothingElse) {
  const Config c = small_config();
  TempDir dir;
  const std::string good = dir.file("capture.h5");
  write_capture(good, c);
  {
    const TraceReader r(good, TraceKind::capture);
    EXPECT_EQ(r.entries().size(), 6u);
    EXPECT_EQ(r.layout("/pos_1/layer_1/att"), "NO_SINK");
  }

  // Users may annotate a trace; a capture is what the port recorded and nothing more.
  const std::string junk = edited_copy(dir, good, "junk", [](hid_t f) {
    const Id space = simple_space({3});
    const Id ds(H5Dcreate2(f, "/junk", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    ASSERT_GE(ds.id, 0);
  });
  EXPECT_NO_THROW(TraceReader r(junk));
  expect_error([&] { TraceReader r(junk, TraceKind::capture); }, {junk, "/junk", "not part of a capture"});

  // The series parity-trace computes are its own: a port never records them.
  for (const std::string series : {"replay", "magnitude", "recompute"}) {
    const std::string path = edited_copy(dir, good, series, [&](hid_t f) {
      const Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
      ASSERT_GE(H5Pset_create_intermediate_group(lcpl, 1), 0);
      const std::string to = "/" + series + "/pos_0/model/embedding";
      ASSERT_GE(H5Ocopy(f, "/pos_0/model/embedding", f, to.c_str(), H5P_DEFAULT, lcpl), 0);
    });
    expect_error([&] { TraceReader r(path, TraceKind::capture); },
                 {path, "/" + series, "not part of a capture", "parity-trace computes"});
  }

  // Empty groups: 2,000 positions without a row, a layer group without one, an empty /cache.
  const std::string empty_positions = edited_copy(dir, good, "empty-positions", [](hid_t f) {
    for (int p = 2; p < 2002; ++p) {
      const Id g(H5Gcreate2(f, fmt::format("/pos_{}", p).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      ASSERT_GE(g.id, 0);
    }
  });
  for (TraceKind kind : {TraceKind::trace, TraceKind::capture})
    expect_error([&] { TraceReader r(empty_positions, kind); }, {empty_positions, "/pos_", "an empty group"});
  const std::string empty_layer = edited_copy(dir, good, "empty-layer", [](hid_t f) {
    ASSERT_GE(H5Ldelete(f, "/pos_0/layer_1/att", H5P_DEFAULT), 0);
  });
  expect_error([&] { TraceReader r(empty_layer); }, {empty_layer, "/pos_0/layer_1", "an empty group"});
  const std::string empty_cache = edited_copy(dir, good, "empty-cache", [](hid_t f) {
    const Id g(H5Gcreate2(f, "/cache", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ASSERT_GE(g.id, 0);
  });
  expect_error([&] { TraceReader r(empty_cache, TraceKind::capture); }, {empty_cache, "/cache", "an empty group"});

  // An order that is not its stage's would reorder the rows, and so move the first divergence.
  const Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
  for (const int32_t order : {99, -1, execution_order(c, 0, Stage::attn_norm)}) {
    const std::string path = dir.file(fmt::format("order{}.h5", order));
    fs::copy_file(good, path);
    replace_attr(path, "/pos_0/layer_0/qkv", "order", H5T_STD_I32LE, scalar, &order);
    expect_error([&] { TraceReader r(path); },
                 {path, "/pos_0/layer_0/qkv", fmt::format("order={}", order),
                  fmt::format("runs as number {}", execution_order(c, 0, Stage::qkv))});
  }

  // A layout must be one of the port layouts of its stage.
  int layout_files = 0;
  for (const auto& [ds, layout, says] :
       {std::tuple{"/pos_0/layer_0/qkv", "NO_SINK", "not a layout of stage qkv"},
        std::tuple{"/pos_0/layer_1/att", "NO_SINK|JUNK", "\"JUNK\" is not a layout of stage att"},
        std::tuple{"/pos_0/layer_1/att", "SINK_FIRST|NO_SINK", "exclude each other"},
        std::tuple{"/pos_0/layer_1/att", "NO_SINK|NO_SINK", "named twice"},
        std::tuple{"/pos_0/layer_1/att", "", "not a layout"}}) {
    const std::string path = dir.file(fmt::format("layout{}.h5", layout_files++));
    fs::copy_file(good, path);
    const std::string text = layout;
    replace_attr(path, ds, "layout", string_type(text.size() + 1), scalar, text.c_str());
    expect_error([&] { TraceReader r(path); }, {path, ds, "layout", says});
  }
}

}  // namespace
}  // namespace parity
