// HDF5 trace files through the HDF5 C API: TraceWriter writes one dataset per traced stage
// row under a temporary name and renames it into place on finish(); TraceReader checks that a
// file is a gpt-oss-parity trace, reads its metadata and indexes its datasets in execution
// order. Every failure becomes one parity::Error naming the file.
//
// The C API rather than the C++ one: its calls return a status that we check where we make
// them, nothing is closed twice behind our back (the C++ objects close in destructors and
// print "H5Dclose failed" there), and we choose how each value is read after checking its type
// and shape (the C++ Attribute::read of a string assumes a single element).
#include "tracer/trace_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>

#include "model/error.h"
#include "model/untrusted.h"
#include "tracer/escape.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

// What a trace's attributes can hold. Anything longer is not a trace we wrote and is refused
// before it is allocated.
constexpr size_t kMaxShortString = 4096;       // backend, fingerprint, paths, versions, dates
constexpr size_t kMaxStageName = 64;           // the "stage" attribute of a dataset
constexpr size_t kMaxLayout = 128;              // the "layout" attribute of a captured dataset
constexpr size_t kMaxShards = 64u << 10;        // the "shards" attribute of a group's row
constexpr size_t kMaxShardProblem = 2048;       // its "shard_problem" attribute
constexpr size_t kMaxJsonString = 16u << 20;   // config, device, run, precision_policy
constexpr size_t kMaxRunId = 64;
constexpr int64_t kMaxListLength = int64_t(1) << 26;  // tokens, positions (2^24 is the context)
// Deflate, the one filter a trace written by another tool is likely to use, expands at most
// ~1032:1; a chunked, filtered dataset may declare that much more data than the file holds.
constexpr int64_t kMaxInflation = 1032;

// ---- HDF5 errors ---------------------------------------------------------------------------
// HDF5 prints its error stack to stderr by default; we silence it and, right after a call
// fails (before any other HDF5 call clears the stack), keep the innermost message: the one that
// says what really failed ("unable to open file: ... No such file or directory").

void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// Untrusted or library text for an error line: as is when it is short printable ASCII, else
// escaped and capped.
std::string printable(std::string_view text, size_t cap) {
  const bool plain = text.size() <= cap && std::all_of(text.begin(), text.end(), [](char c) {
                       return c >= 0x20 && c < 0x7f;
                     });
  return plain ? std::string(text) : quoted(text, cap);
}

herr_t keep_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err != nullptr && err->desc != nullptr) *static_cast<std::string*>(out) = err->desc;
  return 0;
}

// HDF5's I/O errors (its sec2 driver) say what failed, then the time, the file, the descriptor,
// errno, the buffer and sizes, among them a -1 printed unsigned ("bytes actually written =
// 18446744073709551615"): what the user can act on is errno's text, so the message is cut to
// "file write failed: No space left on device". "" when `message` is not such an error.
std::string io_error(std::string_view message) {
  const size_t at = message.find("errno = ");
  const size_t colon = message.find(':');
  if (at == std::string_view::npos || colon == std::string_view::npos || colon > at) return "";
  int err = 0;
  const char* digits = message.data() + at + 8;
  const auto [end, ec] = std::from_chars(digits, message.data() + message.size(), err);
  if (ec != std::errc() || end == digits || err <= 0) return "";
  return fmt::format("{}: {}", message.substr(0, colon), std::strerror(err));
}

// HDF5's message on one line: its I/O errors embed ctime()'s newline and the file name.
std::string hdf5_error() {
  std::string innermost;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &innermost);
  H5Eclear2(H5E_DEFAULT);
  if (std::string io = io_error(innermost); !io.empty()) innermost = std::move(io);
  std::string line;
  for (char c : innermost) {
    const bool printable_ascii = c >= 0x20 && c < 0x7f;
    if (printable_ascii && c != ' ')
      line += c;
    else if (!line.empty() && line.back() != ' ')
      line += ' ';
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  constexpr size_t kCap = 400;
  if (line.size() > kCap) line = line.substr(0, kCap) + "...";
  return line.empty() ? "no message" : line;
}

[[noreturn]] void fail_hdf5(const std::string& file, std::string_view doing) {
  const std::string detail = hdf5_error();
  fail("{}: {} failed (HDF5: {})", file, doing, detail);
}

// An HDF5 identifier closed exactly once, by the function that matches its kind. HDF5 1.10
// frees a file even when closing it fails but keeps its id; closing that id again (as the C++
// API's destructor did after a failed close()) reads freed memory. So close() forgets the id
// whatever the outcome.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      (void)close();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { (void)close(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  herr_t close() {
    if (id_ < 0) return 0;
    return closer_(std::exchange(id_, H5I_INVALID_HID));
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// For reading: an id, or an Error naming the file and what was being done.
Hid checked(hid_t id, Hid::Closer closer, const std::string& file, std::string_view doing) {
  if (id < 0) fail_hdf5(file, doing);
  return Hid(id, closer);
}

std::optional<int> parse_index(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  // One spelling per index ("pos_7", never "pos_07"): the differ finds datasets by the path
  // trace_dataset_path() spells.
  if (std::to_string(value) != text) return std::nullopt;
  return value;
}

// The index of a group named <prefix><index> ("layer_3"), or nullopt.
std::optional<int> named_index(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  return parse_index(name.substr(prefix.size()));
}

