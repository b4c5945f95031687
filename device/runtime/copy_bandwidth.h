// The device's copy bandwidth: the practical ceiling of a bandwidth-bound kernel, against which
// parity-bench sets its decode time. No vendor header.
#pragma once
#include <cstddef>

namespace parity {

// Device-to-device copy bandwidth of the current device: `reps` copies of `bytes` timed with
// device events after one warm-up copy; the median, counting bytes read plus bytes written
// (2 x bytes per copy), in GB/s (1e9 bytes).
double device_copy_bandwidth_gbs(size_t bytes, int reps);

}  // namespace parity
