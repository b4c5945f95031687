// HIP is the source language of device/. This header is the only file that knows about CUDA:
// on AMD it includes the HIP runtime; on NVIDIA it maps the HIP names the project uses onto
// CUDA 13 (object-like macros where the call is the same, inline wrappers where it differs).
// HIP's own NVIDIA headers (ROCm 5.2) do not compile against CUDA 13: they read removed
// cudaDeviceProp fields and the old cudaMemPrefetchAsync; this mapping reads device properties
// through hipDeviceGetAttribute only.
//
// It also holds the one error-check macro generator of the device code (HIP_CHECK for runtime
// calls, HIP_LAUNCH_CHECK after a kernel launch): a failure throws parity::Error naming the
// statement, function, file and line, with a hint where the user can act.
//
// Safe to include from host-only translation units (g++): the device-only parts are guarded.
// It must not pull in fmt (model/error.h): nvcc 13 cannot compile fmt 9's headers.
#pragma once

#include <atomic>
#include <sstream>
#include <string>
#include <utility>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || \
    (defined(__HIP__) && !defined(__HIP_PLATFORM_NVIDIA__))
// ---------------------------------------------------------------------------------- AMD ---
#include <hip/hip_runtime.h>

#define PARITY_DEVICE_VENDOR "amd"
// Wavefront size of the device code being compiled: 64 on CDNA (gfx90a, gfx942). The host
// pass has no target; launch shapes use the runtime attribute (device_warp_size()).
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define PARITY_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define PARITY_WARP_SIZE 64
#endif

namespace parity::device {
// Device name and architecture ("gfx90a:sramecc+:xnack-").
inline hipError_t device_name_and_arch(int device, std::string& name, std::string& arch) {
  hipDeviceProp_t prop;
  const hipError_t err = hipGetDeviceProperties(&prop, device);
  if (err != hipSuccess) return err;
  name = prop.name;
  arch = prop.gcnArchName;
  return hipSuccess;
}

// Ticks per second of device_wall_clock(): s_memrealtime counts at 100 MHz on CDNA (MI200, MI300;
// this HIP has no attribute that reads it).
inline double device_wall_clock_hz(int) {
  return 100e6;
}

// Hopper's warpgroup MMA (wgmma) has no AMD counterpart here: the kernels built on it compile to
// nothing and are never chosen (the NVIDIA branch documents them).
#define PARITY_DEVICE_WGMMA 0
inline bool warpgroup_mma_available() {
  return false;
}
// No instruction that rounds two floats to packed BF16 here: bf16x2_pack_rn
// (device/split_inputs.h) rounds each in integer arithmetic.
#define PARITY_DEVICE_CVT_BF16X2 0

#if defined(__HIP_DEVICE_COMPILE__) || defined(__HIPCC__)
// The tile product of the MXFP4 expert kernels in NVIDIA's mma.m16n8k16 fragment layout (see the
// NVIDIA branch for the layout), on a group of 32 lanes of the wavefront: each lane gathers its
// rows of A and columns of B from the group by shuffles and accumulates in float32 with fmaf, k in
// order. A correct, slow equivalent; mapping the tile onto MFMA (v_mfma_f32_16x16x16bf16_1k,
// whose fragments lay out differently) is what would make it fast.
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
  const int lane = int(__lane_id()) % 32, g = lane / 4, t = lane % 4;
  float acc[4] = {d[0], d[1], d[2], d[3]};
  for (int half = 0; half < 2; ++half)  // k in [8 half, 8 half + 8)
    for (int tt = 0; tt < 4; ++tt) {
      // k = 8 half + 2 tt, + 1: A rows g, g + 8 from lane 4 g + tt; B columns 2t, 2t + 1 from
      // lanes 4 (2t) + tt and 4 (2t + 1) + tt.
      const uint32_t a_g = __shfl(a[2 * half], 4 * g + tt, 32);
      const uint32_t a_g8 = __shfl(a[2 * half + 1], 4 * g + tt, 32);
      const uint32_t b_0 = __shfl(b[half], 4 * (2 * t) + tt, 32);
      const uint32_t b_1 = __shfl(b[half], 4 * (2 * t + 1) + tt, 32);
      acc[0] = fmaf(bf16_lo(a_g), bf16_lo(b_0), acc[0]);
      acc[0] = fmaf(bf16_hi(a_g), bf16_hi(b_0), acc[0]);
      acc[1] = fmaf(bf16_lo(a_g), bf16_lo(b_1), acc[1]);
      acc[1] = fmaf(bf16_hi(a_g), bf16_hi(b_1), acc[1]);
      acc[2] = fmaf(bf16_lo(a_g8), bf16_lo(b_0), acc[2]);
      acc[2] = fmaf(bf16_hi(a_g8), bf16_hi(b_0), acc[2]);
      acc[3] = fmaf(bf16_lo(a_g8), bf16_lo(b_1), acc[3]);
      acc[3] = fmaf(bf16_hi(a_g8), bf16_hi(b_1), acc[3]);
    }
  for (int i = 0; i < 4; ++i) d[i] = acc[i];
}
// Two BF16 products at once: exact in float32 here (the callers multiply by powers of two), so
// keeping the upper half is the rounded product.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t y) {
  const uint32_t lo = __float_as_uint(bf16_lo(x) * bf16_lo(y)) >> 16;
  const uint32_t hi = __float_as_uint(bf16_hi(x) * bf16_hi(y)) & 0xffff0000u;
  return hi | lo;
}
// The device's constant-rate clock (the NVIDIA branch says what it is for): s_memrealtime, at the
// rate device_wall_clock_hz() reads.
__device__ __forceinline__ uint64_t device_wall_clock() {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_s_memrealtime();
#else
  return 0;  // the host pass of a device function: never run
#endif
}
// A load of memory another GPU wrote and published by a flag since this kernel began (the NVIDIA
// branch says why): volatile loads, which the L0/L1 caches do not serve.
__device__ __forceinline__ float4 load_published(const float4* p) {
  const volatile float* q = reinterpret_cast<const volatile float*>(p);
  return make_float4(q[0], q[1], q[2], q[3]);
}
// Programmatic dependent launch (the NVIDIA branch says what it is): stream order already makes a
// kernel wait for the one before it here, so both are nothing.
__device__ __forceinline__ void wait_for_previous_grid() {}
__device__ __forceinline__ void allow_next_grid_start() {}
// A launch that may start before the kernel before it ends (NVIDIA): here a plain launch.
template <typename... Params, typename... Args>
inline hipError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                      hipStream_t stream, Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  return hipGetLastError();
}
#endif
}  // namespace parity::device