template <typename T>
std::string dims_text(const std::vector<T>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The trace's config as a gpt-oss Config: what every dataset's shape is checked against.
Config trace_config(const nlohmann::json& j, const std::string& file) {
  try {
    return Config::from_json(j, "config");
  } catch (const Error& e) {
    fail("{}: the trace's config is not a gpt-oss config ({})", file, printable(e.what(), 200));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the trace's config is not a gpt-oss config ({})", file, printable(e.what(), 200));
  }
}

// The layouts a port may declare for a stage's row (capture/parity_capture.h), as the "layout"
// attribute spells them: names joined by '|'. The differ reads NO_SINK of an att row.
bool layout_applies(std::string_view name, Stage s) {
  switch (s) {
    case Stage::qkv:
      return name == "ROPE_INTERLEAVED" || name == "QKV_Q" || name == "QKV_K" || name == "QKV_V";
    case Stage::q_rope:
    case Stage::k_rope:
      return name == "ROPE_INTERLEAVED";
    case Stage::scores:
      return name == "SINK_FIRST";
    case Stage::att:
      return name == "SINK_FIRST" || name == "NO_SINK";
    case Stage::mlp1:
      return name == "GATE_UP_HALVES";
    default:
      return false;
  }
}

// Why `layout` is not a layout of stage `s` ("" when it is one).
std::string layout_problem(std::string_view layout, Stage s) {
  std::set<std::string_view> seen;
  for (size_t start = 0;;) {
    const size_t bar = layout.find('|', start);
    const std::string_view part = layout.substr(start, bar == std::string_view::npos ? layout.npos : bar - start);
    if (!layout_applies(part, s))
      return fmt::format("{} is not a layout of stage {}", quoted(part, 40), name(s));
    if (!seen.insert(part).second) return fmt::format("{} is named twice", quoted(part, 40));
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  if (seen.contains("SINK_FIRST") && seen.contains("NO_SINK"))
    return "SINK_FIRST and NO_SINK exclude each other";
  return "";
}

// ---- variable-length strings -------------------------------------------------------------
// Traces written before fixed-length strings (and h5py's str attributes) keep their strings in
// the global heap, which has no checksum, and HDF5 1.10 copies a heap object by the size the
// heap claims without checking it against the heap: a damaged size made H5HG_read copy past its
// buffers. So the reader never lets HDF5 read a variable-length string. A conversion function
// registered for "variable-length string -> kHeapIdTag" hands back the string's raw heap ID
// (length, collection address, object index), and GlobalHeap finds the object in the file
// itself, checking every size (file format specification, "Global Heap").

constexpr const char* kHeapIdTag = "gpt-oss-parity: raw global heap id";
constexpr size_t kHeapIdBytes = 32;  // 1 byte of source size, then the id (4 + 16 + 4 at most)

herr_t raw_heap_id(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t nelmts, size_t buf_stride,
                   size_t, void* buf, void*, hid_t) {
  switch (cdata->command) {
    case H5T_CONV_INIT: {
      // Declining (a negative status) lets HDF5 try its other conversions.
      if (H5Tis_variable_str(src) <= 0 || H5Tget_class(dst) != H5T_OPAQUE ||
          H5Tget_size(dst) != kHeapIdBytes)
        return -1;
      char* tag = H5Tget_tag(dst);
      const bool ours = tag != nullptr && std::strcmp(tag, kHeapIdTag) == 0;
      H5free_memory(tag);
      if (!ours) return -1;
      cdata->need_bkg = H5T_BKG_NO;
      return 0;
    }
    case H5T_CONV_CONV: {
      // The source elements are the attribute's bytes as stored: the disk form of the string.
      const size_t src_size = H5Tget_size(src);
      if (src_size == 0 || src_size >= kHeapIdBytes) return -1;
      const size_t src_stride = buf_stride != 0 ? buf_stride : src_size;
      const size_t dst_stride = buf_stride != 0 ? buf_stride : kHeapIdBytes;
      if (dst_stride < kHeapIdBytes) return -1;
      auto* bytes = static_cast<unsigned char*>(buf);
      for (size_t i = nelmts; i-- > 0;) {  // backwards: each element grows in place
        unsigned char raw[kHeapIdBytes] = {};
        std::memcpy(raw, bytes + i * src_stride, src_size);
        unsigned char* out = bytes + i * dst_stride;
        std::memset(out, 0, kHeapIdBytes);
        out[0] = static_cast<unsigned char>(src_size);
        std::memcpy(out + 1, raw, src_size);
      }
      return 0;
    }
    case H5T_CONV_FREE:
      return 0;
  }
  return -1;
}

Hid heap_id_type(const std::string& file) {
  Hid type = checked(H5Tcreate(H5T_OPAQUE, kHeapIdBytes), H5Tclose, file, "setting up string reads");
  if (H5Tset_tag(type.get(), kHeapIdTag) < 0) fail_hdf5(file, "setting up string reads");
  return type;
}

// Registers raw_heap_id unless HDF5 already finds it for the path (after H5close, HDF5 forgets).
void register_raw_heap_id(const std::string& file) {
  const Hid variable = checked(H5Tcopy(H5T_C_S1), H5Tclose, file, "setting up string reads");
  if (H5Tset_size(variable.get(), H5T_VARIABLE) < 0) fail_hdf5(file, "setting up string reads");
  const Hid id = heap_id_type(file);
  H5T_cdata_t* cdata = nullptr;
  if (H5Tfind(variable.get(), id.get(), &cdata) == raw_heap_id) return;
  H5Eclear2(H5E_DEFAULT);
  if (H5Tregister(H5T_PERS_SOFT, "gpt-oss-parity raw heap id", variable.get(), id.get(), raw_heap_id) < 0)
    fail_hdf5(file, "setting up string reads");
}

uint64_t little_endian(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

class GlobalHeap {
 public:
  GlobalHeap(const std::string& path, uint64_t file_size, hid_t file) : path_(path), file_size_(file_size) {
    const Hid fcpl = checked(H5Fget_create_plist(file), H5Pclose, path, "reading the file's layout");
    hsize_t userblock = 0;
    if (H5Pget_sizes(fcpl.get(), &sizeof_addr_, &sizeof_size_) < 0 ||
        H5Pget_userblock(fcpl.get(), &userblock) < 0)
      fail_hdf5(path, "reading the file's layout");
    base_ = userblock;  // addresses are relative to the superblock, after the user block
  }
  GlobalHeap(const GlobalHeap&) = delete;
  GlobalHeap& operator=(const GlobalHeap&) = delete;
  ~GlobalHeap() {
    if (fd_ >= 0) ::close(fd_);
  }

  // The string the raw heap ID (raw_heap_id's output) names; `what` names the attribute.
  std::string string(const unsigned char* raw, size_t max_bytes, std::string_view what) const {
    const size_t id_size = raw[0];
    const unsigned char* id = raw + 1;
    if (id_size != 4 + sizeof_addr_ + 4 || sizeof_addr_ > 8 || sizeof_size_ > 8)
      fail("{}: {} is a string whose heap reference has an unexpected form", path_, what);
    const uint64_t length = little_endian(id, 4);
    if (length == 0) return "";
    if (length > max_bytes)
      fail("{}: {} is a string of {} bytes, more than it can be ({})", path_, what, length, max_bytes);
    const uint64_t address = little_endian(id + 4, sizeof_addr_);
    const uint64_t index = little_endian(id + 4 + sizeof_addr_, 4);
    const size_t header = 8 + sizeof_size_;  // signature, version, reserved, collection size
    auto damaged = [&](std::string_view why) {
      fail("{}: {} is a string in a damaged global heap ({})", path_, what, why);
    };
    if (address > file_size_ || base_ > file_size_ - address || file_size_ - address - base_ < header)
      damaged("its collection lies outside the file");
    const uint64_t start = base_ + address;
    unsigned char head[16] = {};
    read(start, head, header);
    if (std::memcmp(head, "GCOL", 4) != 0 || head[4] != 1) damaged("no collection signature");
    const uint64_t size = little_endian(head + 8, sizeof_size_);
    if (size < header || size > file_size_ - start) damaged("its size exceeds the file");
    if (size > kMaxCollection) damaged("a collection larger than a trace has");
    std::vector<unsigned char> collection(size);
    read(start, collection.data(), size);
    const size_t object_header = 8 + sizeof_size_;  // index, reference count, reserved, size
    for (uint64_t at = header; at + object_header <= size;) {
      const uint64_t object = little_endian(&collection[at], 2);
      if (object == 0) break;  // the free space, always last
      const uint64_t object_size = little_endian(&collection[at + 8], sizeof_size_);
      const uint64_t data = at + object_header;
      if (object_size > size - data) damaged("an object larger than its collection");
      if (object == index) {
        if (length > object_size) damaged("a string longer than its object");
        const char* text = reinterpret_cast<const char*>(&collection[data]);
        return std::string(text, strnlen(text, length));
      }
      at = data + ((object_size + 7) & ~uint64_t(7));
    }
    damaged("the object it names is not there");
    return "";
  }

 private:
  static constexpr uint64_t kMaxCollection = uint64_t(256) << 20;

  void read(uint64_t offset, void* out, size_t n) const {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) fail("{}: cannot open for reading ({})", path_, std::strerror(errno));
    for (size_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd_, static_cast<char*>(out) + done, n - done, off_t(offset + done));
      if (got <= 0) fail("{}: reading {} bytes at {} failed", path_, n, offset);
      done += size_t(got);
    }
  }

  const std::string& path_;
  uint64_t file_size_;
  size_t sizeof_addr_ = 8, sizeof_size_ = 8;
  uint64_t base_ = 0;
  mutable int fd_ = -1;
};

// ---- reading attributes ------------------------------------------------------------------
// Every attribute is checked before it is read: its type class, its size, its dataspace (one
// value: scalar, or simple with one element; a list: rank 1), and the bytes it declares
// against what the file can hold.
struct AttrReader {
  const std::string& file;
  uint64_t file_size;
  const GlobalHeap& heap;
  hid_t obj;
  std::string where;  // "/" or a dataset path

  bool has(const char* name) const {
    const htri_t exists = H5Aexists(obj, name);
    if (exists < 0) fail_hdf5(file, fmt::format("looking up attribute \"{}\" of {}", name, where));
    return exists > 0;
  }

  struct Opened {
    Hid attr, type;
  };
  Opened open(const char* name, H5T_class_t cls, const char* expected) const {
    if (!has(name)) fail("{}: {} has no attribute \"{}\"", file, where, name);
    const std::string doing = fmt::format("opening attribute \"{}\" of {}", name, where);
    Opened a{checked(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, file, doing), {}};
    a.type = checked(H5Aget_type(a.attr.get()), H5Tclose, file, doing);
    if (H5Tget_class(a.type.get()) != cls)
      fail("{}: attribute \"{}\" of {} is not {}", file, name, where, expected);
    return a;
  }

  // How many values the attribute holds: 1 for a scalar, 0 for a null dataspace, the element
  // count of a rank-1 simple dataspace; other ranks are refused.
  int64_t count(hid_t attr, const char* name) const {
    const std::string doing = fmt::format("reading the shape of attribute \"{}\" of {}", name, where);
    const Hid space = checked(H5Aget_space(attr), H5Sclose, file, doing);
    switch (H5Sget_simple_extent_type(space.get())) {
      case H5S_SCALAR:
        return 1;
      case H5S_NULL:
        return 0;
      case H5S_SIMPLE: {
        const int rank = H5Sget_simple_extent_ndims(space.get());
        if (rank < 0) fail_hdf5(file, doing);
        if (rank > 1)
          fail("{}: attribute \"{}\" of {} has {} dimensions; it should be one value or a list",
               file, name, where, rank);
        const hssize_t n = H5Sget_simple_extent_npoints(space.get());
        if (n < 0) fail_hdf5(file, doing);
        return int64_t(n);
      }
      default:
        fail_hdf5(file, doing);
    }
  }

  void require_one(hid_t attr, const char* name, const char* what) const {
    const int64_t n = count(attr, name);
    if (n != 1)
      fail("{}: attribute \"{}\" of {} should be one {}, but holds {} values", file, name, where,
           what, n);
  }

  std::string str(const char* name, size_t max_bytes = kMaxShortString) const {
    const Opened a = open(name, H5T_STRING, "a string");
    require_one(a.attr.get(), name, "string");
    const std::string doing = fmt::format("reading attribute \"{}\" of {}", name, where);
    const htri_t variable = H5Tis_variable_str(a.type.get());
    if (variable < 0) fail_hdf5(file, doing);
    std::string value;
    if (variable > 0) {
      const Hid raw_type = heap_id_type(file);
      unsigned char raw[kHeapIdBytes] = {};
      if (H5Aread(a.attr.get(), raw_type.get(), raw) < 0) fail_hdf5(file, doing);
      value = heap.string(raw, max_bytes, fmt::format("attribute \"{}\" of {}", name, where));
    } else {
      const size_t size = H5Tget_size(a.type.get());
      if (size == 0) fail_hdf5(file, doing);
      if (size > max_bytes + 1 || size > file_size)
        fail("{}: attribute \"{}\" of {} is a string of {} bytes, more than a trace's {} can be "
             "({})",
             file, name, where, size, name, max_bytes);
      std::string buffer(size, '\0');
      if (H5Aread(a.attr.get(), a.type.get(), buffer.data()) < 0) fail_hdf5(file, doing);
      buffer.resize(strnlen(buffer.data(), size));
      value = std::move(buffer);
    }
    if (value.size() > max_bytes)
      fail("{}: attribute \"{}\" of {} is longer than a trace's {} can be ({} bytes)", file, name,
           where, name, max_bytes);
    return value;
  }

  // Integers of 1 to 8 bytes, read as int64 so that nothing is silently clipped.
  std::vector<int64_t> integers(const char* name, bool one) const {
    const Opened a = open(name, H5T_INTEGER, one ? "an integer" : "a list of integers");
    const size_t size = H5Tget_size(a.type.get());
    if (size == 0 || size > 8)
      fail("{}: attribute \"{}\" of {} is an integer of {} bytes; 1 to 8 are read", file, name,
           where, size);
    if (one) require_one(a.attr.get(), name, "integer");
    const int64_t n = count(a.attr.get(), name);
    if (n > kMaxListLength)
      fail("{}: attribute \"{}\" of {} holds {} values, more than a trace's list can ({})", file,
           name, where, n, kMaxListLength);
    if (uint64_t(n) * size > file_size)
      fail("{}: attribute \"{}\" of {} declares {} values of {} bytes, more than the file's {} "
           "bytes can hold",
           file, name, where, n, size, file_size);
    std::vector<int64_t> values(static_cast<size_t>(n));
    if (n > 0 && H5Aread(a.attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
      fail_hdf5(file, fmt::format("reading attribute \"{}\" of {}", name, where));
    return values;
  }

  int32_t int32(const char* name, int64_t value) const {
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
      fail("{}: attribute \"{}\" of {} holds {}, outside the int32 range", file, name, where, value);
    return int32_t(value);
  }

  std::vector<int32_t> ints(const char* name) const {
    const std::vector<int64_t> wide = integers(name, false);
    std::vector<int32_t> values;
    values.reserve(wide.size());
    for (int64_t v : wide) values.push_back(int32(name, v));
    return values;
  }

  int32_t int1(const char* name) const { return int32(name, integers(name, true)[0]); }

  nlohmann::json json(const char* name) const {
    return parse_json(str(name, kMaxJsonString),
                      fmt::format("{}: attribute \"{}\" of {}", file, name, where));
  }
};

}  // namespace

std::string_view series_name(Series s) {
  switch (s) {
    case Series::output: return "output";
    case Series::replay: return "replay";
    case Series::magnitude: return "magnitude";
    case Series::recompute: return "recompute";
    case Series::recompute_magnitude: return "recompute_magnitude";
    case Series::recompute_bias: return "recompute_bias";
  }
  return "output";
}

namespace {
// The group a series' datasets live under: the root for outputs, else /<series name>.
std::string series_prefix(Series s) {
  return s == Series::output ? std::string() : "/" + std::string(series_name(s));
}
}  // namespace

std::string trace_dataset_path(int position, int layer, Stage s, Series series) {
  const std::string prefix = series_prefix(series);
  if (layer == kModelLayer) return fmt::format("{}/pos_{}/model/{}", prefix, position, name(s));
  return fmt::format("{}/pos_{}/layer_{}/{}", prefix, position, layer, name(s));
}

std::string new_run_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", uint32_t(rd()));
  return id;
}

bool is_valid_run_id(std::string_view id) {
  return !id.empty() && id.size() <= kMaxRunId && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
  });
}

