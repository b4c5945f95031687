// Tests of the HDF5 trace files: round trip of all dtypes and metadata, layout and attributes as
// h5py/h5dump users see them, entry ordering, atomic writes, and the reader refusing files that
// are not traces.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "model/error.h"
#include "tests/test_util.h"
#include "tracer/trace_file.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

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

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() / fmt::format("parity-trace-test-{}-{}", ::getpid(), counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t count() const {
    return size_t(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
  }

 private:
  fs::path path_;
};

// Expects body to throw parity::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected parity::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
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
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  TraceWriter w(path, small_meta(c, "reference"));
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

TEST(TraceFile, ReaderRefusesHdf5FilesThatAreNotTraces) {
  TempDir dir;
  const std::string plain = dir.file("plain.h5");
  {
    H5::H5File f(plain, H5F_ACC_TRUNC);
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
    H5::H5File f(path, H5F_ACC_TRUNC);
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

}  // namespace
}  // namespace parity
