// safetensors reading (model/safetensors.h) on files written byte by byte here (8-byte
// little-endian header length, JSON header, data), sharded checkpoints through
// model.safetensors.index.json, every malformed case the reader must refuse with one line naming
// the file, and the checkpoint binding (model/checkpoint.h) on a synthetic tiny checkpoint that
// is then corrupted: wrong shape, wrong dtype, missing tensor, scale byte 255, layers or tensors
// the config does not have. Untrusted input never crashes, hangs or over-allocates: deep JSON,
// 1e400, huge names, FIFOs and devices, index entries naming files outside the directory.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/numerics.h"
#include "model/synth.h"
#include "tests/test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::expect_prompt_refusal;
using test::nested_arrays;
using nlohmann::json;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A safetensors file: the header as given (no padding unless the caller adds it), then data.
std::string st_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}
std::string st_bytes(const json& header, const std::string& data) {
  return st_bytes(header.dump(), data);
}

json entry(const std::string& dtype, std::vector<int64_t> shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

std::string write_st(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = (fs::path(dir) / name).string();
  write_file(path, bytes);
  return path;
}


// Runs `f` and expects a parity::Error per expect_message.
void expect_error(const std::function<void()>& f, const std::string& where,
                  std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << where;
  } catch (const Error& e) {
    test::expect_message(e.what(), where, fragments);
  }
}

void expect_file_refused(const std::string& bytes, std::initializer_list<std::string> fragments) {
  const std::string path = write_st(test::temp_dir("st-bad"), "bad.safetensors", bytes);
  expect_error([&] { SafetensorsFile f(path); }, path, fragments);
}

// ---- A valid single file ---------------------------------------------------------------------

struct ValidFile {
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x3f00,
                                0x4049, 0x8000, 0x7f7f};  // 1 -2 .5 3.140625 -0 max
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x3555};   // 1 -2 0.333...
  std::vector<float> f32 = {1.5f, -2.25f, 1e-3f, 3e38f};
  std::vector<uint8_t> u8 = {0, 1, 254, 255};
  std::vector<float> scalar = {42.0f};
  json header;
  std::string data;

  // Data laid out in an order other than the header's (u8, f32, bf16, scalar, f16), so offsets
  // are honoured rather than assumed.
  explicit ValidFile(size_t header_pad = 0) {
    std::map<std::string, std::pair<size_t, size_t>> at;
    auto put = [&](const std::string& name, const std::string& b) {
      at[name] = {data.size(), data.size() + b.size()};
      data += b;
    };
    put("u8", bytes_of(u8));
    put("f32", bytes_of(f32));
    put("bf16", bytes_of(bf16));
    put("scalar", bytes_of(scalar));
    put("f16", bytes_of(f16));
    header = {{"__metadata__", {{"format", "pt"}, {"note", "hand-written"}}},
              {"bf16", entry("BF16", {2, 3}, at["bf16"].first, at["bf16"].second)},
              {"f16", entry("F16", {3}, at["f16"].first, at["f16"].second)},
              {"f32", entry("F32", {2, 2}, at["f32"].first, at["f32"].second)},
              {"u8", entry("U8", {4}, at["u8"].first, at["u8"].second)},
              {"scalar", entry("F32", {}, at["scalar"].first, at["scalar"].second)},
              {"empty", entry("BF16", {0, 5}, data.size(), data.size())}};
    std::string h = header.dump();
    h.append(header_pad, ' ');  // trailing spaces are valid JSON padding
    bytes = st_bytes(h, data);
  }
  std::string bytes;
};

void check_valid(const SafetensorsFile& f, const ValidFile& v) {
  ASSERT_EQ(f.tensors().size(), 6u);  // __metadata__ is not a tensor
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hand-written");

  const TensorView& b = f.tensors().at("bf16");
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.shape_str(), "[2, 3]");
  EXPECT_EQ(b.numel(), 6);
  EXPECT_EQ(b.nbytes, 12u);
  EXPECT_EQ(b.file, f.path());
  std::vector<double> got(6);
  read_vector(b, got.data());
  EXPECT_EQ(got, (std::vector<double>{1, -2, 0.5, 3.140625, -0.0, 0x1.fep127}));
  EXPECT_TRUE(std::signbit(got[4]));
  double row[3];
  read_row(b, 1, 3, row);
  EXPECT_EQ(row[0], 3.140625);
  EXPECT_EQ(row[2], 0x1.fep127);

  const TensorView& h = f.tensors().at("f16");
  EXPECT_EQ(h.dtype, DType::F16);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3}));
  float hf[3];
  read_vector(h, hf);
  EXPECT_EQ(hf[0], 1.0f);
  EXPECT_EQ(hf[1], -2.0f);
  EXPECT_EQ(hf[2], 0x1.554p-2f);

  const TensorView& s = f.tensors().at("f32");
  EXPECT_EQ(s.dtype, DType::F32);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{2, 2}));
  std::vector<double> sf(4);
  read_vector(s, sf.data());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sf[i], double(v.f32[i])) << i;

  const TensorView& u = f.tensors().at("u8");
  EXPECT_EQ(u.dtype, DType::U8);
  EXPECT_EQ(u.nbytes, 4u);
  EXPECT_EQ(std::vector<uint8_t>(u.data, u.data + 4), v.u8);

  const TensorView& sc = f.tensors().at("scalar");
  EXPECT_TRUE(sc.shape.empty());
  EXPECT_EQ(sc.numel(), 1);
  double x;
  read_vector(sc, &x);
  EXPECT_EQ(x, 42.0);

  const TensorView& e = f.tensors().at("empty");
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes, 0u);
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  const ValidFile v;
  const std::string path = write_st(test::temp_dir("st"), "one.safetensors", v.bytes);
  const SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  check_valid(f, v);
}