// ---- TraceWriter -----------------------------------------------------------------------------

namespace {
// A failed HDF5 call while writing: the trace is abandoned where it is caught, after the
// handles opened since have closed.
struct WriteFailure {
  std::string what;
};

// A trace replaces only a regular file (or nothing): writing "into" a FIFO would block, and a
// directory or device is not ours to replace.
void refuse_non_regular_output(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail("{}: cannot access the output path ({})", path, std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory; a trace is written to a file", path);
  if (!S_ISREG(st.st_mode))
    fail("{}: exists and is not a regular file (a FIFO, socket or device); a trace replaces only "
         "a regular file",
         path);
}
}  // namespace

struct TraceWriter::Impl {
  enum class State { writing, finished, abandoned };
  std::string path;      // final name
  std::string tmp_path;  // written here until finish()
  bool created = false;  // tmp_path is ours to remove
  Config config;
  std::set<int> positions;
  std::vector<int32_t> tokens, token_positions;  // written at finish()
  nlohmann::json run;                            // written at finish()
  Hid file;
  Hid group_plist;  // link creation order, tracked and indexed
  std::set<std::string> groups;
  std::set<std::string> datasets;
  State state = State::writing;
  std::string abandoned_because;
  bool redirected = false;

  // One row's dataset at ds_path (its groups exist): the values in their type, the key's
  // attributes, the layout and a group's shards where given. Throws WriteFailure.
  void write_row(const std::string& ds_path, const StageKey& key, const StageData& data,
                 std::string_view layout);

  ~Impl() {
    if (state == State::writing) abandon();  // an unfinished trace must not survive
  }

  // HDF5 1.10 cannot close a file whose final flush fails: H5Fclose frees it but leaves its id
  // registered, and the library's exit handler closes it again and crashes. Nothing of an
  // abandoned trace needs to reach the disk, so its descriptor is first pointed at an anonymous
  // memory file (the sec2 driver's handle is the descriptor): the close's flush succeeds there
  // and the file is closed once, for good. A failure on a full disk (ENOSPC, EDQUOT) or an I/O
  // error is handled so; a process-wide file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored)
  // applies to the memory file too, and then the close still fails.
  void redirect_to_memory() noexcept {
    if (redirected || !file.valid()) return;
    redirected = true;
    void* handle = nullptr;
    if (H5Fget_vfd_handle(file.get(), H5P_DEFAULT, &handle) < 0 || handle == nullptr) {
      H5Eclear2(H5E_DEFAULT);
      return;
    }
    const int memory = ::memfd_create("abandoned-trace", MFD_CLOEXEC);
    if (memory < 0) return;
    (void)::dup2(memory, *static_cast<int*>(handle));
    ::close(memory);
  }

  // Closes the file once and removes the temporary file.
  void abandon() noexcept {
    state = State::abandoned;
    redirect_to_memory();
    (void)file.close();
    H5Eclear2(H5E_DEFAULT);
    (void)group_plist.close();
    std::error_code ec;
    if (created) fs::remove(tmp_path, ec);
  }

  [[noreturn]] void fail_abandoned(const WriteFailure& failure) {
    abandon();
    abandoned_because = failure.what;
    fail("{}: {}; the unfinished trace was removed", path, failure.what);
  }

  void require_writing(std::string_view call) const {
    if (state == State::finished)
      fail("{}: {} after finish(): the trace is already complete", path, call);
    if (state == State::abandoned)
      fail("{}: {} after the trace was abandoned ({})", path, call, abandoned_because);
  }

  // Any failed HDF5 call abandons the trace. The message is taken before anything else calls
  // HDF5; the descriptor is redirected before the handles open in the caller close.
  void check(bool ok, std::string_view doing) {
    if (ok) return;
    std::string detail = hdf5_error();
    redirect_to_memory();
    throw WriteFailure{fmt::format("{} failed (HDF5: {})", doing, detail)};
  }

  Hid make(hid_t id, Hid::Closer closer, std::string_view doing) {
    Hid h(id, closer);
    check(id >= 0, doing);
    return h;
  }

