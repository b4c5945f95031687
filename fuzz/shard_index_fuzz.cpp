// Fuzzes the sharded checkpoint open (TensorStore over model.safetensors.index.json,
// model/safetensors.h): the input is the index file's bytes, in a checkpoint directory beside
// two tiny valid shards (a.safetensors: x F32 [2], y BF16 [1]; b.safetensors: z U8 [3]).
// Around them lie what an index must never reach: a FIFO and a /dev/zero link named like
// shards (opening either would block or read without end, which libFuzzer's -timeout reports
// as a hang), a valid shard in a subdirectory and one in the parent directory.
//
// Beyond "no crash, no hang, no unbounded allocation": a refusal is one parity::Error line; an
// accepted store exposes only tensors of a.safetensors or b.safetensors in the directory
// itself, each readable to its last byte and fingerprinted. A broken invariant traps, which
// libFuzzer saves as a crash input; any exception but a refusal of the input escapes and
// aborts.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "model/error.h"
#include "model/safetensors.h"

namespace {

using parity::fuzz::check_message;

namespace fs = std::filesystem;
using parity::DType;
using parity::SafetensorsWriter;

void write_shard(const std::string& path, const std::vector<SafetensorsWriter::Decl>& decls,
                 const std::string& bytes) {
  SafetensorsWriter w(path, decls);
  w.write(bytes.data(), bytes.size());
  w.finish();
}

// <tmp>/shard_index_fuzz-XXXXXX/{outside.safetensors, ckpt/{a,b}.safetensors,
// ckpt/fifo.safetensors, ckpt/zero.safetensors -> /dev/zero, ckpt/sub/a.safetensors}; built once
// per process, removed at exit. Returns the checkpoint directory.
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string root = parity::fuzz::process_temp_dir("shard_index_fuzz");
    const std::string ckpt = root + "/ckpt";
    fs::create_directories(ckpt + "/sub");
    const float x[2] = {1.0f, 2.0f};
    const uint16_t y = 0x4040;  // 3.0 in BF16
    std::string ab(reinterpret_cast<const char*>(x), sizeof x);
    ab.append(reinterpret_cast<const char*>(&y), sizeof y);
    write_shard(ckpt + "/a.safetensors", {{"x", DType::F32, {2}}, {"y", DType::BF16, {1}}}, ab);
    write_shard(ckpt + "/b.safetensors", {{"z", DType::U8, {3}}}, "\x07\x08\x09");
    // Valid shards an index must not be able to open: same tensor names as a.safetensors.
    write_shard(ckpt + "/sub/a.safetensors", {{"x", DType::F32, {2}}, {"y", DType::BF16, {1}}}, ab);
    write_shard(root + "/outside.safetensors", {{"x", DType::F32, {2}}, {"y", DType::BF16, {1}}},
                ab);
    if (::mkfifo((ckpt + "/fifo.safetensors").c_str(), 0600) != 0) std::abort();
    fs::create_symlink("/dev/zero", ckpt + "/zero.safetensors");
    return ckpt;
  }();
  return dir;
}

// A new file each time, not the old one truncated: ext4 flushes a file truncated and rewritten
// when it is closed (auto_da_alloc), which made each input cost milliseconds of disk.
void write_index(const uint8_t* data, size_t size) {
  const std::string path = checkpoint_dir() + "/model.safetensors.index.json";
  ::unlink(path.c_str());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  write_index(data, size);
  std::unique_ptr<parity::TensorStore> store;
  try {
    store = std::make_unique<parity::TensorStore>(dir);
  } catch (const parity::Error& e) {
    check_message(e);
    return 0;
  }
  // Accepted: from here on an Error is a bug, and escapes.
  const std::string a = dir + "/a.safetensors", b = dir + "/b.safetensors";
  const std::vector<std::string> names = store->names();
  FUZZ_REQUIRE(!names.empty());
  for (const std::string& name : names) {
    const parity::TensorView& v = store->get(name);
    FUZZ_REQUIRE(v.name == name);
    FUZZ_REQUIRE(v.file == a || v.file == b);  // never sub/, the parent, the FIFO or /dev/zero
    FUZZ_REQUIRE(v.file == a ? (name == "x" || name == "y") : name == "z");
    unsigned sum = 0;
    for (size_t i = 0; i < v.nbytes; ++i) sum += v.data[i];
    (void)sum;
  }
  const std::string fingerprint = store->fingerprint();
  FUZZ_REQUIRE(fingerprint.rfind("xxh3-128:", 0) == 0 && fingerprint.size() == 9 + 32);
  return 0;
}