TEST(Safetensors, DataAtAnOddAddressReadsTheSameValues) {
  // 8 + header length odd: every BF16/F16/F32 element is misaligned in the mapping.
  ValidFile v;
  const size_t pad = (8 + v.header.dump().size()) % 2 == 0 ? 1 : 0;
  const ValidFile odd(pad);
  const std::string path = write_st(test::temp_dir("st"), "odd.safetensors", odd.bytes);
  const SafetensorsFile f(path);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(f.tensors().at("bf16").data) % 2, 1u);
  check_valid(f, odd);
}

TEST(Safetensors, TensorStoreReadsASingleFileAndNamesMissingTensors) {
  const std::string dir = test::temp_dir("st-store");
  write_st(dir, "model.safetensors", ValidFile().bytes);
  write_st(dir, "ignored.safetensors", "not read: model.safetensors takes precedence");
  const TensorStore s(dir);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"bf16", "empty", "f16", "f32", "scalar", "u8"}));
  EXPECT_TRUE(s.has("f16"));
  EXPECT_FALSE(s.has("nope"));
  EXPECT_EQ(s.find("nope"), nullptr);
  EXPECT_EQ(s.get("u8").nbytes, 4u);
  expect_error([&] { s.get("model.norm.weight"); }, dir, {"missing tensor", "model.norm.weight"});
}

// ---- Sharded checkpoints ---------------------------------------------------------------------

// Two shards: a.safetensors holds x (F32 [2]) and y (BF16 [1]); b.safetensors holds z (U8 [3]).
std::string write_two_shards(const std::string& dir) {
  write_st(
      dir, "a.safetensors",
      st_bytes(json{{"x", entry("F32", {2}, 0, 8)}, {"y", entry("BF16", {1}, 8, 10)}},
               bytes_of(std::vector<float>{1.0f, 2.0f}) + bytes_of(std::vector<uint16_t>{0x4040})));
  write_st(dir, "b.safetensors",
           st_bytes(json{{"z", entry("U8", {3}, 0, 3)}}, std::string("\x07\x08\x09", 3)));
  return dir;
}

void write_index(const std::string& dir, const json& weight_map) {
  write_file((fs::path(dir) / "model.safetensors.index.json").string(),
             json{{"metadata", {{"total_size", 13}}}, {"weight_map", weight_map}}.dump());
}

TEST(Safetensors, ShardedThroughTheIndex) {
  const std::string dir = write_two_shards(test::temp_dir("st-shards"));
  write_st(dir, "stray.safetensors", "not listed in the index, so never opened");
  write_index(dir, {{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}});
  const TensorStore s(dir);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(s.get("z").file, (fs::path(dir) / "b.safetensors").string());
  EXPECT_EQ(s.get("x").file, (fs::path(dir) / "a.safetensors").string());
  float x[2];
  read_vector(s.get("x"), x);
  EXPECT_EQ(x[1], 2.0f);
  double y;
  read_vector(s.get("y"), &y);
  EXPECT_EQ(y, 3.0);
  EXPECT_EQ(s.get("z").data[2], 9);
  EXPECT_EQ(s.fingerprint().rfind("xxh3-128:", 0), 0u);
  EXPECT_EQ(s.fingerprint().size(), 9u + 32u);
}

TEST(Safetensors, TheIndexDecidesWhichTensorsExist) {
  // y is in a shard but not in the weight map: not exposed.
  const std::string dir = write_two_shards(test::temp_dir("st-shards"));
  write_index(dir, {{"x", "a.safetensors"}, {"z", "b.safetensors"}});
  const TensorStore s(dir);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "z"}));
}

TEST(Safetensors, WithoutIndexEverySafetensorsFileIsRead) {
  const TensorStore s(write_two_shards(test::temp_dir("st-noindex")));
  EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(SafetensorsErrors, IndexProblems) {
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_index(dir, {{"x", "a.safetensors"}, {"z", "c.safetensors"}});
    expect_error([&] { TensorStore s(dir); }, "model.safetensors.index.json",
                 {"c.safetensors", "missing"});
  }
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_index(dir, {{"x", "a.safetensors"}, {"z", "a.safetensors"}});  // z lives in b
    expect_error([&] { TensorStore s(dir); }, dir, {"\"z\"", "a.safetensors", "does not hold"});
  }
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_index(dir, {{"x", "a.safetensors"}, {"nowhere", "b.safetensors"}});
    expect_error([&] { TensorStore s(dir); }, dir, {"nowhere", "b.safetensors"});
  }
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_file((fs::path(dir) / "model.safetensors.index.json").string(), "{\"weight_map\": {");
    expect_error([&] { TensorStore s(dir); }, "model.safetensors.index.json", {"not valid JSON"});
  }
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_file((fs::path(dir) / "model.safetensors.index.json").string(), "{\"metadata\": {}}");
    expect_error([&] { TensorStore s(dir); }, "model.safetensors.index.json", {"weight_map"});
  }
  {
    const std::string dir = write_two_shards(test::temp_dir("st-index"));
    write_index(dir, {{"x", 5}});
    expect_error([&] { TensorStore s(dir); }, "model.safetensors.index.json", {"\"x\""});
  }
  {
    // Without an index, a tensor in two files is ambiguous.
    const std::string dir = write_two_shards(test::temp_dir("st-dup"));
    write_st(dir, "c.safetensors", st_bytes(json{{"z", entry("U8", {1}, 0, 1)}}, "\x01"));
    expect_error([&] { TensorStore s(dir); }, dir, {"\"z\"", "more than one file"});
  }
  {
    const std::string dir = test::temp_dir("st-empty");
    expect_error([&] { TensorStore s(dir); }, dir, {"no model.safetensors"});
    expect_error([&] { TensorStore s(dir + "/absent"); }, dir + "/absent", {"not a directory"});
  }
}