  void ensure_group(const std::string& group) {
    if (groups.contains(group)) return;
    Hid g = make(H5Gcreate2(file.get(), group.c_str(), H5P_DEFAULT, group_plist.get(), H5P_DEFAULT),
                 H5Gclose, "creating group " + group);
    check(g.close() >= 0, "closing group " + group);
    groups.insert(group);
  }

  // Strings are fixed-length, so that they live in the (checksummed) object header instead of
  // the global heap, which has no checksum.
  void write_string_attr(hid_t obj, const char* name, std::string_view value, std::string_view where) {
    const std::string doing = fmt::format("writing attribute \"{}\" of {}", name, where);
    const Hid type = make(H5Tcopy(H5T_C_S1), H5Tclose, doing);
    check(H5Tset_size(type.get(), value.size() + 1) >= 0 &&
              H5Tset_strpad(type.get(), H5T_STR_NULLTERM) >= 0 &&
              H5Tset_cset(type.get(), H5T_CSET_UTF8) >= 0,
          doing);
    const Hid space = make(H5Screate(H5S_SCALAR), H5Sclose, doing);
    Hid attr = make(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Aclose, doing);
    const std::string text(value);  // NUL-terminated: value.size() + 1 bytes
    check(H5Awrite(attr.get(), type.get(), text.c_str()) >= 0, doing);
    check(attr.close() >= 0, doing);
  }

