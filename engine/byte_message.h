// Messages between processes (engine/mpi_work.h, engine/step_message.h) as flat byte strings of
// fixed-size fields in this host's byte order (the ranks of one MPI world run one build): a
// Writer appends, a Reader takes in order and throws parity::Error, one line, on a message that
// ends early or names a vector longer than what is left.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "model/error.h"

namespace parity {

class ByteWriter {
 public:
  template <typename T>
  ByteWriter& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    buf_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  template <typename T>
  ByteWriter& put_vector(const std::vector<T>& v) {
    put(uint64_t(v.size()));
    if (!v.empty()) buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    return *this;
  }
  ByteWriter& put_string(const std::string& s) {
    put(uint64_t(s.size()));
    buf_ += s;
    return *this;
  }
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    need(sizeof(T));
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    PARITY_CHECK(n <= (b_.size() - at_) / sizeof(T), "message: a vector of {} past its end", n);
    std::vector<T> v(n);
    // An empty vector's data() may be null, and memcpy's pointers must not be, even for 0 bytes.
    if (n > 0) std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s(b_.substr(at_, n));
    at_ += n;
    return s;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  void need(uint64_t n) const {
    PARITY_CHECK(n <= b_.size() - at_, "message: {} bytes past its end", n);
  }
  std::string_view b_;
  size_t at_ = 0;
};

}  // namespace parity
