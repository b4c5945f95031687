// Helpers of the device tests (built with a device backend only): host vectors to and from
// device buffers, synchronously.
#pragma once
#include <algorithm>
#include <vector>

#include "device/hip_compat.h"
#include "device/kernels.h"
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

// MXFP4 expert weights packed on the device as the runtime packs them
// (launch_u8_mxfp4_pack_blocks / _scales), from host blocks [E, out, in / 32, 16] and scales
// [E, out, in / 32] in the checkpoint's layout.
struct PackedMxfp4 {
  device::DeviceBuffer blocks, scales;
};
inline PackedMxfp4 pack_mxfp4(const std::vector<uint8_t>& blocks,
                              const std::vector<uint8_t>& scales, int experts, int out, int in) {
  const device::Mxfp4Packing pk(out, in);
  PackedMxfp4 p{device::DeviceBuffer(size_t(pk.block_bytes(experts))),
                device::DeviceBuffer(size_t(pk.scale_bytes(experts)))};
  const device::DeviceBuffer raw_blocks = upload(blocks), raw_scales = upload(scales);
  device::launch_u8_mxfp4_pack_blocks(raw_blocks.as<uint8_t>(), experts, out, in,
                                      p.blocks.as<uint8_t>(), nullptr);
  device::launch_u8_mxfp4_pack_scales(raw_scales.as<uint8_t>(), experts, out, in,
                                      p.scales.as<uint8_t>(), nullptr);
  HIP_CHECK(hipDeviceSynchronize());  // before the raw buffers go
  return p;
}

}  // namespace parity::test