  void write_ints_attr(hid_t obj, const char* name, const int32_t* values, size_t n, bool scalar,
                       std::string_view where) {
    const std::string doing = fmt::format("writing attribute \"{}\" of {}", name, where);
    const hsize_t dims = n;
    const Hid space = make(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dims, nullptr),
                           H5Sclose, doing);
    Hid attr = make(H5Acreate2(obj, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Aclose, doing);
    const int32_t none = 0;
    check(H5Awrite(attr.get(), H5T_NATIVE_INT32, n > 0 ? values : &none) >= 0, doing);
    check(attr.close() >= 0, doing);
  }
  void write_int_attr(hid_t obj, const char* name, int32_t value, std::string_view where) {
    write_ints_attr(obj, name, &value, 1, true, where);
  }
};

namespace {
// The writers this process has opened: the count in each one's temporary name.
std::atomic<uint64_t> g_writers{0};

std::string temporary_name(const std::string& path, uint64_t writer) {
  return fmt::format("{}.tmp-{}-{}", path, ::getpid(), writer);
}
}  // namespace

std::string TraceWriter::next_temporary_path(const std::string& path) {
  return temporary_name(path, g_writers.load());
}

const std::string& TraceWriter::temporary_path() const { return impl_->tmp_path; }

TraceWriter::TraceWriter(std::string path, TraceMeta meta, std::set<int> positions)
    : impl_(std::make_unique<Impl>()) {
  silence_hdf5();
  Impl& w = *impl_;
  if (path.empty()) fail("trace writer: empty output path");
  w.path = std::move(path);
  refuse_non_regular_output(w.path);
  w.config = trace_config(meta.config, w.path);
  if (!meta.run_id.empty() && !is_valid_run_id(meta.run_id))
    fail("{}: run_id {} is not 1 to {} characters of [0-9A-Za-z-]", w.path, quoted(meta.run_id),
         kMaxRunId);
  w.positions = std::move(positions);
  w.tokens = std::move(meta.tokens);
  w.token_positions = std::move(meta.positions);
  w.run = std::move(meta.run);

  // Two writers of one path (threads, two open captures) never share the temporary name: the
  // last to finish is the file found there. One left by a dead process of the same pid is a
  // regular file and ours to replace; anything else there is not.
  const std::string tmp = temporary_name(w.path, g_writers.fetch_add(1));
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      fail("{}: the temporary name {} is taken by something that is not a regular file", w.path,
           tmp);
    std::error_code ec;
    fs::remove(tmp, ec);
  }
  w.tmp_path = tmp;

  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose), fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  w.group_plist = Hid(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  const unsigned order = H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED;
  // sec2: redirect_to_memory() needs its handle to be the descriptor. The newest format: its
  // metadata carries checksums. No sieve buffer: a stage row is written in one call, and
  // without the buffer a failed data write fails that call instead of a later close.
  if (!fapl.valid() || !fcpl.valid() || !w.group_plist.valid() || H5Pset_fapl_sec2(fapl.get()) < 0 ||
      H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0 ||
      H5Pset_sieve_buf_size(fapl.get(), 0) < 0 || H5Pset_link_creation_order(fcpl.get(), order) < 0 ||
      H5Pset_link_creation_order(w.group_plist.get(), order) < 0)
    fail_hdf5(w.path, "setting up the trace's file properties");
  const hid_t f = H5Fcreate(w.tmp_path.c_str(), H5F_ACC_EXCL, fcpl.get(), fapl.get());
  if (f < 0) {
    const std::string detail = hdf5_error();
    // A create that failed after making the file (a full disk) leaves it behind.
    w.created = ::lstat(w.tmp_path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    w.abandon();
    fail("{}: creating the trace failed (HDF5: {})", w.path, detail);
  }
  w.file = Hid(f, H5Fclose);
  w.created = true;
  try {
    const Hid root = w.make(H5Gopen2(f, "/", H5P_DEFAULT), H5Gclose, "opening /");
    const hid_t r = root.get();
    w.write_string_attr(r, "format", kTraceFormat, "/");
    w.write_int_attr(r, "format_version", kTraceFormatVersion, "/");
    w.write_string_attr(r, "backend", meta.backend, "/");
    w.write_string_attr(r, "precision", meta.precision, "/");
    w.write_string_attr(r, "config", json_text(meta.config), "/");
    w.write_string_attr(r, "checkpoint_fingerprint", meta.fingerprint, "/");
    w.write_string_attr(r, "model_dir", meta.model_dir, "/");
    w.write_string_attr(r, "tool_version", meta.tool_version, "/");
    w.write_string_attr(r, "commit", meta.commit, "/");
    w.write_string_attr(r, "device", json_text(meta.device), "/");
    w.write_string_attr(r, "created", meta.created, "/");
    if (meta.precision_policy)
      w.write_string_attr(r, "precision_policy", json_text(meta.precision_policy->to_json()), "/");
    w.write_int_attr(r, "replay", meta.replay ? 1 : 0, "/");
    if (!meta.run_id.empty()) w.write_string_attr(r, "run_id", meta.run_id, "/");
  } catch (const WriteFailure& failure) {
    w.fail_abandoned(failure);
  }
}

void TraceWriter::set_run(nlohmann::json run) {
  if (impl_->state == Impl::State::finished) fail("{}: set_run() after finish()", impl_->path);
  impl_->run = std::move(run);
}

void TraceWriter::set_tokens(std::vector<int32_t> tokens, std::vector<int32_t> positions) {
  if (impl_->state == Impl::State::finished) fail("{}: set_tokens() after finish()", impl_->path);
  impl_->tokens = std::move(tokens);
  impl_->token_positions = std::move(positions);
}

TraceWriter::~TraceWriter() = default;

bool TraceWriter::wants(int position, int, Stage) const {
  return impl_->positions.empty() || impl_->positions.contains(position);
}

void TraceWriter::Impl::write_row(const std::string& ds_path, const StageKey& key,
                                  const StageData& data, std::string_view layout) {
  Impl& w = *this;
  const StageInfo& si = info(key.stage);
  const std::string doing = "writing " + ds_path;
  std::vector<hsize_t> dims(data.dims.begin(), data.dims.end());
  const Hid space =
      w.make(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose, doing);
  hid_t file_type = H5T_IEEE_F64LE, mem_type = H5T_NATIVE_DOUBLE;
  const void* values = data.f64.data();
  if (data.type == StageData::Type::F32) {
    file_type = H5T_IEEE_F32LE;
    mem_type = H5T_NATIVE_FLOAT;
    values = data.f32.data();
  } else if (data.type == StageData::Type::I32) {
    file_type = H5T_STD_I32LE;
    mem_type = H5T_NATIVE_INT32;
    values = data.i32.data();
  }
  Hid ds = w.make(H5Dcreate2(w.file.get(), ds_path.c_str(), file_type, space.get(), H5P_DEFAULT,
                             H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose, doing);
  w.check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0, doing);
  w.write_string_attr(ds.get(), "stage", si.name, ds_path);
  w.write_int_attr(ds.get(), "layer", key.layer, ds_path);
  w.write_int_attr(ds.get(), "position", key.position, ds_path);
  w.write_int_attr(ds.get(), "order", key.order, ds_path);
  if (!layout.empty()) w.write_string_attr(ds.get(), "layout", layout, ds_path);
  if (data.shards) {
    w.write_string_attr(ds.get(), "shards", data.shards->text(), ds_path);
    if (!data.shards->problem.empty()) {
      w.write_string_attr(ds.get(), "shard_problem", data.shards->problem, ds_path);
      w.write_int_attr(ds.get(), "shard_problem_rank", data.shards->problem_rank, ds_path);
    }
  }
  w.check(ds.close() >= 0, doing);
}

void TraceWriter::record(const StageKey& key, const StageData& data) { record(key, data, {}); }

void TraceWriter::record(const StageKey& key, const StageData& data, std::string_view layout) {
  Impl& w = *impl_;
  w.require_writing("record()");
  const StageInfo& si = info(key.stage);
  const std::string ds_path = trace_dataset_path(key.position, key.layer, key.stage, key.series);
  if (key.position < 0) fail("{}: {}: negative position {}", w.path, ds_path, key.position);
  if ((si.scope == Scope::Model) != (key.layer == kModelLayer) || key.layer < kModelLayer ||
      key.layer >= w.config.num_hidden_layers)
    fail("{}: {}: stage {} is {}-scope but was recorded with layer {} (the model has {} layers)",
         w.path, ds_path, si.name, scope_name(si.scope), key.layer, w.config.num_hidden_layers);
  if (data.dims.empty()) fail("{}: {}: stage data has no dims", w.path, ds_path);
  size_t elements = 1;
  for (size_t d : data.dims) elements *= d;
  if (elements != data.size())
    fail("{}: {}: dims {} hold {} values but the data has {}", w.path, ds_path,
         dims_text(data.dims), elements, data.size());
  // The reader refuses a row whose shape is not its stage's; so does the writer, at the source.
  const std::vector<size_t> expected = stage_dims(w.config, key.stage, key.position);
  if (data.dims != expected)
    fail("{}: {}: dims {} but a {} row at position {} is {}", w.path, ds_path,
         dims_text(data.dims), si.name, key.position, dims_text(expected));
  if ((key.series == Series::magnitude || key.series == Series::recompute_magnitude ||
       key.series == Series::recompute_bias) &&
      (si.kind == ValueKind::Index || data.type != StageData::Type::F64))
    fail("{}: {}: magnitudes are float64 rows of real stages", w.path, ds_path);
  if ((si.kind == ValueKind::Index) != (data.type == StageData::Type::I32))
    fail("{}: {}: stage {} holds {} values; int32 is for index stages only", w.path, ds_path,
         si.name, si.kind == ValueKind::Index ? "index" : "real");
  if (w.datasets.contains(ds_path))
    fail("{}: {} recorded twice (each position, layer and stage is traced once)", w.path, ds_path);

  try {
    const std::string prefix = series_prefix(key.series);
    if (!prefix.empty()) w.ensure_group(prefix);
    w.ensure_group(fmt::format("{}/pos_{}", prefix, key.position));
    w.ensure_group(ds_path.substr(0, ds_path.rfind('/')));
    w.write_row(ds_path, key, data, layout);
  } catch (const WriteFailure& failure) {
    w.fail_abandoned(failure);
  }
  w.datasets.insert(ds_path);
}

void TraceWriter::record_partial(const StageKey& key, int rank, const StageData& data) {
  Impl& w = *impl_;
  w.require_writing("record_partial()");
  if (info(key.stage).scope == Scope::Model || key.layer < 0 ||
      key.layer >= w.config.num_hidden_layers || key.position < 0 || rank < 0 ||
      rank >= RowShards::kMaxRanks || data.type == StageData::Type::I32 ||
      data.dims != stage_dims(w.config, key.stage, key.position) || data.size() != [&] {
        size_t n = 1;
        for (size_t d : data.dims) n *= d;
        return n;
      }())
    fail(
        "{}: rank {}'s partial sum of {} at layer {}, position {}: not a real row of that "
        "stage",
        w.path, rank, name(key.stage), key.layer, key.position);
  const std::string rank_group = fmt::format("/partials/rank_{}", rank);
  const std::string ds_path = trace_partial_path(rank, key.position, key.layer, key.stage);
  if (w.datasets.contains(ds_path)) fail("{}: {} recorded twice", w.path, ds_path);
  try {
    w.ensure_group("/partials");
    w.ensure_group(rank_group);
    w.ensure_group(fmt::format("{}/pos_{}", rank_group, key.position));
    w.ensure_group(ds_path.substr(0, ds_path.rfind('/')));
    StageKey k = key;
    k.series = Series::output;
    w.write_row(ds_path, k, data, {});
  } catch (const WriteFailure& failure) {
    w.fail_abandoned(failure);
  }
  w.datasets.insert(ds_path);
}

void TraceWriter::record_cache(int layer, const KvRows& rows, bool f64) {
  Impl& w = *impl_;
  w.require_writing("record_cache()");
  const size_t row = size_t(w.config.num_key_value_heads) * size_t(w.config.head_dim);
  const std::string group = fmt::format("/cache/layer_{}", layer);
  if (layer < 0 || layer >= w.config.num_hidden_layers)
    fail("{}: cache rows of layer {}: the model has {} layers", w.path, layer, w.config.num_hidden_layers);
  if (rows.count < 1 || rows.count > w.config.max_position_embeddings ||
      rows.k.size() != size_t(rows.count) * row || rows.v.size() != rows.k.size())
    fail("{}: cache rows of layer {}: {} positions with {} and {} values (a row is {})", w.path,
         layer, rows.count, rows.k.size(), rows.v.size(), row);
  if (w.groups.contains(group)) fail("{}: cache rows of layer {} recorded twice", w.path, layer);
  try {
    w.ensure_group("/cache");
    w.ensure_group(group);
    for (const auto& [name, values] : {std::pair{"k_rope", &rows.k}, {"v", &rows.v}}) {
      const std::string ds_path = group + "/" + name, doing = "writing " + ds_path;
      const std::array<hsize_t, 3> dims = {hsize_t(rows.count), hsize_t(w.config.num_key_value_heads),
                                           hsize_t(w.config.head_dim)};
      const Hid space = w.make(H5Screate_simple(3, dims.data(), nullptr), H5Sclose, doing);
      std::vector<float> narrow;
      if (!f64) narrow.assign(values->begin(), values->end());
      Hid ds = w.make(H5Dcreate2(w.file.get(), ds_path.c_str(), f64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE,
                                 space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose, doing);
      w.check(H5Dwrite(ds.get(), f64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                       H5P_DEFAULT, f64 ? static_cast<const void*>(values->data()) : narrow.data()) >= 0,
              doing);
      w.write_int_attr(ds.get(), "layer", layer, ds_path);
      w.write_int_attr(ds.get(), "first_position", 0, ds_path);
      w.check(ds.close() >= 0, doing);
    }
  } catch (const WriteFailure& failure) {
    w.fail_abandoned(failure);
  }
}

void TraceWriter::finish() {
  Impl& w = *impl_;
  if (w.state == Impl::State::finished) fail("{}: finish() called twice", w.path);
  w.require_writing("finish()");
  try {
    Hid root = w.make(H5Gopen2(w.file.get(), "/", H5P_DEFAULT), H5Gclose, "opening /");
    w.write_ints_attr(root.get(), "tokens", w.tokens.data(), w.tokens.size(), false, "/");
    w.write_ints_attr(root.get(), "positions", w.token_positions.data(), w.token_positions.size(),
                      false, "/");
    w.write_string_attr(root.get(), "run", json_text(w.run), "/");
    w.check(root.close() >= 0, "closing /");
    // Everything reaches the disk here, where a failure can still be redirected; the close
    // below only rewrites the superblock's end-of-file address in place.
    w.check(H5Fflush(w.file.get(), H5F_SCOPE_GLOBAL) >= 0, "flushing the trace");
  } catch (const WriteFailure& failure) {
    w.fail_abandoned(failure);
  }
  (void)w.group_plist.close();
  if (w.file.close() < 0) {
    const std::string detail = hdf5_error();
    w.abandon();
    w.abandoned_because = "closing failed";
    fail("{}: closing the trace failed (HDF5: {}); the unfinished trace was removed", w.path, detail);
  }
  std::error_code ec;
  fs::rename(w.tmp_path, w.path, ec);
  if (ec) {
    w.abandon();
    w.abandoned_because = "renaming failed";
    fail("{}: cannot move the finished trace {} into place ({}); it was removed", w.path,
         w.tmp_path, ec.message());
  }
  w.state = Impl::State::finished;
}

// ---- TraceReader -----------------------------------------------------------------------------

struct TraceReader::Impl {
  std::string path;
  TraceKind kind = TraceKind::trace;
  uint64_t file_size = 0;
  Hid file;
  std::unique_ptr<GlobalHeap> heap;
  TraceMeta meta;
  Config config;
  std::vector<TraceEntry> entries;       // output series
  std::map<std::string, StageKey> keys;  // every series, by path
  std::map<std::string, std::string> layouts;  // the "layout" attribute, where a dataset has one
  std::map<std::string, RowShards> shards_of;  // the "shards" attributes, where a dataset has them
  int partial_ranks = 0;                       // rank groups under /partials (the highest + 1)
  struct CacheRows {
    int count = 0;  // -1: k_rope and v disagree
    std::string k_path, v_path;
  };
  std::map<int, CacheRows> cache;  // by layer
  std::set<Series> series;

  std::string shown(std::string_view member_path) const { return printable(member_path, 120); }

  void read_meta(hid_t root) {
    const AttrReader attrs{path, file_size, *heap, root, "/"};
    if (!attrs.has("format")) fail("{}: not a gpt-oss-parity trace (no \"format\" attribute)", path);
    const auto format = attrs.str("format");
    if (format != kTraceFormat)
      fail("{}: not a gpt-oss-parity trace (format is {}, expected \"{}\")", path,
           quoted(format), kTraceFormat);
    const int version = attrs.int1("format_version");
    if (version < kOldestTraceFormatVersion || version > kTraceFormatVersion)
      fail("{}: not a gpt-oss-parity trace this build reads (format_version {}, expected {} to "
           "{})",
           path, version, kOldestTraceFormatVersion, kTraceFormatVersion);
    // Required: what the differ needs to pair two traces. Optional: descriptive facts, so that
    // traces written by other tools (h5py dumps of a PyTorch run) need not invent them.
    meta.backend = attrs.str("backend");
    meta.config = attrs.json("config");
    config = trace_config(meta.config, path);
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
    if (attrs.has("run_id")) {
      meta.run_id = attrs.str("run_id", kMaxRunId);
      if (!is_valid_run_id(meta.run_id))
        fail("{}: attribute \"run_id\" of / is {}, not 1 to {} characters of [0-9A-Za-z-]", path,
             quoted(meta.run_id), kMaxRunId);
    }
  }

  struct Link {
    std::string name;
    bool hard = false;
  };

  // A group's links in one pass (H5Literate): asking for the i-th name of a group is linear in
  // its size, so a loop over indices would take quadratic time in the positions. By name: every
  // group has that index; entries are sorted afterwards anyway.
  std::vector<Link> links(hid_t group, const std::string& group_path) const {
    std::vector<Link> out;
    auto collect = [](hid_t, const char* name, const H5L_info_t* link, void* data) -> herr_t {
      try {
        static_cast<std::vector<Link>*>(data)->push_back({name, link->type == H5L_TYPE_HARD});
        return 0;
      } catch (...) {
        return -1;  // no exception may cross the C library
      }
    };
    hsize_t idx = 0;
    if (H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect, &out) < 0)
      fail_hdf5(path, "listing " + (group_path.empty() ? std::string("/") : shown(group_path)));
    return out;
  }

  // The links of a group the layout names, which holds at least one: no writer leaves a group
  // empty, and a file of empty groups (thousands of positions with no rows) is not a trace.
  std::vector<Link> nonempty_links(hid_t group, const std::string& group_path) const {
    std::vector<Link> out = links(group, group_path);
    if (out.empty())
      fail("{}: {} is an empty group; a trace's groups hold the rows recorded under them", path,
           shown(group_path));
    return out;
  }

  // A member the trace layout names. Only hard links: a soft link could alias, an external one
  // would open another file (a FIFO, a device) on the reader's behalf.
  Hid open_member(hid_t group, const Link& link, const std::string& member_path, H5I_type_t type,
                  std::string_view what) const {
    if (!link.hard)
      fail("{}: {} is a soft or external link; a trace holds only its own groups and datasets",
           path, shown(member_path));
    Hid obj = checked(H5Oopen(group, link.name.c_str(), H5P_DEFAULT), H5Oclose, path,
                      "opening " + shown(member_path));
    if (H5Iget_type(obj.get()) != type) fail("{}: {} is not {}", path, shown(member_path), what);
    return obj;
  }

  // A capture holds its stage rows (/pos_<P>) and KV-cache rows (/cache), nothing else: the
  // series parity-trace computes are its own, and anything else is no part of a port's record.
  void check_capture_members(const std::vector<Link>& top) const {
    for (const Link& l : top) {
      if (l.name.starts_with("pos_") || l.name == "cache") continue;
      for (Series s : {Series::replay, Series::magnitude, Series::recompute,
                       Series::recompute_magnitude, Series::recompute_bias})
        if (l.name == series_name(s))
          fail("{}: /{} is not part of a capture: {} rows are what parity-trace computes, never "
               "what a port records (is this a trace of parity-trace rather than a capture?)",
               path, l.name, l.name);
      fail("{}: {} is not part of a capture, which holds /pos_<position>/... stage rows and "
           "/cache/layer_<layer>/ KV-cache rows only",
           path, shown("/" + l.name));
    }
  }

  void index_datasets(hid_t root) {
    const std::vector<Link> top = links(root, "");
    if (kind == TraceKind::capture) check_capture_members(top);
    index_series(root, top, "", Series::output);
    for (Series s : {Series::replay, Series::magnitude, Series::recompute,
                     Series::recompute_magnitude, Series::recompute_bias}) {
      const std::string group(series_name(s));
      const auto it = std::find_if(top.begin(), top.end(), [&](const Link& l) { return l.name == group; });
      if (it == top.end()) continue;
      const Hid g = open_member(root, *it, "/" + group, H5I_GROUP,
                                fmt::format("a group of {} datasets", group));
      index_series(g.get(), nonempty_links(g.get(), "/" + group), "/" + group, s);
    }
    std::sort(entries.begin(), entries.end(), [](const TraceEntry& x, const TraceEntry& y) {
      return std::tie(x.key.position, x.key.order, x.path) <
             std::tie(y.key.position, y.key.order, y.path);
    });
    meta.replay = series.contains(Series::replay);
    const auto partials =
        std::find_if(top.begin(), top.end(), [](const Link& l) { return l.name == "partials"; });
    if (partials != top.end()) index_partials(root, *partials);
    const auto cache = std::find_if(top.begin(), top.end(), [](const Link& l) { return l.name == "cache"; });
    if (cache != top.end()) index_cache(root, *cache);
  }

  // /cache/layer_<L>/k_rope and v: a capture's KV-cache rows of positions 0..n-1, [n, nKV, d].
  void index_cache(hid_t root, const Link& link) {
    const Hid g = open_member(root, link, "/cache", H5I_GROUP, "a group of KV-cache rows");
    for (const Link& layer_link : nonempty_links(g.get(), "/cache")) {
      const std::string layer_path = "/cache/" + layer_link.name;
      const auto layer = named_index(layer_link.name, "layer_");
      if (!layer || *layer >= config.num_hidden_layers)
        fail("{}: {} is not a group named layer_<layer> of the model's {} layers", path,
             shown(layer_path), config.num_hidden_layers);
      const Hid lg = open_member(g.get(), layer_link, layer_path, H5I_GROUP, "a group named layer_<layer>");
      for (const Link& ds_link : nonempty_links(lg.get(), layer_path)) {
        const std::string ds_path = layer_path + "/" + ds_link.name;
        if (ds_link.name != "k_rope" && ds_link.name != "v")
          fail("{}: {} is not k_rope or v, the cache rows a trace holds", path, shown(ds_path));
        const Hid ds = open_member(lg.get(), ds_link, ds_path, H5I_DATASET, "a dataset");
        const std::vector<uint64_t> dims = dims_of(ds.get(), ds_path);
        if (dims.size() != 3 || dims[1] != uint64_t(config.num_key_value_heads) ||
            dims[2] != uint64_t(config.head_dim) || dims[0] == 0 ||
            dims[0] > uint64_t(config.max_position_embeddings))
          fail("{}: {} holds {} values but cache rows are [positions, {}, {}] with 1 to {} "
               "positions",
               path, ds_path, dims_text(dims), config.num_key_value_heads, config.head_dim,
               config.max_position_embeddings);
        (void)check_array(ds.get(), ds_path,
                          {size_t(dims[0]), size_t(dims[1]), size_t(dims[2])}, ValueKind::Real,
                          fmt::format("the cache rows of layer {}", *layer), ds_link.name);
        auto& rows = cache[*layer];
        rows.count = rows.count == 0 || rows.count == int(dims[0]) ? int(dims[0]) : -1;
        (ds_link.name == "k_rope" ? rows.k_path : rows.v_path) = ds_path;
      }
    }
  }

  // /partials/rank_<r>/pos_<P>/layer_<L>/<stage>: a tensor-parallel group's partial sums, rows
  // of their stage's shape, checked as every row is; found by path, never outputs to compare.
  void index_partials(hid_t root, const Link& link) {
    const Hid g = open_member(root, link, "/partials", H5I_GROUP, "a group of partial sums");
    for (const Link& rank_link : nonempty_links(g.get(), "/partials")) {
      const std::string rank_path = "/partials/" + rank_link.name;
      const auto rank = named_index(rank_link.name, "rank_");
      if (!rank || *rank >= RowShards::kMaxRanks)
        fail("{}: {} is not a group named rank_<rank> (below {})", path, shown(rank_path),
             RowShards::kMaxRanks);
      const Hid rg =
          open_member(g.get(), rank_link, rank_path, H5I_GROUP, "a group named rank_<rank>");
      index_series(rg.get(), nonempty_links(rg.get(), rank_path), rank_path, Series::output, true);
      partial_ranks = std::max(partial_ranks, *rank + 1);
    }
  }

  void index_series(hid_t top, const std::vector<Link>& members, const std::string& prefix,
                    Series s, bool partial_rows = false) {
    for (const Link& pos_link : members) {
      if (!pos_link.name.starts_with("pos_")) continue;  // room for users' own annotations
      const std::string pos_path = prefix + "/" + pos_link.name;
      const auto position = parse_index(std::string_view(pos_link.name).substr(4));
      if (!position) fail("{}: {} is not a group named pos_<position>", path, shown(pos_path));
      if (*position >= config.max_position_embeddings)
        fail("{}: {}: position {} is beyond the model's context ({} positions)", path, pos_path,
             *position, config.max_position_embeddings);
      const Hid pos_group =
          open_member(top, pos_link, pos_path, H5I_GROUP, "a group named pos_<position>");
      for (const Link& scope_link : nonempty_links(pos_group.get(), pos_path)) {
        const std::string scope_path = pos_path + "/" + scope_link.name;
        std::optional<int> layer;
        if (scope_link.name == "model")
          layer = kModelLayer;
        else
          layer = named_index(scope_link.name, "layer_");
        if (!layer)
          fail("{}: {} is not a group named model or layer_<layer>", path, shown(scope_path));
        if (*layer >= config.num_hidden_layers)
          fail("{}: {}: layer {} but the trace's config has {} layers", path, scope_path, *layer,
               config.num_hidden_layers);
        const Hid scope_group = open_member(pos_group.get(), scope_link, scope_path, H5I_GROUP,
                                            "a group named model or layer_<layer>");
        for (const Link& ds_link : nonempty_links(scope_group.get(), scope_path))
          add_entry(scope_group.get(), scope_path, ds_link, *position, *layer, s, partial_rows);
      }
    }
  }

  void add_entry(hid_t group, const std::string& group_path, const Link& link, int position,
                 int layer, Series s, bool partial_row) {
    const std::string ds_path = group_path + "/" + link.name;
    const auto stage = stage_from_name(link.name);
    if (!stage) fail("{}: {} is not a dataset named after a stage", path, shown(ds_path));
    if (is_model_scope(*stage) != (layer == kModelLayer))
      fail("{}: {}: stage {} does not belong in {}", path, ds_path, link.name, group_path);
    const Hid ds = open_member(group, link, ds_path, H5I_DATASET, "a dataset");
    const AttrReader attrs{path, file_size, *heap, ds.get(), ds_path};
    const std::string stage_attr = attrs.str("stage", kMaxStageName);
    const int layer_attr = attrs.int1("layer"), position_attr = attrs.int1("position");
    if (stage_attr != link.name || layer_attr != layer || position_attr != position)
      fail("{}: {} has attributes stage={}, layer={}, position={} that disagree with its path",
           path, ds_path, quoted(stage_attr), layer_attr, position_attr);
    // The order sorts the rows and so decides which divergence is the first: it is the stage's
    // place in a position's execution order, the one every writer records.
    const int order = attrs.int1("order"), expected_order = execution_order(config, layer, *stage);
    if (order != expected_order)
      fail("{}: {} has attribute order={}, but stage {} of {} runs as number {} of a position",
           path, ds_path, order, link.name,
           layer == kModelLayer ? std::string("the model scope") : fmt::format("layer {}", layer),
           expected_order);
    const StageKey key{position, layer, *stage, order, s};
    (void)check_array(ds.get(), ds_path, stage_dims(config, *stage, position), info(*stage).kind,
                      fmt::format("a {} row at position {}", name(*stage), position), name(*stage));
    keys.emplace(ds_path, key);
    if (attrs.has("shards")) {
      const std::string text = attrs.str("shards", kMaxShards);
      int64_t elements = 1;
      for (size_t d : stage_dims(config, *stage, position)) elements *= int64_t(d);
      std::string why;
      std::optional<RowShards> shards = RowShards::parse(text, elements, why);
      if (!shards) fail("{}: {} has attribute shards={}: {}", path, ds_path, quoted(text, 60), why);
      if (attrs.has("shard_problem")) {
        shards->problem = attrs.str("shard_problem", kMaxShardProblem);
        shards->problem_rank = attrs.int1("shard_problem_rank");
        if (shards->problem_rank < -1 || shards->problem_rank >= shards->ranks)
          fail("{}: {} has attribute shard_problem_rank={}, not a rank of its {} (or -1)", path,
               ds_path, shards->problem_rank, shards->ranks);
      }
      shards_of.emplace(ds_path, std::move(*shards));
    }
    if (attrs.has("layout")) {
      std::string layout = attrs.str("layout", kMaxLayout);
      if (const std::string why = layout_problem(layout, *stage); !why.empty())
        fail("{}: {} has attribute layout={}: {}", path, ds_path, quoted(layout, 60), why);
      layouts.emplace(ds_path, std::move(layout));
    }
    if (partial_row) return;
    series.insert(s);
    if (s == Series::output) entries.push_back({ds_path, key});
  }

  // One dataset's values, after checking everything that decides how much is allocated.
  StageData read(const std::string& ds_path, const StageKey& key) const {
    return read_array(ds_path, stage_dims(config, key.stage, key.position), info(key.stage).kind,
                      fmt::format("a {} row at position {}", name(key.stage), key.position),
                      name(key.stage));
  }

  // The dims of a dataset, after checking that it is an array.
  std::vector<uint64_t> dims_of(hid_t ds, const std::string& ds_path) const {
    const std::string doing = "reading " + ds_path;
    const Hid space = checked(H5Dget_space(ds), H5Sclose, path, doing);
    if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
      fail("{}: {} holds a scalar or nothing; a stage row is an array", path, ds_path);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > H5S_MAX_RANK) fail_hdf5(path, doing);
    std::array<hsize_t, H5S_MAX_RANK> extent{};
    if (H5Sget_simple_extent_dims(space.get(), extent.data(), nullptr) != rank) fail_hdf5(path, doing);
    return std::vector<uint64_t>(extent.begin(), extent.begin() + rank);
  }

  // What reading a dataset allocates and how: its element type and count.
  struct ArrayInfo {
    StageData::Type type = StageData::Type::F64;
    hid_t mem_type = H5T_NATIVE_DOUBLE;
    int64_t n = 0;
  };

  // Checks everything that decides how a dataset of `expected` dims and `kind` is read: its data
  // is in this file, its shape is `expected`, its element type fits `kind`, and the file holds
  // (or, compressed, could inflate to) its size. `what` names the expected shape's meaning in
  // messages. Called for every dataset when the trace opens, and again before each read.
  ArrayInfo check_array(hid_t ds, const std::string& ds_path, const std::vector<size_t>& expected,
                        ValueKind kind, const std::string& what, std::string_view stage) const {
    const std::string doing = "reading " + ds_path;
    // Where the data lives: in this file. External storage would read other files (a FIFO, a
    // device); a virtual dataset maps other files' datasets.
    const Hid dcpl = checked(H5Dget_create_plist(ds), H5Pclose, path, doing);
    const int external = H5Pget_external_count(dcpl.get());
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    const int filters = H5Pget_nfilters(dcpl.get());
    if (external < 0 || layout < 0 || filters < 0) fail_hdf5(path, doing);
    if (external > 0 || layout == H5D_VIRTUAL)
      fail("{}: {} keeps its data in other files ({}); a trace's data is in the trace", path,
           ds_path, external > 0 ? "external storage" : "a virtual dataset");

    // The shape: its stage's rule at its position under the trace's config.
    const std::vector<uint64_t> dims = dims_of(ds, ds_path);
    if (!std::equal(dims.begin(), dims.end(), expected.begin(), expected.end()))
      fail("{}: {} holds {} values but {} is {} under the trace's config", path, ds_path,
           dims_text(dims), what, dims_text(expected));
    ArrayInfo a;
    a.n = 1;
    for (size_t d : expected) a.n = checked_mul(a.n, int64_t(d), path + ": " + ds_path);

    // The element type: int32 for index stages, float64 or float32 for real ones.
    const Hid type = checked(H5Dget_type(ds), H5Tclose, path, doing);
    const H5T_class_t cls = H5Tget_class(type.get());
    const size_t size = H5Tget_size(type.get());
    if (kind == ValueKind::Index) {
      if (cls != H5T_INTEGER || size != 4 || H5Tget_sign(type.get()) != H5T_SGN_2)
        fail("{}: {} is not int32, the type of the index stage {}", path, ds_path, stage);
      a.type = StageData::Type::I32;
      a.mem_type = H5T_NATIVE_INT32;
    } else if (cls == H5T_FLOAT && (size == 8 || size == 4)) {
      a.type = size == 8 ? StageData::Type::F64 : StageData::Type::F32;
      a.mem_type = size == 8 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
    } else {
      fail("{}: {} is not float64 or float32, the types of the real stage {}", path, ds_path, stage);
    }

    // The size: no more than the file holds (or, compressed, could inflate to).
    const int64_t bytes = checked_mul(a.n, int64_t(size), path + ": " + ds_path);
    const int64_t file_bytes = int64_t(std::min<uint64_t>(file_size, uint64_t(std::numeric_limits<int64_t>::max())));
    const int64_t limit = layout == H5D_CHUNKED && filters > 0
                              ? checked_mul(file_bytes, kMaxInflation, path)
                              : file_bytes;
    if (bytes > limit)
      fail("{}: {} declares {} bytes of data but the file is {} bytes", path, ds_path, bytes,
           file_size);
    return a;
  }

  // One dataset's values of `expected` dims and `kind`, after check_array.
  StageData read_array(const std::string& ds_path, const std::vector<size_t>& expected,
                       ValueKind kind, const std::string& what, std::string_view stage) const {
    const std::string doing = "reading " + ds_path;
    const Hid ds = checked(H5Dopen2(file.get(), ds_path.c_str(), H5P_DEFAULT), H5Dclose, path, doing);
    const ArrayInfo a = check_array(ds.get(), ds_path, expected, kind, what, stage);
    StageData d;
    d.dims = expected;
    d.type = a.type;
    void* buffer = nullptr;
    switch (d.type) {
      case StageData::Type::F64: d.f64.resize(size_t(a.n)); buffer = d.f64.data(); break;
      case StageData::Type::F32: d.f32.resize(size_t(a.n)); buffer = d.f32.data(); break;
      case StageData::Type::I32: d.i32.resize(size_t(a.n)); buffer = d.i32.data(); break;
    }
    if (H5Dread(ds.get(), a.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer) < 0) fail_hdf5(path, doing);
    return d;
  }
};

