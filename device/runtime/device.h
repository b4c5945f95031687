// One GPU, opened for the runtime: its name and architecture, the warp size (checked against
// the compiled device code), versions and memory. No vendor header: tools and tests include it
// with any compiler.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace parity::device {

struct Device {
  int index = 0;
  std::string name, arch;  // "NVIDIA H100 80GB HBM3", "sm_90" / "gfx90a:sramecc+:xnack-"
  int warp_size = 0;
  int multiprocessors = 0;
  int driver_version = 0, runtime_version = 0;
  size_t total_bytes = 0;

  // Makes device `index` current for this thread (-1: keep the current one) and reads its
  // facts; throws parity::Error when the device code was compiled for another warp size.
  static Device open(int index);
  size_t free_bytes() const;  // free memory now (the device must be current)
  std::string describe() const { return name + " (" + arch + ")"; }
  // The facts traces record: device, arch, vendor, versions, compiler and flags, warp size,
  // multiprocessors, total memory.
  nlohmann::json facts() const;
};

}  // namespace parity::device

namespace parity {
// GPUs the runtime sees (0 when none, or on a runtime error).
int device_count();
// True when a usable GPU is present (the runtime finds at least one device).
bool device_available();
// Why device_available() is false ("no devices", or the runtime's error); empty when it is true.
std::string device_unavailable_reason();
}  // namespace parity
