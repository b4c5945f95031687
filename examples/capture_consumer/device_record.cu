// Compile check of parity_capture_device.h under nvcc (CUDA): records a device buffer.
#include <parity_capture_device.h>

int record_device_row(parity_capture* cap, const float* d_row, size_t n, cudaStream_t stream) {
  return parity_capture_record_device(cap, "embedding", 0, PARITY_CAPTURE_MODEL_LAYER,
                                      PARITY_CAPTURE_ALL_SLOTS, d_row, PARITY_CAPTURE_F32, n,
                                      PARITY_LAYOUT_DEFAULT, stream);
}
