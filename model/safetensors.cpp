#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "model/error.h"
#include "model/fingerprint.h"
#include "model/untrusted.h"

namespace parity {
namespace fs = std::filesystem;
using nlohmann::json;

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::BF16:
    case DType::F16: return 2;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

namespace {


// Tensor and shard names come from the files: quoted, and short enough that a line naming two
// of them and a path stays readable.
std::string name_of(const std::string& n) { return quoted(n, 64); }

// A shard named by the index must be a file of the checkpoint directory itself. With no '/'
// (so not absolute either) and not "." or "..", a name cannot leave the directory; a NUL would
// cut the path short of what the check saw. 255 bytes is the longest name a Linux file system
// holds.
bool plain_file_name(const std::string& n) {
  return !n.empty() && n.size() <= 255 && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos && n != "." && n != "..";
}

}  // namespace

static bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {{"BF16", DType::BF16}, {"F16", DType::F16},
                                                        {"F32", DType::F32},   {"F64", DType::F64},
                                                        {"U8", DType::U8},     {"I32", DType::I32}};
  for (const auto& [n, d] : table)
    if (s == n) {
      *out = d;
      return true;
    }
  return false;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t TensorView::numel_checked() const {
  int64_t n = 1;
  for (auto d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      fail("{}: tensor {} has shape {}, whose element count does not fit in 64 bits", file,
           name_of(name), shape_str());
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. The type
  // is then checked on this descriptor (not on the path, which could change in between): only
  // a regular file is mapped, never a FIFO, socket or device.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot stat ({})", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: is not a regular file (a directory, FIFO, socket or device), so it cannot be a "
         "safetensors file",
         path);
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("{}: truncated safetensors file ({} bytes; the 8-byte header length is missing)", path, size_);
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("{}: mmap failed ({})", path, std::strerror(map_err));
  }
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);  // little-endian on every platform we build for
    // Both in 64 bits: size_ >= 8 was checked, so size_ - 8 cannot wrap.
    if (header_len > uint64_t(size_) - 8)
      fail("{}: header length {} exceeds the file size {} (truncated or not a safetensors file)",
           path, header_len, size_);
    if (header_len > kMaxHeaderBytes)
      fail("{}: absurd header length {} (over {} bytes)", path, header_len, kMaxHeaderBytes);
    // parse_json bounds the nesting (a 100,000-deep dtype would overflow the stack) and names
    // the file in every error, a number out of range (1e400) included.
    const json header =
        parse_json(std::string_view(reinterpret_cast<const char*>(base + 8), size_t(header_len)),
                   path + " (header)");
    if (!header.is_object()) fail("{}: header is not a JSON object", path);
    const uint8_t* data = base + 8 + header_len;
    const uint64_t data_size = uint64_t(size_) - 8 - header_len;
    struct Span {
      uint64_t begin, end;
      std::string name;
      bool operator<(const Span& o) const {
        return std::tie(begin, end, name) < std::tie(o.begin, o.end, o.name);
      }
    };
    std::vector<Span> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (it->is_object())
          for (auto m = it->begin(); m != it->end(); ++m)
            if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      const json& t = *it;
      const std::string& name = it.key();
      if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
        fail("{}: tensor {} lacks dtype, shape or data_offsets", path, name_of(name));
      TensorView v;
      v.name = name;
      v.file = path;
      const json& dtype = t.at("dtype");
      if (!dtype.is_string() || !parse_dtype(dtype.get_ref<const std::string&>(), &v.dtype))
        fail("{}: tensor {} has unsupported dtype {}", path, name_of(name), json_excerpt(dtype));
      const json& shape = t.at("shape");
      if (!shape.is_array()) fail("{}: tensor {} shape is not an array", path, name_of(name));
      // Every dimension a non-negative int64, and the product of the non-zero ones (so every
      // partial product a reader may form, whatever the order) within int64: a shape like
      // [0, 2^62, 2^62] has no elements but would overflow dim(1) * dim(2).
      int64_t product = 1;
      for (const auto& d : shape) {
        if (!d.is_number_unsigned() ||
            d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
          fail("{}: tensor {} has a bad shape {}", path, name_of(name), json_excerpt(shape));
        const int64_t n = int64_t(d.get<uint64_t>());
        if (n != 0 && __builtin_mul_overflow(product, n, &product))
          fail("{}: tensor {} has an absurd shape {} (element count overflows)", path,
               name_of(name), json_excerpt(shape));
        v.shape.push_back(n);
      }
      const json& off = t.at("data_offsets");
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail("{}: tensor {} has malformed data_offsets {}", path, name_of(name), json_excerpt(off));
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e || e > data_size)
        fail("{}: tensor {} data_offsets [{}, {}] lie past the end of the data ({} bytes)", path,
             name_of(name), b, e, data_size);
      // dtype x shape in bytes, overflow-checked: a shape like [2^32, 2^32] must not wrap to a
      // size that matches empty offsets (and numel() must never overflow later).
      const int64_t numel = v.numel_checked();
      uint64_t expect = 0;
      if (__builtin_mul_overflow(uint64_t(numel), uint64_t(dtype_size(v.dtype)), &expect))
        fail("{}: tensor {} has an absurd shape {} (byte size overflows)", path, name_of(name),
             json_excerpt(shape));
      if (e - b != expect)
        fail("{}: tensor {} holds {} bytes but {} {} needs {}", path, name_of(name), e - b,
             dtype_name(v.dtype), v.shape_str(), expect);
      v.data = data + b;
      v.nbytes = size_t(e - b);
      spans.push_back({b, e, name});
      tensors_.emplace(name, std::move(v));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].begin < spans[i - 1].end)
        fail("{}: tensor data ranges overlap: {} [{}, {}] and {} [{}, {}]", path,
             name_of(spans[i - 1].name), spans[i - 1].begin, spans[i - 1].end,
             name_of(spans[i].name), spans[i].begin, spans[i].end);
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

