#include "device/runtime/copy_bandwidth.h"

#include <algorithm>
#include <vector>

#include "device/hip_compat.h"
#include "device/runtime/device_buffer.h"
#include "device/runtime/stream.h"
#include "model/error.h"

namespace parity {

double device_copy_bandwidth_gbs(size_t bytes, int reps) {
  if (bytes == 0 || reps <= 0) fail("copy bandwidth: {} bytes, {} repetitions", bytes, reps);
  using device::Event;
  device::DeviceBuffer src(bytes), dst(bytes);
  device::Stream stream;
  HIP_CHECK(hipMemsetAsync(src.as(), 0x5a, bytes, stream.get()));  // never time on untouched pages
  const Event start(Event::Timing::on), stop(Event::Timing::on);
  std::vector<double> seconds;
  for (int i = 0; i <= reps; ++i) {  // the first copy is the warm-up
    start.record(stream.get());
    HIP_CHECK(hipMemcpyAsync(dst.as(), src.as(), bytes, hipMemcpyDeviceToDevice, stream.get()));
    stop.record(stream.get());
    stop.synchronize();
    if (i > 0) seconds.push_back(double(Event::elapsed_ms(start, stop)) / 1e3);
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * double(bytes) / seconds[seconds.size() / 2] / 1e9;
}

}  // namespace parity