namespace {
// The version of the file's superblock, read from the file itself (HDF5 looks for its
// signature at 0, 512, 1024, 2048, ...); -1 when there is none.
int superblock_version(const std::string& path, uint64_t file_size) {
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open for reading ({})", path, std::strerror(errno));
  int version = -1;
  for (uint64_t at = 0; at + 9 <= file_size; at = at == 0 ? 512 : 2 * at) {
    unsigned char head[9];
    if (::pread(fd, head, sizeof head, off_t(at)) != ssize_t(sizeof head)) break;
    if (std::memcmp(head, kSignature, sizeof kSignature) == 0) {
      version = head[8];
      break;
    }
  }
  ::close(fd);
  return version;
}
}  // namespace

TraceReader::TraceReader(const std::string& path, TraceKind kind)
    : impl_(std::make_unique<Impl>()) {
  silence_hdf5();
  // A trace needs only the filters built into the library: a file naming an unknown filter
  // must not make HDF5 load a plugin from HDF5_PLUGIN_PATH.
  H5PLset_loading_state(0);
  Impl& r = *impl_;
  r.path = path;
  r.kind = kind;
  // Regular files only: a FIFO or a device would block the open or never end.
  r.file_size = require_regular_file(path, std::numeric_limits<uint64_t>::max(), "trace");
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) fail_hdf5(path, "opening the trace");
  if (is_hdf5 == 0) fail("{}: not an HDF5 file (a gpt-oss-parity trace is HDF5)", path);
  // Superblocks 0 and 1 go with the HDF5 1.6 object format, whose metadata has no checksums:
  // HDF5 1.10 decodes a damaged object header of that format unchecked and crashes. Every
  // trace this project wrote has superblock 2 or later; another tool's file is refused here,
  // before HDF5 reads any of its objects, with the way to convert it.
  const int superblock = superblock_version(path, r.file_size);
  if (superblock >= 0 && superblock < 2)
    fail("{}: written in an HDF5 format without metadata checksums (superblock version {}), "
         "which HDF5 1.10 cannot read safely; rewrite it in the newest format (h5repack --latest "
         "IN OUT, or h5py.File(..., libver=\"latest\"))",
         path, superblock);
  const Hid fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, path, "opening the trace");
  if (H5Pset_fapl_sec2(fapl.get()) < 0) fail_hdf5(path, "opening the trace");
  r.file = checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose, path,
                   "opening the trace");
  register_raw_heap_id(path);
  r.heap = std::make_unique<GlobalHeap>(r.path, r.file_size, r.file.get());
  const Hid root = checked(H5Gopen2(r.file.get(), "/", H5P_DEFAULT), H5Gclose, path, "opening /");
  r.read_meta(root.get());
  r.index_datasets(root.get());
}