#else
// ------------------------------------------------------------------------------- NVIDIA ---
#include <cuda_runtime.h>

#define PARITY_DEVICE_VENDOR "nvidia"
#define PARITY_WARP_SIZE 32

// Types and constants.
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipErrorNoDevice cudaErrorNoDevice
#define hipErrorInsufficientDriver cudaErrorInsufficientDriver
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#define hipErrorIllegalAddress cudaErrorIllegalAddress
#define hipStream_t cudaStream_t
#define hipEvent_t cudaEvent_t
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipEventDisableTiming cudaEventDisableTiming
#define hipEventDefault cudaEventDefault
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipDeviceAttributeWarpSize cudaDevAttrWarpSize
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define hipDeviceAttributeComputeCapabilityMinor cudaDevAttrComputeCapabilityMinor
#define hipDeviceAttributeMaxSharedMemoryPerBlock cudaDevAttrMaxSharedMemoryPerBlock
#define hipDeviceAttributeL2CacheSize cudaDevAttrL2CacheSize
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostMallocMapped cudaHostAllocMapped
#define hipHostMallocPortable cudaHostAllocPortable
#define hipErrorPeerAccessAlreadyEnabled cudaErrorPeerAccessAlreadyEnabled

// Calls with the same signature and meaning.
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipDriverGetVersion cudaDriverGetVersion
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipMemGetInfo cudaMemGetInfo
#define hipDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define hipDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define hipHostGetDevicePointer cudaHostGetDevicePointer
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpy2D cudaMemcpy2D
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipGraph_t cudaGraph_t
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDestroy cudaEventDestroy
#define hipEventCreate cudaEventCreate
#define hipEventRecord cudaEventRecord
#define hipEventElapsedTime cudaEventElapsedTime
#define hipEventSynchronize cudaEventSynchronize
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorName cudaGetErrorName
#define hipGetErrorString cudaGetErrorString
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