// ---- Malformed files -------------------------------------------------------------------------

TEST(SafetensorsErrors, MissingFile) {
  const std::string path = test::temp_dir("st-missing") + "/none.safetensors";
  expect_error([&] { SafetensorsFile f(path); }, path, {"cannot open"});
}

TEST(SafetensorsErrors, ShorterThanTheHeaderLength) {
  expect_file_refused("", {"truncated"});
  expect_file_refused(std::string("\x10\x00\x00", 3), {"truncated"});
  expect_file_refused(std::string(7, '\0'), {"truncated"});
}

TEST(SafetensorsErrors, HeaderLengthPastTheEnd) {
  const std::string h = json{{"x", entry("U8", {1}, 0, 1)}}.dump();
  expect_file_refused(le64(h.size() + 2) + h + "\x01",
                      {"header length", std::to_string(h.size() + 2)});
  expect_file_refused(le64(100) + "{}", {"header length 100"});
  // The whole file cut in the middle of its header.
  const std::string whole = st_bytes(h, "\x01");
  expect_file_refused(whole.substr(0, 20), {"header length"});
}

TEST(SafetensorsErrors, AbsurdHeaderLength) {
  expect_file_refused(le64(uint64_t(1) << 60) + "{}",
                      {"header length", std::to_string(uint64_t(1) << 60)});
  expect_file_refused(le64(~uint64_t(0)) + "{}", {"header length"});
  // Exactly one byte more than is there: the off-by-one of a `>=` check.
  expect_file_refused(le64(3) + "{}", {"header length 3"});
}

TEST(SafetensorsErrors, HeaderIsNotValidJson) {
  expect_file_refused(st_bytes(std::string("{\"x\": {\"dtype\": \"U8\""), "\x01"),
                      {"not valid JSON"});
  expect_file_refused(st_bytes(std::string("[1, 2]"), ""), {"not a JSON object"});
  expect_file_refused(st_bytes(std::string(""), "abc"), {"not valid JSON"});
  // The header length cuts a valid header short: the data bytes are not read as JSON.
  const std::string h = json{{"x", entry("U8", {2}, 0, 2)}}.dump();
  expect_file_refused(le64(h.size() - 1) + h + "\x01\x02", {"not valid JSON"});
}

TEST(SafetensorsErrors, MalformedEntries) {
  expect_file_refused(st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", {1}}}}}, "\x01"),
                      {"\"x\"", "data_offsets"});
  expect_file_refused(st_bytes(json{{"x", 5}}, ""), {"\"x\""});
  expect_file_refused(
      st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", 1}, {"data_offsets", {0, 1}}}}}, "\x01"),
      {"\"x\"", "shape"});
  expect_file_refused(st_bytes(json{{"x", entry("U8", {-1}, 0, 1)}}, "\x01"), {"\"x\"", "shape"});
  expect_file_refused(
      st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", {1.5}}, {"data_offsets", {0, 1}}}}}, "\x01"),
      {"\"x\"", "shape"});
  expect_file_refused(
      st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0}}}}}, "\x01"),
      {"\"x\"", "data_offsets"});
  expect_file_refused(
      st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {-1, 0}}}}}, "\x01"),
      {"\"x\"", "data_offsets"});
  expect_file_refused(
      st_bytes(json{{"x", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {"0", "1"}}}}},
               "\x01"),
      {"\"x\"", "data_offsets"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  for (const json& dt : {json("F8_E4M3"), json("bf16"), json("Q4"), json(16)})
    expect_file_refused(
        st_bytes(json{{"w", {{"dtype", dt}, {"shape", {2}}, {"data_offsets", {0, 2}}}}},
                 "\x01\x02"),
        {"\"w\"", "dtype", dt.dump()});
}

TEST(SafetensorsErrors, OffsetsPastTheEnd) {
  expect_file_refused(st_bytes(json{{"w", entry("F32", {2}, 0, 8)}}, std::string(7, '\0')),
                      {"\"w\"", "past the end", "7 bytes"});
  expect_file_refused(st_bytes(json{{"w", entry("U8", {1}, 100, 101)}}, std::string(8, '\0')),
                      {"\"w\"", "past the end"});
  // Offsets so large that begin + size would wrap around.
  expect_file_refused(
      st_bytes(json{{"w", entry("U8", {2}, ~uint64_t(0) - 1, ~uint64_t(0))}}, std::string(8, '\0')),
      {"\"w\""});
  // End before begin.
  expect_file_refused(st_bytes(json{{"w", entry("U8", {0}, 4, 2)}}, std::string(8, '\0')),
                      {"\"w\""});
}

