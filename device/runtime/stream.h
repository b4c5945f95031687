// RAII handles for a device stream and an event, in HIP terms (device/hip_compat.h maps them for
// NVIDIA). Move-only; destroyed with the handle (a stream is synchronized first).
#pragma once
#include <utility>

#include "device/hip_compat.h"

namespace parity::device {

class Stream {
 public:
  // A non-blocking stream: it does not wait for the legacy default stream.
  Stream() { HIP_CHECK(hipStreamCreateWithFlags(&s_, hipStreamNonBlocking)); }
  ~Stream() { reset(); }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  hipStream_t get() const { return s_; }
  void synchronize() const { HIP_CHECK(hipStreamSynchronize(s_)); }

 private:
  void reset() noexcept {
    if (s_ == nullptr) return;
    (void)hipStreamSynchronize(s_);
    (void)hipStreamDestroy(s_);
    s_ = nullptr;
  }
  hipStream_t s_ = nullptr;
};

class Event {
 public:
  enum class Timing { off, on };
  explicit Event(Timing timing = Timing::off) {
    HIP_CHECK(hipEventCreateWithFlags(
        &e_, timing == Timing::on ? hipEventDefault : hipEventDisableTiming));
  }
  ~Event() {
    if (e_ != nullptr) (void)hipEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      if (e_ != nullptr) (void)hipEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  hipEvent_t get() const { return e_; }
  void record(hipStream_t stream) const { HIP_CHECK(hipEventRecord(e_, stream)); }
  void synchronize() const { HIP_CHECK(hipEventSynchronize(e_)); }
  // Milliseconds between two recorded timing events.
  static float elapsed_ms(const Event& start, const Event& stop) {
    float ms = 0;
    HIP_CHECK(hipEventElapsedTime(&ms, start.get(), stop.get()));
    return ms;
  }

 private:
  hipEvent_t e_ = nullptr;
};

}  // namespace parity::device
