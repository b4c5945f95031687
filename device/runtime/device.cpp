#include "device/runtime/device.h"

#include "device/build_facts.h"
#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/runtime/stream.h"
#include "model/error.h"

namespace parity::device {

Device Device::open(int index) {
  Device d;
  if (index >= 0) HIP_CHECK(hipSetDevice(index));
  HIP_CHECK(hipGetDevice(&d.index));
  HIP_CHECK(device_name_and_arch(d.index, d.name, d.arch));
  d.warp_size = device_warp_size();
  {
    const Stream stream;
    const int compiled = compiled_warp_size(stream.get());
    if (compiled != d.warp_size)
      fail(
          "device {} ({}): the device code was compiled for a warp of {} lanes but the device "
          "runs {} (HINT: build for this GPU's architecture: CMAKE_CUDA_ARCHITECTURES or "
          "PARITY_HIP_ARCHITECTURES)",
          d.name, d.arch, compiled, d.warp_size);
  }
  HIP_CHECK(hipDriverGetVersion(&d.driver_version));
  HIP_CHECK(hipRuntimeGetVersion(&d.runtime_version));
  HIP_CHECK(
      hipDeviceGetAttribute(&d.multiprocessors, hipDeviceAttributeMultiprocessorCount, d.index));
  size_t free_bytes = 0;
  HIP_CHECK(hipMemGetInfo(&free_bytes, &d.total_bytes));
  return d;
}

size_t Device::free_bytes() const {
  size_t free_bytes = 0, total_bytes = 0;
  HIP_CHECK(hipMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

nlohmann::json Device::facts() const {
  return {
      {"device", name},
      {"arch", arch},
      {"vendor", PARITY_DEVICE_VENDOR},
      {"driver_version", driver_version},
      {"runtime_version", runtime_version},
      {"compiler", PARITY_DEVICE_COMPILER},
      {"targets", PARITY_DEVICE_TARGETS},
      {"compile_flags", PARITY_DEVICE_FLAGS},
      {"fp_contract", PARITY_DEVICE_FP_CONTRACT},
      {"warp_size", warp_size},
      {"multiprocessors", multiprocessors},
      {"memory_total_bytes", total_bytes},
  };
}

}  // namespace parity::device

namespace parity {

int device_count() {
  int n = 0;
  if (hipGetDeviceCount(&n) != hipSuccess) {
    (void)hipGetLastError();
    return 0;
  }
  return n;
}

bool device_available() {
  return device_unavailable_reason().empty();
}

std::string device_unavailable_reason() {
  int n = 0;
  const hipError_t err = hipGetDeviceCount(&n);
  if (err != hipSuccess) {
    (void)hipGetLastError();  // clear the sticky runtime error
    return device::error_text(err);
  }
  return n > 0 ? std::string() : std::string("no devices");
}

}  // namespace parity