TEST(SafetensorsErrors, SizeDoesNotMatchDtypeTimesShape) {
  expect_file_refused(st_bytes(json{{"w", entry("BF16", {2, 3}, 0, 10)}}, std::string(16, '\0')),
                      {"\"w\"", "10 bytes", "BF16 [2, 3]", "12"});
  expect_file_refused(st_bytes(json{{"w", entry("F32", {3}, 0, 16)}}, std::string(16, '\0')),
                      {"\"w\"", "F32 [3]", "12"});
  expect_file_refused(st_bytes(json{{"w", entry("U8", {}, 0, 0)}}, std::string(16, '\0')),
                      {"\"w\"", "needs 1"});
}

TEST(SafetensorsErrors, ShapeWhoseElementCountOverflows) {
  // 2^32 * 2^32 elements wraps a 64-bit count to 0, which would match empty offsets.
  const int64_t big = int64_t(1) << 32;
  expect_file_refused(st_bytes(json{{"w", entry("U8", {big, big}, 0, 0)}}, std::string(8, '\0')),
                      {"\"w\""});
  expect_file_refused(
      st_bytes(json{{"w", entry("F32", {int64_t(1) << 62}, 0, 0)}}, std::string(8, '\0')),
      {"\"w\""});
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  expect_file_refused(st_bytes(json{{"a", entry("U8", {4}, 0, 4)}, {"b", entry("U8", {4}, 2, 6)}},
                               std::string(8, '\0')),
                      {"overlap", "\"a\"", "\"b\""});
  expect_file_refused(  // the same range twice
      st_bytes(json{{"a", entry("F32", {1}, 4, 8)}, {"b", entry("F32", {1}, 4, 8)}},
               std::string(8, '\0')),
      {"overlap"});
  expect_file_refused(  // one range inside another, a third beside them
      st_bytes(json{{"a", entry("U8", {8}, 0, 8)},
                    {"b", entry("U8", {2}, 3, 5)},
                    {"c", entry("U8", {2}, 8, 10)}},
               std::string(10, '\0')),
      {"overlap"});
  // Touching ranges are fine.
  const std::string path =
      write_st(test::temp_dir("st"), "touch.safetensors",
               st_bytes(json{{"a", entry("U8", {4}, 0, 4)}, {"b", entry("U8", {4}, 4, 8)}},
                        std::string(8, '\0')));
  EXPECT_EQ(SafetensorsFile(path).tensors().size(), 2u);
}

// ---- Untrusted headers ------------------------------------------------------------------------

// A header of one U8 [1] tensor "w" whose `field` is written as `value` (raw JSON text).
std::string header_with(const std::string& field, const std::string& value) {
  json fields = {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}};
  fields.erase(field);
  std::string entry_text = fields.dump();
  entry_text.insert(1, "\"" + field + "\": " + value + (fields.empty() ? "" : ", "));
  return "{\"w\": " + entry_text + "}";
}

TEST(SafetensorsErrors, DeepNestingInAHeaderIsRefusedNotRecursed) {
  // A 100,000-deep dtype overflowed the stack (in the error message's dump, in a comparison).
  const std::string deep = nested_arrays(100000);
  for (const std::string field : {"dtype", "shape", "data_offsets"})
    expect_file_refused(st_bytes(header_with(field, deep), "\x01"), {"(header)", "nested deeper"});
  expect_file_refused(st_bytes("{\"__metadata__\": {\"x\": " + deep + "}}", ""),
                      {"nested deeper"});
  // 64 levels are what parse_json allows: a dtype nested 60 deep is parsed, then refused as a
  // dtype, with the value cut short in the message.
  expect_file_refused(st_bytes(header_with("dtype", nested_arrays(60)), "\x01"),
                      {"\"w\"", "unsupported dtype", "more bytes"});
}

TEST(SafetensorsErrors, NumberOutOfRangeInAHeaderNamesTheFile) {
  expect_file_refused(st_bytes(header_with("shape", "[1e400]"), "\x01"),
                      {"(header)", "out of range"});
  expect_file_refused(st_bytes(header_with("data_offsets", "[0, -1e400]"), "\x01"),
                      {"out of range"});
  expect_file_refused(st_bytes(std::string("{\"__metadata__\": {\"n\": 1e400}}"), ""),
                      {"out of range"});
}

TEST(SafetensorsErrors, HugeNamesAndValuesAreNotEchoedWhole) {
  const std::string big(100000, 'n');
  expect_file_refused(st_bytes(json{{big, entry("Q4", {1}, 0, 1)}}, "\x01"),
                      {"unsupported dtype", "more bytes"});
  expect_file_refused(st_bytes(json{{"w", entry(big, {1}, 0, 1)}}, "\x01"),
                      {"\"w\"", "unsupported dtype", "more bytes"});
  json many = json::array();
  for (int i = 0; i < 100000; ++i) many.push_back(-1);
  expect_file_refused(st_bytes(header_with("shape", many.dump()), "\x01"),
                      {"\"w\"", "100000 elements"});
  const std::string a(5000, 'a'), b(5000, 'b');
  expect_file_refused(st_bytes(json{{a, entry("U8", {4}, 0, 4)}, {b, entry("U8", {4}, 2, 6)}},
                               std::string(8, '\0')),
                      {"overlap", "more bytes"});
  // Control characters in a name are escaped: the message stays one line on a terminal.
  expect_file_refused(st_bytes(json{{"w\n\x1b[2J", entry("Q4", {1}, 0, 1)}}, "\x01"),
                      {"\"w\\n\\x1b[2J\""});
}

