// Fuzzes the trace reader (tracer/trace_file.h): the code that opens the files users hand to
// parity-diff, which may be damaged, truncated, or made by another tool.
//
// Input: the bytes of a whole file, meant to be an HDF5 trace. The seeds in
// fuzz/corpus/trace_reader_fuzz/ are small valid traces (a reference trace with magnitude rows, a
// candidate with replay rows and a run id, a trace in the older layout with variable-length
// string attributes, a capture with KV-cache rows in bulk and an att row recorded without its
// sink, the reference trace of that capture with its recomputed rows, a tensor-parallel
// candidate with its rows' shards attributes and its ranks' partial sums) and truncated and
// bit-flipped copies of them.
//
// Each input is written to a temporary file, opened with TraceReader (metadata and index), and
// every output dataset is read, with its replay, magnitude and recompute rows, its layout and
// shards attributes and its ranks' partial sums where the trace has them, and the KV-cache rows
// of every layer; each read on its own, so that one refused dataset does not hide the others.
// parity::Error is the reader's answer to a bad file and is swallowed. Anything else is a finding:
// a crash, a sanitizer report, another exception escaping, a hang, or memory beyond libFuzzer's
// limit (the reader must never allocate more than the file could hold).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/error.h"
#include "tracer/trace_file.h"

namespace {

// One scratch file per process, rewritten for every input (a new file per input would only add
// file system noise), removed at exit.
std::string g_scratch;

const std::string& scratch_path() {
  if (g_scratch.empty()) {
    const char* dir = std::getenv("TMPDIR");
    std::string name = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                       "/trace_reader_fuzz-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) std::abort();
    ::close(fd);
    g_scratch = name;
    std::atexit([] { ::unlink(g_scratch.c_str()); });
  }
  return g_scratch;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  ::close(fd);
}

void read_one(const parity::TraceReader& reader, const std::string& path) {
  try {
    const parity::StageData row = reader.read(path);
    // The reader promises rows of their declared shape: a mismatch is a finding.
    size_t n = 1;
    for (size_t d : row.dims) n *= d;
    if (n != row.size()) __builtin_trap();
    // And shards whose ranges lie in the row, of ranks of the group.
    if (row.shards)
      for (const parity::RowShards::Range& r : row.shards->ranges)
        if (r.begin < 0 || r.end > int64_t(n) || r.begin >= r.end || r.rank < 0 ||
            r.rank >= row.shards->ranks)
          __builtin_trap();
  } catch (const parity::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  write_file(path, data, size);
  try {
    const parity::TraceReader reader(path);
    for (const parity::TraceEntry& e : reader.entries()) {
      read_one(reader, e.path);
      (void)reader.layout(e.path);
      for (parity::Series s : {parity::Series::replay, parity::Series::magnitude,
                               parity::Series::recompute, parity::Series::recompute_magnitude,
                               parity::Series::recompute_bias}) {
        const std::string side = parity::trace_dataset_path(e.key.position, e.key.layer, e.key.stage, s);
        if (reader.has(side)) read_one(reader, side);
      }
      (void)reader.shards(e.path);
      for (int r = 0; r < reader.partial_ranks(); ++r) {
        const std::string part =
            parity::trace_partial_path(r, e.key.position, e.key.layer, e.key.stage);
        if (reader.has(part)) read_one(reader, part);
      }
    }
    for (int layer = 0; layer < reader.config().num_hidden_layers; ++layer) {
      try {
        if (reader.cache_length() == 0) break;
        const parity::KvRows rows = reader.cache_rows(layer);
        // The promised shape: count rows of nKV x d, k and v alike.
        const size_t row = size_t(reader.config().num_key_value_heads) * size_t(reader.config().head_dim);
        if (rows.k.size() != size_t(rows.count) * row || rows.v.size() != rows.k.size()) __builtin_trap();
      } catch (const parity::Error&) {
      }
    }
  } catch (const parity::Error&) {
  }
  return 0;
}