TraceReader::~TraceReader() = default;

const TraceMeta& TraceReader::meta() const { return impl_->meta; }
const Config& TraceReader::config() const { return impl_->config; }
const std::string& TraceReader::path() const { return impl_->path; }
const std::vector<TraceEntry>& TraceReader::entries() const { return impl_->entries; }
bool TraceReader::has(const std::string& dataset_path) const {
  return impl_->keys.contains(dataset_path);
}
bool TraceReader::has_series(Series s) const { return impl_->series.contains(s); }
int TraceReader::cache_length() const {
  const Impl& r = *impl_;
  if (r.cache.empty()) return 0;
  int n = -1;
  for (int layer = 0; layer < r.config.num_hidden_layers; ++layer) {
    const auto it = r.cache.find(layer);
    if (it == r.cache.end() || it->second.k_path.empty() || it->second.v_path.empty())
      fail("{}: the KV-cache rows of layer {} (/cache/layer_{}/k_rope and v) are missing, while "
           "other layers have theirs",
           r.path, layer, layer);
    if (it->second.count < 0 || (n >= 0 && it->second.count != n))
      fail("{}: the KV-cache rows of layer {} cover {} positions, other layers' {}", r.path, layer,
           it->second.count, n);
    n = it->second.count;
  }
  return n;
}