TEST(SafetensorsErrors, ShapesWhoseProductsOverflow) {
  const int64_t big = int64_t(1) << 62;
  // No elements, but dim(1) * dim(2) would overflow for a reader that multiplies them.
  expect_file_refused(st_bytes(json{{"w", entry("U8", {0, big, big}, 0, 0)}}, std::string(8, '\0')),
                      {"\"w\"", "overflows"});
  // A dimension beyond int64.
  expect_file_refused(
      st_bytes(header_with("shape", "[9223372036854775808]"), "\x01"), {"\"w\"", "bad shape"});
  const int64_t b31 = int64_t(1) << 31;
  expect_file_refused(
      st_bytes(json{{"w", entry("BF16", {b31, b31, b31}, 0, 0)}}, std::string(8, '\0')),
      {"\"w\"", "overflows"});
  // Elements that fit but bytes that do not: 2^62 F64.
  expect_file_refused(st_bytes(json{{"w", entry("F64", {big}, 0, 0)}}, std::string(8, '\0')),
                      {"\"w\"", "byte size overflows"});
}

TEST(SafetensorsErrors, HeaderLengthOverTheCapInALongEnoughFile) {
  // A (sparse) file long enough to hold the declared header: refused by the cap, unparsed.
  const uint64_t len = SafetensorsFile::kMaxHeaderBytes + 1;
  const std::string path = write_st(test::temp_dir("st-cap"), "big.safetensors", le64(len) + "{");
  fs::resize_file(path, 8 + len + 16);
  expect_error([&] { SafetensorsFile f(path); }, path, {"header length", std::to_string(len)});
}

// ---- Special files and paths -------------------------------------------------------------------

std::string make_fifo(const std::string& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path << ": " << std::strerror(errno);
  return path;
}

TEST(SafetensorsErrors, SpecialFilesAreRefusedPromptly) {
  const std::string index_name = "model.safetensors.index.json";
  {  // opened directly
    const std::string fifo = make_fifo(test::temp_dir("st-fifo") + "/x.safetensors");
    expect_prompt_refusal([&] { SafetensorsFile f(fifo); }, fifo, fifo, {"not a regular file"});
  }
  {  // the single-file checkpoint
    const std::string dir = test::temp_dir("st-fifo");
    const std::string fifo = make_fifo(dir + "/model.safetensors");
    expect_prompt_refusal([&] { TensorStore s(dir); }, fifo, fifo, {"not a regular file"});
  }
  {  // a shard the index names
    const std::string dir = write_two_shards(test::temp_dir("st-fifo"));
    const std::string fifo = make_fifo(dir + "/c.safetensors");
    write_index(dir, {{"x", "a.safetensors"}, {"z", "c.safetensors"}});
    expect_prompt_refusal([&] { TensorStore s(dir); }, fifo, fifo, {"not a regular file"});
  }
  {  // the index itself
    const std::string dir = write_two_shards(test::temp_dir("st-fifo"));
    const std::string fifo = make_fifo(dir + "/" + index_name);
    expect_prompt_refusal([&] { TensorStore s(dir); }, fifo, fifo, {"not a regular file"});
  }
  {  // found by the directory scan (no index, no model.safetensors)
    const std::string dir = write_two_shards(test::temp_dir("st-fifo"));
    const std::string fifo = make_fifo(dir + "/c.safetensors");
    expect_prompt_refusal([&] { TensorStore s(dir); }, fifo, fifo, {"not a regular file"});
  }
  {  // devices: /dev/zero as the model and as the index
    const std::string dir = test::temp_dir("st-zero");
    fs::create_symlink("/dev/zero", dir + "/model.safetensors");
    expect_prompt_refusal([&] { TensorStore s(dir); }, "", dir + "/model.safetensors",
                          {"not a regular file"});
    fs::create_symlink("/dev/zero", dir + "/" + index_name);
    expect_prompt_refusal([&] { TensorStore s(dir); }, "", index_name, {"not a regular file"});
  }
  {  // a directory where the model should be
    const std::string dir = test::temp_dir("st-dir");
    fs::create_directory(dir + "/model.safetensors");
    expect_prompt_refusal([&] { TensorStore s(dir); }, "", dir + "/model.safetensors",
                          {"not a regular file"});
  }
  {  // an index larger than any index (sparse): refused by its size, unread
    const std::string dir = write_two_shards(test::temp_dir("st-bigindex"));
    write_index(dir, {{"x", "a.safetensors"}});
    fs::resize_file(dir + "/" + index_name, TensorStore::kMaxIndexBytes + 1);
    expect_prompt_refusal([&] { TensorStore s(dir); }, "", index_name,
                          {std::to_string(TensorStore::kMaxIndexBytes + 1)});
  }
}