// Calls that differ.
// hipHostMalloc(ptr, size, flags) is cudaHostAlloc; the flag values coincide (default 0,
// portable 1, mapped 2, write-combined 4).
inline cudaError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
  return cudaHostAlloc(ptr, size, flags);
}

namespace parity::device {
// Device name and architecture ("sm_90"). The name is read from cudaDeviceProp::name, which
// CUDA 13 keeps; the compute capability through attributes.
inline cudaError_t device_name_and_arch(int device, std::string& name, std::string& arch) {
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return err;
  int major = 0, minor = 0;
  if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
      cudaSuccess)
    return err;
  if ((err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
      cudaSuccess)
    return err;
  name = prop.name;
  arch = "sm_" + std::to_string(major) + std::to_string(minor);
  return cudaSuccess;
}
// Ticks per second of device_wall_clock() (%globaltimer counts nanoseconds).
inline double device_wall_clock_hz(int) {
  return 1e9;
}
// Whether the current device runs the warpgroup-MMA kernels: they are built (PARITY_WGMMA_BUILT,
// CMAKE_CUDA_ARCHITECTURES naming 90a) and the device is compute capability 9.0. Kernels built
// for 90a alone run on nothing else.
inline bool warpgroup_mma_available() {
#if defined(PARITY_WGMMA_BUILT)
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}
}  // namespace parity::device

#if defined(__CUDACC__)
// Warp shuffles: HIP's __shfl_xor(var, lane_mask, width) is the whole-warp
// __shfl_xor_sync(full mask, ...) on NVIDIA. The project only shuffles with every lane of the
// warp active. A renaming macro, because CUDA's host pass still declares the deprecated
// non-sync overloads with the same signatures.
template <typename T>
__device__ __forceinline__ T hip_compat_shfl_xor(T var, int lane_mask, int width = 32) {
  return __shfl_xor_sync(0xffffffffu, var, lane_mask, width);
}
#define __shfl_xor hip_compat_shfl_xor
// HIP's __shfl(var, src_lane, width): __shfl_sync(full mask, ...) on NVIDIA.
template <typename T>
__device__ __forceinline__ T hip_compat_shfl(T var, int src_lane, int width = 32) {
  return __shfl_sync(0xffffffffu, var, src_lane, width);
}
#define __shfl hip_compat_shfl
// HIP's __any(predicate) over the warp is __any_sync(full mask, ...) on NVIDIA (every lane active).
__device__ __forceinline__ int hip_compat_any(int predicate) {
  return __any_sync(0xffffffffu, predicate);
}
#define __any hip_compat_any
#endif  // __CUDACC__

