// Fuzzes the capture library's C API (capture/parity_capture.h) as a port drives it: the input is
// a sequence of calls (open with a few token ids, record and record_copy with fuzzed stages,
// positions, layers, slots, dtypes, layouts and counts, record_cache, append_tokens,
// row_elements, close — twice —, abandon) on two handles that share one output path in a
// temporary directory, against the tiny synthetic checkpoint (written once).
//
// Beyond "no crash": every failed call leaves a one-line message; close() succeeds only into a
// file the trace reader accepts; a closed or abandoned handle is NULL and a second close of it a
// no-op; and once no handle is open, the directory holds the finished capture or nothing — never
// a temporary file.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "model/config.h"
#include "model/stages.h"
#include "model/synth.h"
#include "parity_capture.h"
#include "tracer/trace_file.h"

namespace {

namespace fs = std::filesystem;

const std::string kName = "capture\n\x1b[1m.h5";

struct Setup {
  std::string model;  // the tiny checkpoint
  std::string dir;    // where captures are written
  std::string path;   // the one output path of both handles
  parity::Config config;
};

const Setup& setup() {
  static const Setup s = [] {
    Setup t;
    t.model = parity::fuzz::process_temp_dir("capture_api_fuzz-model");
    const parity::SynthSpec spec = parity::synth_preset("tiny");
    parity::write_synthetic_checkpoint(spec, t.model, false);
    t.config = spec.config;
    t.dir = parity::fuzz::process_temp_dir("capture_api_fuzz-out");
    t.path = t.dir + "/" + kName;  // a newline and an escape: every message names the path
    return t;
  }();
  return s;
}

// The bytes of the input, read front to back; zeros once they run out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | byte();
    return v;
  }
  // Up to `max` bytes as they are (text that may hold anything).
  std::string text(size_t max) {
    const size_t n = std::min<size_t>(byte() % (max + 1), size_ - std::min(at_, size_));
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

void check_failure(int rc) {
  if (rc == PARITY_CAPTURE_OK) return;
  FUZZ_REQUIRE(rc > 0 && rc <= PARITY_CAPTURE_ERR_COPY);
  const std::string m = parity_capture_last_error();
  FUZZ_REQUIRE(!m.empty() && m.size() < 2048);
  FUZZ_REQUIRE(m.find('\n') == std::string::npos);
}

// The capture's directory holds nothing but, perhaps, the finished capture.
void check_no_temporary_file() {
  for (const auto& e : fs::directory_iterator(setup().dir))
    FUZZ_REQUIRE(e.path().filename() == kName);
}

// A stage name: mostly one of the list, sometimes text of the input, sometimes null.
std::string stage_name(Input& in, bool& null_name) {
  const uint8_t b = in.byte();
  null_name = b == 0xff;
  if (b < 2 * parity::kStages.size()) return std::string(parity::kStages[b % parity::kStages.size()].name);
  return in.text(12);
}

parity_capture_dtype dtype(Input& in) {
  const uint8_t b = in.byte();
  if (b < 240) return parity_capture_dtype(b % 5);
  return parity_capture_dtype(int32_t(in.u32()));  // anything, refused unless one of the five
}

unsigned layout(Input& in) {
  const uint8_t b = in.byte();
  return b < 0xf0 ? unsigned(b & 0x7f) : in.u32();
}

// A count: one a record of some stage really has (a whole row, one slot, a qkv part, an att row
// without the sink) or any other.
size_t count(Input& in, parity_capture* cap, const char* stage, int position) {
  const parity::Config& c = setup().config;
  const size_t row = parity_capture_row_elements(cap, stage, position);
  switch (in.byte() % 7) {
    case 0:
    case 1:
      return row;
    case 2:
      return row / size_t(c.num_experts_per_tok);
    case 3:
      return size_t(c.q_dim());
    case 4:
      return size_t(c.kv_dim());
    case 5:
      return size_t(c.num_attention_heads) * size_t(std::max(position + 1, 0));
    default:
      return in.byte() < 0xf0 ? size_t(in.byte()) : size_t(in.u32()) << 16;
  }
}

// A buffer of `n` elements of up to 8 bytes, filled from the input (NaN, inf, any index);
// counts past any row of the tiny model get a small buffer the call must not read past (it
// refuses the count first).
std::vector<unsigned char> buffer(Input& in, size_t n) {
  const size_t bytes = n <= (size_t(1) << 16) ? n * 8 : 64;
  std::vector<unsigned char> b(std::max<size_t>(bytes, 1));
  const uint8_t fill = in.byte();
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(fill + (i & 3) * 37);
  return b;
}

int copy_ok(void* dst, const void* src, size_t bytes, void*) {
  std::memcpy(dst, src, bytes);
  return 0;
}
int copy_fails(void*, const void*, size_t, void*) { return 3; }

void one_call(Input& in, parity_capture* (&caps)[2]) {
  const Setup& s = setup();
  const uint8_t op = in.byte();
  parity_capture*& cap = caps[op & 1];
  switch ((op >> 1) % 9) {
    case 0: {  // open
      if (cap != nullptr) return;
      std::vector<int32_t> tokens(in.byte() % 7);
      for (int32_t& t : tokens) t = in.byte() < 0xf8 ? int32_t(in.byte()) * 4 : int32_t(in.u32());
      static const char* const kPrecisions[] = {nullptr, "float32", "bfloat16", "float64", "fp8"};
      const std::string port = in.text(8);
      const parity_capture_options o{port.c_str(), kPrecisions[in.byte() % 5], "fuzz"};
      const int rc = parity_capture_open(&cap, s.path.c_str(), s.model.c_str(), tokens.data(),
                                         tokens.size(), in.byte() & 1 ? &o : nullptr);
      check_failure(rc);
      FUZZ_REQUIRE((rc == PARITY_CAPTURE_OK) == (cap != nullptr));
      return;
    }
    case 1:
    case 2: {  // record, record_copy
      bool null_name = false;
      const std::string stage = stage_name(in, null_name);
      const int position = int(in.byte() % 9) - 1, layer = int(in.byte() % 6) - 1,
                slot = int(in.byte() % 6) - 1;
      const parity_capture_dtype dt = dtype(in);
      const unsigned lay = layout(in);
      const size_t n = count(in, cap, stage.c_str(), position);
      std::vector<unsigned char> data = buffer(in, n);
      const char* name = null_name ? nullptr : stage.c_str();
      const void* p = in.byte() == 0xff ? nullptr : data.data();
      if (((op >> 1) % 9) == 1) {
        check_failure(parity_capture_record(cap, name, position, layer, slot, p, dt, n, lay));
      } else {
        const uint8_t how = in.byte() % 3;
        const parity_capture_copy_fn fn = how == 0 ? nullptr : how == 1 ? copy_ok : copy_fails;
        check_failure(
            parity_capture_record_copy(cap, name, position, layer, slot, p, dt, n, lay, fn, nullptr));
      }
      return;
    }
    case 3: {  // record_cache
      const int layer = int(in.byte() % 6) - 1;
      const size_t rows = in.byte() % 8;
      const parity_capture_dtype dt = dtype(in);
      const unsigned lay = layout(in);
      const size_t n = rows * size_t(s.config.kv_dim());
      std::vector<unsigned char> k = buffer(in, n), v = buffer(in, n);
      check_failure(parity_capture_record_cache(cap, layer, rows, in.byte() == 0xff ? nullptr : k.data(),
                                                v.data(), dt, lay));
      return;
    }
    case 4: {  // append_tokens
      std::vector<int32_t> tokens(in.byte() % 3);
      for (int32_t& t : tokens) t = in.byte() < 0xf8 ? int32_t(in.byte()) * 4 : int32_t(in.u32());
      check_failure(parity_capture_append_tokens(cap, tokens.empty() ? nullptr : tokens.data(),
                                                 tokens.size()));
      return;
    }
    case 5: {  // row_elements
      bool null_name = false;
      const std::string stage = stage_name(in, null_name);
      (void)parity_capture_row_elements(cap, null_name ? nullptr : stage.c_str(),
                                        int(in.byte() % 9) - 1);
      return;
    }
    case 6:
    case 7: {  // close, twice
      const bool was_open = cap != nullptr;
      const int rc = parity_capture_close(&cap);
      check_failure(rc);
      FUZZ_REQUIRE(cap == nullptr);
      FUZZ_REQUIRE(parity_capture_close(&cap) == PARITY_CAPTURE_OK);
      if (was_open && rc == PARITY_CAPTURE_OK) {
        FUZZ_REQUIRE(fs::is_regular_file(s.path));
        try {
          const parity::TraceReader r(s.path);
        } catch (...) {
          FUZZ_REQUIRE(false);  // close() published something the reader refuses
        }
      }
      return;
    }
    default:  // abandon, twice
      parity_capture_abandon(&cap);
      FUZZ_REQUIRE(cap == nullptr);
      parity_capture_abandon(&cap);
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = setup();
  Input in(data, size);
  parity_capture* caps[2] = {nullptr, nullptr};
  // Opening loads the checkpoint: a few calls per input keep an input cheap.
  for (int calls = 0; calls < 48 && !in.done(); ++calls) one_call(in, caps);
  parity_capture_abandon(&caps[0]);
  parity_capture_abandon(&caps[1]);
  check_no_temporary_file();
  std::error_code ec;
  fs::remove(s.path, ec);
  return 0;
}