TEST(SafetensorsErrors, IndexProblemsOfUntrustedJson) {
  const std::string index_name = "model.safetensors.index.json";
  const std::string dir = write_two_shards(test::temp_dir("st-index-json"));
  const std::string index = dir + "/" + index_name;
  write_file(index, "{\"weight_map\": " + nested_arrays(100000) + "}");
  expect_error([&] { TensorStore s(dir); }, index, {"nested deeper"});
  write_file(index,
             "{\"metadata\": {\"total_size\": 1e400}, \"weight_map\": {\"x\": \"a.safetensors\"}}");
  expect_error([&] { TensorStore s(dir); }, index, {"out of range"});
  write_index(dir, json::object());
  expect_error([&] { TensorStore s(dir); }, index, {"names no tensors"});
  write_file(index, "[]");
  expect_error([&] { TensorStore s(dir); }, index, {"weight_map"});
  // A huge tensor name in an entry that is not a file name: cut short.
  write_index(dir, {{std::string(100000, 't'), json::array()}});
  expect_error([&] { TensorStore s(dir); }, index, {"not a file name", "more bytes"});
}

TEST(SafetensorsErrors, IndexCannotNameFilesOutsideTheDirectory) {
  // A valid shard outside the checkpoint directory holding x: were it opened, the load would
  // succeed.
  const std::string parent = test::temp_dir("st-escape");
  write_st(parent, "outside.safetensors",
           st_bytes(json{{"x", entry("F32", {2}, 0, 8)}}, bytes_of(std::vector<float>{1, 2})));
  const std::string dir = (fs::path(parent) / "ckpt").string();
  fs::create_directory(dir);
  write_two_shards(dir);
  fs::create_directory(dir + "/sub");
  write_st(dir + "/sub", "a.safetensors",
           st_bytes(json{{"x", entry("F32", {2}, 0, 8)}}, bytes_of(std::vector<float>{1, 2})));
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string names[] = {"../outside.safetensors",
                               parent + "/outside.safetensors",
                               "sub/a.safetensors",
                               "./a.safetensors",
                               "..",
                               ".",
                               "",
                               std::string("a.safetensors\0.x", 16),
                               std::string(300, 'a')};
  for (const std::string& name : names) {
    write_index(dir, {{"x", name}, {"z", "b.safetensors"}});
    SCOPED_TRACE(name);
    expect_error([&] { TensorStore s(dir); }, index, {"not a plain file name", "\"x\""});
  }
  // The same shard by its plain name is read.
  write_index(dir, {{"x", "a.safetensors"}, {"z", "b.safetensors"}});
  EXPECT_EQ(TensorStore(dir).names(), (std::vector<std::string>{"x", "z"}));
}

// ---- Checkpoint binding ----------------------------------------------------------------------

// A fresh copy of the tiny synthetic checkpoint (2 shards + index) to corrupt.
std::string tiny_copy(const std::string& tag) {
  const std::string dir = test::temp_dir(tag);
  write_synthetic_checkpoint(synth_preset("tiny"), dir, false);
  return dir;
}

// The shard holding `tensor`, per the index.
std::string shard_of(const std::string& dir, const std::string& tensor) {
  std::ifstream in(fs::path(dir) / "model.safetensors.index.json");
  return (fs::path(dir) / json::parse(in)["weight_map"][tensor].get<std::string>()).string();
}

struct Tensor {
  SafetensorsWriter::Decl decl;
  std::string bytes;
};

// Rewrites one shard through `edit`, which may change, drop or add tensors; keeps the index in
// step with the tensors the shard then holds unless `update_index` is false.
void rewrite_shard(const std::string& dir, const std::string& path,
                   const std::function<void(std::vector<Tensor>&)>& edit,
                   bool update_index = true) {
  std::vector<Tensor> ts;
  std::vector<std::string> before;
  {
    const SafetensorsFile f(path);
    for (const auto& [name, v] : f.tensors()) {
      ts.push_back(
          {{name, v.dtype, v.shape}, std::string(reinterpret_cast<const char*>(v.data), v.nbytes)});
      before.push_back(name);
    }
  }
  edit(ts);
  std::vector<SafetensorsWriter::Decl> decls;
  for (const auto& t : ts) decls.push_back(t.decl);
  {
    SafetensorsWriter w(path, decls);
    for (const auto& t : ts) w.write(t.bytes.data(), t.bytes.size());
    w.finish();
  }
  if (!update_index) return;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::ifstream in(index);
  json j = json::parse(in);
  in.close();
  for (const auto& n : before) j["weight_map"].erase(n);
  for (const auto& t : ts) j["weight_map"][t.decl.name] = fs::path(path).filename().string();
  write_file(index.string(), j.dump());
}

Tensor& find_tensor(std::vector<Tensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.decl.name == name) return t;
  throw std::runtime_error("test setup: no tensor " + name);
}