#if defined(__CUDACC__)
namespace parity::device {
// The tile product of the MXFP4 expert kernels (device/experts.hip), in the fragment layout of
// NVIDIA's mma.m16n8k16 with BF16 inputs and float32 accumulation, for a group of 32 lanes
// (lane = 4 g + t): d (16 x 8) += a (16 x 16, row-major) * b (16 x 8). Each 32-bit register holds
// two BF16 values, the lower k in the low half:
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][..]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma_bf16_16x8x16 needs sm_80 or newer"
#endif
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Two BF16 products at once (round to nearest even; subnormals kept): fma with -0 addend.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t y) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(0x80008000u));
  return r;
}
// Two floats rounded to BF16, to nearest even (subnormals kept), packed: lo in the low half; one
// instruction (bf16x2_pack_rn in device/split_inputs.h takes it where this is defined).
#define PARITY_DEVICE_CVT_BF16X2 1
__device__ __forceinline__ uint32_t cvt_bf16x2_rn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Warpgroup MMA (wgmma, sm_90a only: built when CMAKE_CUDA_ARCHITECTURES names 90a). The four
// consecutive warps of a warpgroup (the 128 threads of a block that uses it) issue one
// asynchronous product together: D (64 x N, float32, registers) += A (64 x 16 BF16) B (16 x N
// BF16). A comes from registers in mma_bf16_16x8x16's fragment layout, warp w holding rows
// 16 w .. 16 w + 15 (a[0..3] as there); D's registers are mma_bf16_16x8x16's d of each 8-column
// tile j in turn, d[4 j + i]. B is read from shared memory through a matrix descriptor: K-major
// core matrices of 8 columns by 16 bytes (8 BF16 of k), 128 contiguous bytes each (column n at
// 16 n), no swizzle; lbo bytes from the core of k 0..7 to that of k 8..15, sbo bytes from columns
// 0..7 to columns 8..15. A chain of them on one D gives the bits of the same chain of
// mma_bf16_16x8x16 (measured on the H100: docs/measurements.md). Ordering, as the PTX ISA asks:
// wgmma_fence() before the products when their A or D registers were written by other
// instructions; wgmma_commit_group() after a batch; wgmma_wait_group<n>() until at most n
// batches are in flight before D is read or B's shared memory rewritten (and
// wgmma_fence_operands(d) so that the compiler keeps D's reads after the wait); shared memory
// written by ordinary stores and read next by wgmma needs fence_proxy_async_shared() in the
// writing threads before the barrier.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PARITY_DEVICE_WGMMA 1
#else
#define PARITY_DEVICE_WGMMA 0
#endif
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ uint64_t wgmma_smem_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((at >> 4) & 0x3fffu) | uint64_t((lbo >> 4) & 0x3fffu) << 16 |
         uint64_t((sbo >> 4) & 0x3fffu) << 32;  // base offset 0, no swizzle
}
// D (64 x 64) += A B, N = 64.
__device__ __forceinline__ void wgmma_bf16_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                     uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, "
      "p, %37, %37, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(1), "r"(1));
}
// A clock at a constant rate, the same for every SM (%globaltimer, nanoseconds): how long a kernel
// has waited, for a bound on a wait for another GPU (AMD: s_memrealtime).
__device__ __forceinline__ uint64_t device_wall_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A load of memory another GPU wrote and published by a flag since this kernel began: from L2
// (ld.global.cg), past the SM's L1, which is not coherent with stores from other GPUs.
__device__ __forceinline__ float4 load_published(const float4* p) {
  return __ldcg(p);
}
// Programmatic dependent launch (sm_90): a kernel launched by launch_programmatic may start while
// the kernel before it in the stream still runs, once every block of that one has called
// allow_next_grid_start (or ended); it must call wait_for_previous_grid, which returns when the
// kernel before has completed and its writes are visible, before it reads anything that kernel
// may write or writes anything it may read. What it does before (loading weights, which no
// kernel writes during a step) overlaps the end of the kernel before.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The launch itself: cudaLaunchKernelEx with programmatic stream serialization allowed (captured
// into a step graph as a programmatic edge).
template <typename... Params, typename... Args>
inline cudaError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
}  // namespace parity::device
#endif  // __CUDACC__

#endif  // vendor

// Helpers of the plain kernel types (device/kernel_types.h) compile for host and device. A host
// translation unit may have included that header first, with the empty host-only definition.
#undef PARITY_HOST_DEVICE
#define PARITY_HOST_DEVICE __host__ __device__

