/* parity_capture_device.h: record a stage row straight from device memory. Include it in code
 * the port compiles with hipcc (HIP, on AMD or NVIDIA) or nvcc (CUDA); it copies with the runtime
 * the port already links, so libparity_capture itself needs no GPU toolkit.
 *
 *   parity_capture_record_device(cap, "q_rope", pos, layer, PARITY_CAPTURE_ALL_SLOTS,
 *                                d_q, PARITY_CAPTURE_F32, n_heads * head_dim,
 *                                PARITY_LAYOUT_DEFAULT, stream);
 *
 * The copy is a device-to-host copy on `stream` followed by a synchronisation of that stream,
 * so the row is the one the stream's earlier work left. With a null handle nothing is copied and
 * nothing synchronised: a disabled capture adds no host synchronisation to a decode step.
 * Define PARITY_CAPTURE_USE_CUDA or PARITY_CAPTURE_USE_HIP to choose when both are visible.
 */
#ifndef PARITY_CAPTURE_DEVICE_H
#define PARITY_CAPTURE_DEVICE_H

#include "parity_capture.h"

#if !defined(PARITY_CAPTURE_USE_CUDA) && !defined(PARITY_CAPTURE_USE_HIP)
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_NVIDIA__)
#define PARITY_CAPTURE_USE_HIP 1
#elif defined(__CUDACC__)
#define PARITY_CAPTURE_USE_CUDA 1
#else
#error "parity_capture_device.h: compile with hipcc or nvcc, or define PARITY_CAPTURE_USE_HIP/_CUDA"
#endif
#endif

#if defined(PARITY_CAPTURE_USE_HIP)
#include <hip/hip_runtime.h>
typedef hipStream_t parity_capture_stream;
static inline int parity_capture_device_copy(void* dst, const void* src, size_t bytes, void* user) {
  hipStream_t stream = (hipStream_t)user;
  if (hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, stream) != hipSuccess) return 1;
  return hipStreamSynchronize(stream) == hipSuccess ? 0 : 2;
}
#else
#include <cuda_runtime.h>
typedef cudaStream_t parity_capture_stream;
static inline int parity_capture_device_copy(void* dst, const void* src, size_t bytes, void* user) {
  cudaStream_t stream = (cudaStream_t)user;
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess) return 1;
  return cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 2;
}
#endif

/* parity_capture_record() for a device pointer: copied on `stream` (0: the default stream). */
static inline int parity_capture_record_device(parity_capture* cap, const char* stage, int position,
                                               int layer, int slot, const void* device_data,
                                               parity_capture_dtype dtype, size_t count,
                                               unsigned layout, parity_capture_stream stream) {
  if (cap == NULL) return PARITY_CAPTURE_OK;
  return parity_capture_record_copy(cap, stage, position, layer, slot, device_data, dtype, count,
                                    layout, parity_capture_device_copy, (void*)stream);
}

#endif /* PARITY_CAPTURE_DEVICE_H */