TEST(SafetensorsCheckpoint, TinyLoadsAndReadsExactly) {
  const auto m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
  EXPECT_EQ(m->expert_layout, ExpertLayout::Mxfp4);
  ASSERT_EQ(m->layers.size(), size_t(c.num_hidden_layers));
  EXPECT_EQ(m->embed->shape, (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  EXPECT_EQ(m->lm_head.weight->shape, (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  EXPECT_EQ(m->lm_head.bias, nullptr);
  EXPECT_FALSE(m->fingerprint.empty());
}

TEST(SafetensorsCheckpoint, F32AndF16TensorsBindAndReadTheSameValues) {
  // A checkpoint whose final norm is F32 and whose sinks of layer 0 are F16 (every BF16 value
  // of these small magnitudes is exact in F16) reads the same numbers.
  const std::string dir = tiny_copy("ckpt-dtypes");
  const auto orig = Model::load(dir);
  const int H = orig->config.hidden_size, nH = orig->config.num_attention_heads;
  std::vector<double> norm(static_cast<size_t>(H)), sinks(static_cast<size_t>(nH));
  read_vector(*orig->final_norm, norm.data());
  read_vector(*orig->layers[0].sinks, sinks.data());
  const std::string norm_shard = shard_of(dir, "model.norm.weight");
  const std::string sinks_shard = shard_of(dir, "model.layers.0.self_attn.sinks");
  rewrite_shard(dir, norm_shard, [&](std::vector<Tensor>& ts) {
    Tensor& t = find_tensor(ts, "model.norm.weight");
    std::vector<float> f(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i) f[size_t(i)] = float(norm[size_t(i)]);
    t.decl.dtype = DType::F32;
    t.bytes = bytes_of(f);
  });
  rewrite_shard(dir, sinks_shard, [&](std::vector<Tensor>& ts) {
    Tensor& t = find_tensor(ts, "model.layers.0.self_attn.sinks");
    std::vector<uint16_t> h(static_cast<size_t>(nH));
    for (int i = 0; i < nH; ++i) {  // float -> f16 for values in the normal f16 range, exactly
      const float v = float(sinks[size_t(i)]);
      if (v == 0) {
        h[size_t(i)] = std::signbit(v) ? 0x8000 : 0;
        continue;
      }
      int e = 0;
      const float mant = std::frexp(std::fabs(v), &e);  // v = mant 2^e, mant in [0.5, 1)
      ASSERT_GE(e, -13) << "test setup: sink too small for a normal f16";
      const uint32_t m11 = uint32_t(mant * 2048.0f);  // 11 significant bits, exact for bf16 values
      h[size_t(i)] =
          uint16_t((v < 0 ? 0x8000u : 0u) | (uint32_t(e - 1 + 15) << 10) | (m11 & 0x3ffu));
    }
    t.decl.dtype = DType::F16;
    t.bytes = bytes_of(h);
  });
  const auto m = Model::load(dir);
  EXPECT_EQ(m->final_norm->dtype, DType::F32);
  EXPECT_EQ(m->layers[0].sinks->dtype, DType::F16);
  std::vector<double> norm2(static_cast<size_t>(H)), sinks2(static_cast<size_t>(nH));
  read_vector(*m->final_norm, norm2.data());
  read_vector(*m->layers[0].sinks, sinks2.data());
  EXPECT_EQ(norm2, norm);
  EXPECT_EQ(sinks2, sinks);
}

TEST(SafetensorsCheckpoint, WrongShapeIsRefused) {
  const std::string dir = tiny_copy("ckpt-shape");
  const std::string name = "model.layers.1.self_attn.sinks";
  const std::string shard = shard_of(dir, name);
  rewrite_shard(dir, shard, [&](std::vector<Tensor>& ts) {
    find_tensor(ts, name).decl.shape = {2, 2};
  });
  expect_error([&] { Model::load(dir); }, shard, {name, "[2, 2]", "[4]"});
}

TEST(SafetensorsCheckpoint, ShapeDisagreeingWithTheConfigIsRefused) {
  // The config says hidden 96 while every tensor is hidden 64.
  const std::string dir = tiny_copy("ckpt-config");
  const fs::path cfg = fs::path(dir) / "config.json";
  std::ifstream in(cfg);
  json j = json::parse(in);
  in.close();
  j["hidden_size"] = 96;
  write_file(cfg.string(), j.dump());
  expect_error([&] { Model::load(dir); }, dir, {"shape", "[1024, 64]", "[1024, 96]"});
}

TEST(SafetensorsCheckpoint, WrongDtypeIsRefused) {
  {
    const std::string dir = tiny_copy("ckpt-dtype");
    const std::string name = "model.norm.weight";  // BF16 [64] -> I32 [32], same bytes
    const std::string shard = shard_of(dir, name);
    rewrite_shard(dir, shard, [&](std::vector<Tensor>& ts) {
      Tensor& t = find_tensor(ts, name);
      t.decl.dtype = DType::I32;
      t.decl.shape = {32};
    });
    expect_error([&] { Model::load(dir); }, shard, {name, "dtype I32"});
  }
  {
    const std::string dir = tiny_copy("ckpt-dtype");
    const std::string name = "model.layers.0.mlp.experts.down_proj_scales";  // U8 -> BF16
    const std::string shard = shard_of(dir, name);
    rewrite_shard(dir, shard, [&](std::vector<Tensor>& ts) {
      Tensor& t = find_tensor(ts, name);
      t.decl.dtype = DType::BF16;
      t.decl.shape.back() /= 2;
    });
    expect_error([&] { Model::load(dir); }, shard, {name, "dtype BF16", "U8"});
  }
}

TEST(SafetensorsCheckpoint, MissingTensorIsRefused) {
  {  // gone from the shard and the index
    const std::string dir = tiny_copy("ckpt-missing");
    const std::string name = "model.layers.2.mlp.router.bias";
    rewrite_shard(dir, shard_of(dir, name), [&](std::vector<Tensor>& ts) {
      std::erase_if(ts, [&](const Tensor& t) { return t.decl.name == name; });
    });
    expect_error([&] { Model::load(dir); }, dir, {"missing tensor", name});
  }
  {  // gone from the shard, still in the index
    const std::string dir = tiny_copy("ckpt-missing");
    const std::string name = "lm_head.weight";
    const std::string shard = shard_of(dir, name);
    rewrite_shard(
        dir, shard,
        [&](std::vector<Tensor>& ts) {
          std::erase_if(ts, [&](const Tensor& t) { return t.decl.name == name; });
        },
        false);
    expect_error([&] { Model::load(dir); }, dir, {name, fs::path(shard).filename().string()});
  }
  {  // no experts at all
    const std::string dir = tiny_copy("ckpt-missing");
    const std::string name = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    rewrite_shard(dir, shard_of(dir, name), [&](std::vector<Tensor>& ts) {
      std::erase_if(ts, [&](const Tensor& t) { return t.decl.name == name; });
    });
    expect_error([&] { Model::load(dir); }, dir, {"no experts"});
  }
  {  // config.json missing
    const std::string dir = tiny_copy("ckpt-missing");
    fs::remove(fs::path(dir) / "config.json");
    expect_error([&] { Model::load(dir); }, "config.json", {"no such file"});
  }
}

TEST(SafetensorsCheckpoint, ScaleByte255IsRefused) {
  const std::string dir = tiny_copy("ckpt-255");
  const std::string name = "model.layers.3.mlp.experts.gate_up_proj_scales";
  const std::string shard = shard_of(dir, name);
  rewrite_shard(dir, shard,
                [&](std::vector<Tensor>& ts) { find_tensor(ts, name).bytes[37] = char(0xff); });
  expect_error([&] { Model::load(dir); }, shard, {name, "255", "37"});
}

TEST(SafetensorsCheckpoint, OriginalLayoutGetsAHint) {
  const std::string dir = test::temp_dir("ckpt-original");
  fs::copy_file(fs::path(test::tiny_model_dir()) / "config.json", fs::path(dir) / "config.json");
  write_st(
      dir, "model.safetensors",
      st_bytes(json{{"block.0.attn.qkv.weight", entry("BF16", {1}, 0, 2)}}, std::string(2, '\0')));
  expect_error([&] { Model::load(dir); }, dir, {"original/", "Hugging Face"});
}

// Rewrites the checkpoint's config.json through `edit`.
void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  const fs::path cfg = fs::path(dir) / "config.json";
  std::ifstream in(cfg);
  json j = json::parse(in);
  in.close();
  edit(j);
  write_file(cfg.string(), j.dump());
}

TEST(SafetensorsCheckpoint, LayersTheConfigLacksAreRefused) {
  // A config with fewer layers than the checkpoint ran a truncated model without a word.
  const std::string dir = tiny_copy("ckpt-layers");
  edit_config(dir, [](json& j) {
    j["num_hidden_layers"] = 2;
    j["layer_types"] = {"sliding_attention", "full_attention"};
  });
  expect_error([&] { Model::load(dir); }, dir,
               {"model.layers.2.", "of layer 2", "num_hidden_layers 2"});
}

TEST(SafetensorsCheckpoint, TensorsTheModelDoesNotUseAreRefused) {
  const auto add_tensor = [](const std::string& dir, const std::string& name, DType dtype,
                             std::vector<int64_t> shape) {
    rewrite_shard(dir, shard_of(dir, "model.norm.weight"), [&](std::vector<Tensor>& ts) {
      int64_t n = int64_t(dtype_size(dtype));
      for (auto d : shape) n *= d;
      ts.push_back({{name, dtype, shape}, std::string(size_t(n), '\0')});
    });
  };
  {  // a weight of another architecture (a QK norm)
    const std::string dir = tiny_copy("ckpt-extra");
    add_tensor(dir, "model.layers.1.self_attn.q_norm.weight", DType::BF16, {16});
    expect_error([&] { Model::load(dir); }, dir,
                 {"\"model.layers.1.self_attn.q_norm.weight\"", "1 such tensor;"});
  }
  {  // attention_bias false while the checkpoint holds the biases: they would be dropped
    const std::string dir = tiny_copy("ckpt-extra");
    edit_config(dir, [](json& j) { j["attention_bias"] = false; });
    expect_error([&] { Model::load(dir); }, dir,
                 {"\"model.layers.0.self_attn.k_proj.bias\"", "16 such tensors"});
  }
  {  // both expert layouts at once: the dense one would be ignored
    const std::string dir = tiny_copy("ckpt-extra");
    add_tensor(dir, "model.layers.0.mlp.experts.gate_up_proj", DType::BF16, {8, 64, 128});
    expect_error([&] { Model::load(dir); }, dir, {"\"model.layers.0.mlp.experts.gate_up_proj\""});
  }
  {  // a layer number beyond int64
    const std::string dir = tiny_copy("ckpt-extra");
    add_tensor(dir, "model.layers.99999999999999999999999.x", DType::U8, {1});
    expect_error([&] { Model::load(dir); }, dir, {"of layer 9223372036854775807"});
  }
}

TEST(SafetensorsCheckpoint, AbsurdConfigIsRefusedBeforeTheTensors) {
  const std::string dir = tiny_copy("ckpt-absurd");
  edit_config(dir, [](json& j) { j["intermediate_size"] = 2147483647; });
  expect_error([&] { Model::load(dir); }, "config.json", {"intermediate_size", "at most"});
}

}  // namespace
}  // namespace parity