namespace parity::device {

// Warp size of the compiled device code: a compile-time value inside kernels (64 on CDNA, 32 on
// NVIDIA). Host code never uses it for launch shapes; it asks the device (device_warp_size()).
inline constexpr int kWarpSize = PARITY_WARP_SIZE;

// "hipErrorOutOfMemory (out of memory)" plus a hint where the user can act.
inline std::string error_text(hipError_t err) {
  std::string s = std::string(hipGetErrorName(err)) + " (" + hipGetErrorString(err) + ")";
  if (err == hipErrorOutOfMemory)
    s += "; HINT: the model, KV cache or batch does not fit: lower the KV cache budget "
         "(PARITY_DEVICE_KV_BYTES), the context (PARITY_DEVICE_MAX_CONTEXT) or the rows per step";
  else if (err == hipErrorNoDevice || err == hipErrorInsufficientDriver)
    s += "; HINT: no usable GPU: check the driver (nvidia-smi / rocm-smi) and the visible devices";
  else if (err == hipErrorIllegalAddress)
    s += "; HINT: a kernel faulted; rerun with PARITY_DEVICE_SYNC=1 (or compute-sanitizer) to "
         "name it";
  return s;
}

// Whether every launch is followed by a stream synchronization, so that an asynchronous fault is
// reported at the kernel that caused it: a process-wide debug switch, turned on by the runtime
// when DeviceOptions::sync_after_launch asks for it (PARITY_DEVICE_SYNC=1 for the tools).
inline std::atomic<bool> sync_after_launch_on{false};
inline bool sync_after_launch() {
  return sync_after_launch_on.load(std::memory_order_relaxed);
}
inline void enable_sync_after_launch() {
  sync_after_launch_on.store(true, std::memory_order_relaxed);
}

// The handler behind every device check: `statement` failed in `function` at `file:line`;
// throws parity::Error. Defined in device/device_check.cpp (host compiler): device translation
// units never include fmt, which nvcc 13 cannot parse.
[[noreturn]] void check_failed(const char* statement, const char* function, const char* file,
                               int line, const std::string& what);

// Concatenates values streamed into one string: concat("rows ", 3, " of ", 4).
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

}  // namespace parity::device

// The check-macro generator: evaluates `expr` once; when it is not `ok`, throws parity::Error
// with `statement_text`, the function, file and line, and describe(result).
#define PARITY_DEVICE_CHECK_GEN(expr, statement_text, ok, describe)                \
  do {                                                                             \
    const auto parity_device_result_ = (expr);                                     \
    if (parity_device_result_ != (ok))                                             \
      ::parity::device::check_failed(statement_text, __func__, __FILE__, __LINE__, \
                                     describe(parity_device_result_));             \
  } while (0)

// An argument check in a launcher or the backend: PARITY_DEVICE_REQUIRE(n > 0, "n ", n, " ...").
// Throws parity::Error with the message, the condition, function, file and line.
#define PARITY_DEVICE_REQUIRE(cond, ...)                                     \
  do {                                                                       \
    if (!(cond))                                                             \
      ::parity::device::check_failed(#cond, __func__, __FILE__, __LINE__,    \
                                     ::parity::device::concat(__VA_ARGS__)); \
  } while (0)

// A HIP runtime call: HIP_CHECK(hipMalloc(&p, n));
#define HIP_CHECK(call) \
  PARITY_DEVICE_CHECK_GEN(call, #call, hipSuccess, ::parity::device::error_text)

// After a launch on `stream`: the launch itself (bad configuration), and with
// PARITY_DEVICE_SYNC=1 its execution.
#define HIP_LAUNCH_CHECK(kernel_name, stream)                                            \
  do {                                                                                   \
    PARITY_DEVICE_CHECK_GEN(hipGetLastError(), "launch of " kernel_name, hipSuccess,     \
                            ::parity::device::error_text);                               \
    if (::parity::device::sync_after_launch())                                           \
      PARITY_DEVICE_CHECK_GEN(hipStreamSynchronize(stream), "execution of " kernel_name, \
                              hipSuccess, ::parity::device::error_text);                 \
  } while (0)

// ------------------------------------------------------------- collective communication ---
// The tensor-parallel all-reduces (device/runtime/communicator.h): NCCL on NVIDIA, RCCL on AMD,
// which keeps NCCL's API (ncclComm_t, ncclAllReduce, ncclCommInitAll, ...) under its own header.
// PARITY_HAVE_NCCL is set by the build where the library was found (the CUDA toolkit ships NCCL;
// Debian 12 has no RCCL, so the gfx90a build of CI has none); without it the communicator says
// so when asked for one.
#if defined(PARITY_HAVE_NCCL) && PARITY_HAVE_NCCL
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || \
    (defined(__HIP__) && !defined(__HIP_PLATFORM_NVIDIA__))
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif
// An NCCL/RCCL call: NCCL_CHECK(ncclAllReduce(...)); the library's error string in the message.
#define NCCL_CHECK(call)                            \
  PARITY_DEVICE_CHECK_GEN(call, #call, ncclSuccess, \
                          [](ncclResult_t r) { return std::string(ncclGetErrorString(r)); })
#endif
