// Helpers of the device tests (built with a device backend only): host vectors to and from
// device buffers, synchronously.
#pragma once
#include <algorithm>
#include <vector>

#include "device/hip_compat.h"
#include "device/runtime/device_buffer.h"

namespace parity::test {

// A device copy of `v` (one element's room at least, so an empty vector still gives a buffer).
template <typename T>
device::DeviceBuffer upload(const std::vector<T>& v) {
  device::DeviceBuffer b(std::max<size_t>(1, v.size()) * sizeof(T));
  if (!v.empty())
    HIP_CHECK(hipMemcpy(b.as(), v.data(), v.size() * sizeof(T), hipMemcpyHostToDevice));
  return b;
}

// The first n elements of `b`, after every launch on the device has finished.
template <typename T>
std::vector<T> download(const device::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  HIP_CHECK(hipDeviceSynchronize());
  HIP_CHECK(hipMemcpy(v.data(), b.as(), n * sizeof(T), hipMemcpyDeviceToHost));
  return v;
}

}  // namespace parity::test
