// Fuzzes the safetensors reader (model/safetensors.h): the input is a whole .safetensors file
// (8-byte header length, JSON header, data), written to a temporary file and mapped as the
// loader maps a shard.
//
// Beyond "no crash, no hang, no unbounded allocation": a refusal is one parity::Error line;
// every tensor of an accepted file has a shape whose element count fits in 64 bits and whose
// bytes are exactly dtype x elements, its data lies in the file's data section (every byte is
// read, so a view past the mapping faults), no two tensors overlap, and the real-valued ones
// decode (read_vector) to as many values as they have elements. A broken invariant traps,
// which libFuzzer saves as a crash input; any exception but a refusal of the input escapes and
// aborts.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/safetensors.h"

namespace {

using parity::fuzz::check_message;

namespace fs = std::filesystem;
using parity::DType;
using parity::TensorView;

// One file per process, rewritten for each input, removed at exit.
const std::string& input_path() {
  static const std::string path = [] {
    return parity::fuzz::process_temp_dir("safetensors_fuzz") + "/input.safetensors";
  }();
  return path;
}

// A new file each time, not the old one truncated: ext4 flushes a file truncated and rewritten
// when it is closed (auto_da_alloc), which made each input cost milliseconds of disk.
void write_input(const uint8_t* data, size_t size) {
  ::unlink(input_path().c_str());
  std::FILE* f = std::fopen(input_path().c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

bool is_real(DType d) {
  return d == DType::BF16 || d == DType::F16 || d == DType::F32 || d == DType::F64;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_input(data, size);
  std::unique_ptr<parity::SafetensorsFile> file;
  try {
    file = std::make_unique<parity::SafetensorsFile>(input_path());
  } catch (const parity::Error& e) {
    check_message(e);
    return 0;
  }
  // Accepted: from here on an Error is a bug, and escapes.
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
  uint64_t total = 0;
  for (const auto& [name, v] : file->tensors()) {
    FUZZ_REQUIRE(v.name == name && v.file == input_path());
    for (int64_t d : v.shape) FUZZ_REQUIRE(d >= 0);
    const int64_t n = v.numel_checked();
    FUZZ_REQUIRE(n == v.numel());
    FUZZ_REQUIRE(uint64_t(v.nbytes) == uint64_t(n) * parity::dtype_size(v.dtype));
    (void)v.shape_str();
    // Every byte read: a view outside the mapping faults here.
    unsigned sum = 0;
    for (size_t i = 0; i < v.nbytes; ++i) sum += v.data[i];
    (void)sum;
    if (is_real(v.dtype)) {
      std::vector<double> values(static_cast<size_t>(n));
      parity::read_vector(v, values.data());
    }
    if (v.nbytes > 0) ranges.push_back({v.data, v.data + v.nbytes});
    total += v.nbytes;
  }
  // The data of all tensors fits in the file beside the 8-byte length, and none overlap.
  FUZZ_REQUIRE(total + 8 <= size);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) FUZZ_REQUIRE(ranges[i].first >= ranges[i - 1].second);
  return 0;
}