KvRows TraceReader::cache_rows(int layer) const {
  const Impl& r = *impl_;
  const int n = cache_length();
  const auto it = r.cache.find(layer);
  if (n == 0 || it == r.cache.end()) fail("{}: no KV-cache rows of layer {}", r.path, layer);
  const std::vector<size_t> dims = {size_t(n), size_t(r.config.num_key_value_heads),
                                    size_t(r.config.head_dim)};
  KvRows rows;
  rows.count = n;
  for (const auto& [p, out] : {std::pair{&it->second.k_path, &rows.k}, {&it->second.v_path, &rows.v}}) {
    const std::string stage = p == &it->second.k_path ? "k_rope" : "v";
    const StageData d = r.read_array(*p, dims, ValueKind::Real,
                                     fmt::format("the cache rows of layer {}", layer), stage);
    out->resize(d.size());
    for (size_t i = 0; i < d.size(); ++i) (*out)[i] = d.at(i);
  }
  return rows;
}

std::string TraceReader::layout(const std::string& dataset_path) const {
  const auto it = impl_->layouts.find(dataset_path);
  return it == impl_->layouts.end() ? std::string() : it->second;
}

StageData TraceReader::read(const std::string& dataset_path) const {
  const auto it = impl_->keys.find(dataset_path);
  if (it == impl_->keys.end()) fail("{}: no dataset {}", impl_->path, dataset_path);
  StageData d = impl_->read(dataset_path, it->second);
  d.shards = shards(dataset_path);
  return d;
}

int TraceReader::partial_ranks() const {
  return impl_->partial_ranks;
}

std::string trace_partial_path(int rank, int position, int layer, Stage s) {
  return fmt::format("/partials/rank_{}{}", rank, trace_dataset_path(position, layer, s));
}

std::optional<RowShards> TraceReader::shards(const std::string& dataset_path) const {
  const auto it = impl_->shards_of.find(dataset_path);
  if (it == impl_->shards_of.end()) return std::nullopt;
  return it->second;
}

bool TraceCandidateRows::has(int position, int layer, Stage s) const {
  return t_.has(trace_dataset_path(position, layer, s));
}

StageData TraceCandidateRows::read(int position, int layer, Stage s) const {
  return t_.read(trace_dataset_path(position, layer, s));
}

}  // namespace parity
