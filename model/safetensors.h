// safetensors reading over mmap: one file, or a sharded checkpoint resolved through
// model.safetensors.index.json. Tensors are views into the mapping; nothing is copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace parity {

enum class DType { BF16, F16, F32, F64, U8, I32 };
std::string_view dtype_name(DType d);
size_t dtype_size(DType d);

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  // Element count. Views made by SafetensorsFile have shapes whose products were checked, so
  // this cannot overflow for them; numel_checked() throws for any other view instead.
  int64_t numel() const;
  int64_t numel_checked() const;
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  std::string shape_str() const;  // "[2880, 4096]"
};

// A read-only memory mapping of one .safetensors file, its header parsed and checked: a
// regular file (never a FIFO or device), header length within the file and at most
// kMaxHeaderBytes, JSON nesting bounded, offsets inside the data section, shapes whose element
// and byte counts fit in 64 bits and match dtype x shape, no overlaps. Any violation throws
// parity::Error naming the file and the tensor.
class SafetensorsFile {
 public:
  // The safetensors format's own cap on the header (its reference reader refuses more); a
  // real header is well under 1 MB.
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file as mapped (header and data).
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(map_), size_}; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory (single model.safetensors, or shards listed in
// model.safetensors.index.json, or every *.safetensors when neither exists). The index is a
// regular file of at most kMaxIndexBytes; each shard it names must be a plain file name in the
// directory (no path, no "..": an index cannot open files elsewhere on the machine).
class TensorStore {
 public:
  static constexpr uint64_t kMaxIndexBytes = uint64_t(16) << 20;  // a real one is ~100 KB
  explicit TensorStore(const std::string& dir);
  const TensorView& get(const std::string& name) const;  // throws naming the directory
  const TensorView* find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;
  // Content fingerprint over every byte of every file (model/fingerprint.h: XXH3-128, cached
  // beside the checkpoint by size, inode and times).
  std::string fingerprint() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// Writing, for parity-synth and tests: a streaming writer that emits the header first (from a
// declared tensor list) and then the data of each tensor in declaration order.
class SafetensorsWriter {
 public:
  struct Decl {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(std::string path, std::vector<Decl> decls,
                    std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();
  // Append the next tensor's bytes (may be called several times per tensor, in order).
  void write(const void* data, size_t nbytes);
  // Checks every declared byte was written; renames the temporary file into place.
  void finish();
  size_t data_bytes() const { return total_; }

 private:
  // Closes and removes the temporary file, then throws one Error naming the file, `what` failed
  // and errno's text (a full disk: "No space left on device").
  [[noreturn]] void give_up(std::string_view what, int err);

  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  size_t total_ = 0, written_ = 0;
  bool finished_ = false;
};

}  // namespace parity
