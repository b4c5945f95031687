// The device checks' failure handler, compiled by the host compiler so that it can use
// parity::Error (model/error.h, which pulls in fmt) without the device compilers seeing fmt.
#include "device/hip_compat.h"
#include "model/error.h"

namespace parity::device {

void check_failed(const char* statement, const char* function, const char* file, int line,
                  const std::string& what) {
  throw Error(
      fmt::format("device: {} failed: {} [in {} at {}:{}]", statement, what, function, file, line));
}

}  // namespace parity::device
