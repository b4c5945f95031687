// Facts about the device and the compiled device code that the launchers and the backend need.
#include <map>
#include <mutex>

#include "device/device_math.h"
#include "device/kernels.h"

namespace parity::device {

std::string_view weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::bf16:
      return "bf16";
    case WeightType::f16:
      return "f16";
    case WeightType::f32:
      return "f32";
  }
  return "?";
}

size_t weight_type_size(WeightType t) {
  return t == WeightType::f32 ? 4 : 2;
}

int device_warp_size() {
  static std::mutex mu;
  static std::map<int, int> cache;
  int dev = 0;
  HIP_CHECK(hipGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  int w = 0;
  HIP_CHECK(hipDeviceGetAttribute(&w, hipDeviceAttributeWarpSize, dev));
  cache[dev] = w;
  return w;
}

namespace {
__global__ void report_compiled_warp_size(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = kWarpSize;
}
}  // namespace

int compiled_warp_size(hipStream_t stream) {
  int* d = nullptr;
  HIP_CHECK(hipMalloc(&d, sizeof(int)));
  int h = 0;
  try {
    report_compiled_warp_size<<<1, 1, 0, stream>>>(d);
    HIP_LAUNCH_CHECK("report_compiled_warp_size", stream);
    HIP_CHECK(hipMemcpyAsync(&h, d, sizeof(int), hipMemcpyDeviceToHost, stream));
    HIP_CHECK(hipStreamSynchronize(stream));
  } catch (...) {
    (void)hipFree(d);
    throw;
  }
  HIP_CHECK(hipFree(d));
  return h;
}

}  // namespace parity::device