TensorStore::TensorStore(const std::string& dir) : dir_(dir) {
  std::error_code ec;  // the error_code forms: a permission error is an Error line, not a throw
  if (!fs::is_directory(dir, ec))
    fail("{}: not a directory (expected a checkpoint directory)", dir);
  std::vector<std::string> files;
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index, ec)) {
    // A regular file of bounded size (a FIFO would block, /dev/zero read forever), parsed with
    // bounded nesting; a real index is tens of KB.
    const json j = parse_json(read_small_file(index, kMaxIndexBytes, "shard index"), index);
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      fail("{}: has no \"weight_map\" object", index);
    const json& map = j.at("weight_map");
    if (map.empty()) fail("{}: \"weight_map\" names no tensors", index);
    std::set<std::string> shards;  // a set: the index names each shard once per tensor
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->is_string())
        fail("{}: weight_map entry {} is not a file name ({})", index, name_of(it.key()),
             json_excerpt(*it));
      const std::string& shard = it->get_ref<const std::string&>();
      if (!plain_file_name(shard))
        fail("{}: shard {} (of tensor {}) is not a plain file name in the checkpoint directory",
             index, quoted(shard, 48), quoted(it.key(), 32));
      weight_map[it.key()] = shard;
      shards.insert(shard);
    }
    files.assign(shards.begin(), shards.end());
    for (const auto& f : files)
      if (!fs::exists(fs::path(dir) / f, ec))
        fail("{}: names shard {}, which is missing from {}", index, name_of(f), dir);
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".safetensors") files.push_back(it->path().filename().string());
    if (ec) fail("{}: cannot list the directory ({})", dir, ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty())
      fail("{}: no model.safetensors, no model.safetensors.index.json and no *.safetensors file", dir);
  }
  for (const auto& f : files) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / f).string()));
    for (const auto& [name, view] : files_.back()->tensors()) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(name);
        if (w == weight_map.end() || w->second != f) continue;  // the index decides
      }
      if (index_.count(name))
        fail("{}: tensor {} appears in more than one file", dir, name_of(name));
      index_[name] = &view;
    }
  }
  for (const auto& [name, f] : weight_map)
    if (!index_.count(name))
      fail("{}: index names tensor {} in {}, but that file does not hold it", dir, name_of(name),
           name_of(f));
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (v == nullptr) fail("{}: missing tensor {}", dir_, name_of(name));
  return *v;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : index_) n.push_back(k);
  return n;
}

std::string TensorStore::fingerprint() const {
  std::vector<FingerprintFile> files;
  for (const auto& f : files_) files.push_back({fs::path(f->path()).filename().string(), f->bytes()});
  return checkpoint_fingerprint(dir_, files);
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<Decl> decls,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_(path_ + ".partial") {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t off = 0;
  for (const auto& d : decls) {
    int64_t n = int64_t(dtype_size(d.dtype));
    for (auto s : d.shape) {
      if (s < 0) fail("{}: tensor {} declared with a negative dimension", path_, name_of(d.name));
      n = checked_mul(n, s, path_);
    }
    header[d.name] = {{"dtype", dtype_name(d.dtype)},
                      {"shape", d.shape},
                      {"data_offsets", {off, checked_add(off, n, path_)}}};
    off += n;
  }
  total_ = size_t(off);
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) fail("{}: cannot create {} ({})", path_, tmp_, std::strerror(errno));
  const uint64_t len = h.size();
  // No destructor runs for a constructor that throws: give_up removes the file itself.
  if (std::fwrite(&len, 8, 1, f_) != 1 || std::fwrite(h.data(), 1, h.size(), f_) != h.size())
    give_up("writing the header failed", errno);
}

void SafetensorsWriter::give_up(std::string_view what, int err) {
  if (f_ != nullptr) std::fclose(f_);
  f_ = nullptr;
  finished_ = true;  // nothing left for the destructor
  std::remove(tmp_.c_str());
  fail("{}: {} ({}); the partial file {} was removed", path_, what,
       err != 0 ? std::strerror(err) : "no reason given", tmp_);
}

void SafetensorsWriter::write(const void* data, size_t nbytes) {
  if (finished_) fail("{}: written after it was finished or abandoned", path_);
  if (written_ + nbytes > total_) fail("{}: more bytes written than declared", tmp_);
  if (std::fwrite(data, 1, nbytes, f_) != nbytes) give_up("writing failed", errno);
  written_ += nbytes;
}

void SafetensorsWriter::finish() {
  if (finished_) fail("{}: finished twice, or after it was abandoned", path_);
  if (written_ != total_) fail("{}: {} of {} declared bytes written", tmp_, written_, total_);
  // A full disk often shows only here, when the buffered end of the data is written out.
  if (std::fflush(f_) != 0) give_up("writing failed", errno);
  const int closed = std::fclose(f_);
  const int err = errno;
  f_ = nullptr;
  if (closed != 0) give_up("closing failed", err);
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) give_up("moving it into place failed", ec.value());
  finished_ = true;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_ != nullptr) std::fclose(f_);
  if (!finished_) std::remove(tmp_.c_str());
}

}  // namespace parity
