// Expert projections mlp1 (gate_up) and mlp2 (down) for the k experts each row selected, with
// the expert index read from device memory (topk_idx): y = W[e] x + b[e] (bias before the
// routing weight, gpt_oss/torch/model.py MLPBlock). mlp1 fuses SwiGLU into its epilogue: one
// warp computes the interleaved pair (gate 2i, linear 2i + 1) and also writes swiglu[i]; both
// stage outputs are written, so the tracer still sees mlp1 and swiglu.
//
// MXFP4 (OCP MX, gpt-oss-spec section 3): row j of W[e] is in/32 blocks of 16 bytes; byte b of
// block g holds element 32 g + 2 b in its low nibble and 32 g + 2 b + 1 in its high nibble, and
// the block's E8M0 scale byte multiplies by 2^(s - 127). One warp per kRowsPerWarp output
// rows: lane l takes whole blocks (one 16-byte load and one scale byte per row), decodes the
// FP4 codes through a 16-entry shared table, dots them with the block's 32 inputs (staged once
// per thread block in shared memory) in element order and applies the power-of-two scale to
// the block sum; the lanes' sums are combined by a fixed butterfly.
//
// Dense (the layout transformers writes for a dequantized model): W[e] stored [in, out], so one
// thread per output column walks the input axis; neighbouring threads read neighbouring columns.
#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kThreads = 256;

struct MoeArgs {
  const uint8_t* blocks;
  const uint8_t* scales;
  const void* dense;
  const float* bias;
  int experts, out, in;
  const int32_t* idx;
  int k;
  const float* x;
  int x_row_stride, x_slot_stride;
  float* y;
  float* act;
  float alpha, limit;
};

// FP4 E2M1 code -> value: [+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6].
__device__ __forceinline__ float fp4_e2m1_value(int code) {
  const int mag = code & 7;
  const float v =
      mag < 2 ? 0.5f * float(mag) : float(1 << ((mag >> 1) - 1)) * (1.0f + 0.5f * float(mag & 1));
  return code & 8 ? -v : v;
}

// Writes the outputs of one (row, slot, unit) when its expert index is invalid: NaN, visibly.
__device__ void write_invalid(const MoeArgs& a, int64_t row_slot, int j0, int unit, bool swiglu) {
  a.y[row_slot * a.out + j0] = NAN;
  if (swiglu) {
    a.y[row_slot * a.out + j0 + 1] = NAN;
    if (a.act != nullptr) a.act[row_slot * (a.out / 2) + unit] = NAN;
  }
}

__device__ void write_outputs(const MoeArgs& a, int e, int64_t row_slot, int j0, int unit,
                              bool swiglu, float acc0, float acc1) {
  const float h0 = acc0 + a.bias[int64_t(e) * a.out + j0];
  a.y[row_slot * a.out + j0] = h0;
  if (swiglu) {
    const float h1 = acc1 + a.bias[int64_t(e) * a.out + j0 + 1];
    a.y[row_slot * a.out + j0 + 1] = h1;
    if (a.act != nullptr)
      a.act[row_slot * (a.out / 2) + unit] = swiglu_oai(h0, h1, a.alpha, a.limit);
  }
}

// x rows live in shared memory with a 4-float pad after every 32 floats: a lane reads the 32
// inputs of one MXFP4 block as eight 16-byte loads, and the 8 lanes of a quarter-warp then
// touch 32 distinct banks (stride 144 bytes) instead of the same four (stride 128 bytes).
__host__ __device__ __forceinline__ int padded(int i) {
  return i + (i >> 5) * 4;
}

// Output rows per warp (mlp1: two gate/linear pairs; mlp2: four rows) and blocks per lane in
// flight: a warp streams its rows' 16-byte blocks side by side (lane l takes block l of each
// row: 512 coalesced bytes per row per step), kInFlight steps of loads issued before any is
// used, and each lane's 32 inputs serve every row.
constexpr int kRowsPerWarp = 4;
constexpr int kInFlight = 3;

// Dot of one MXFP4 block (32 codes in a uint4; byte b: low nibble element 2b, high 2b + 1)
// with 32 inputs, in element order.
__device__ __forceinline__ float mxfp4_block_dot(const uint4 q, const float (&x)[32],
                                                 const float* lut) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float s = 0.0f;
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
    for (int bi = 0; bi < 4; ++bi) {
      const uint32_t byte = (w[wi] >> (8 * bi)) & 0xffu;
      const int e = 2 * (4 * wi + bi);
      s = fmaf(lut[byte & 0xfu], x[e], s);
      s = fmaf(lut[byte >> 4], x[e + 1], s);
    }
  }
  return s;
}

// grid (ceil(out / (warps per block * kRowsPerWarp)), k, B).
template <bool kSwiGLU>
__global__ void __launch_bounds__(kThreads) f32_mxfp4w_moe_gemv(const MoeArgs a) {
  extern __shared__ float xs[];  // padded(in) floats: this (row, slot)'s input
  __shared__ float lut[16];
  const int slot = int(blockIdx.y), r = int(blockIdx.z);
  const int64_t row_slot = int64_t(r) * a.k + slot;
  const float* xr = a.x + int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
  for (int i = int(threadIdx.x); i < a.in / 4; i += int(blockDim.x))
    *reinterpret_cast<float4*>(xs + padded(4 * i)) = *reinterpret_cast<const float4*>(xr + 4 * i);
  if (threadIdx.x < 16) lut[threadIdx.x] = fp4_e2m1_value(int(threadIdx.x));
  __syncthreads();

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = int(blockIdx.x) * (int(blockDim.x) / kWarpSize) + int(threadIdx.x) / kWarpSize;
  const int j0 = warp * kRowsPerWarp;  // first output row of this warp
  if (j0 >= a.out) return;             // whole warps leave together
  const int nrows = min(kRowsPerWarp, a.out - j0);
  const int e = a.idx[row_slot];
  if (e < 0 || e >= a.experts) {
    if (lane == 0)
      for (int t = 0; t < nrows; t += kSwiGLU ? 2 : 1)
        write_invalid(a, row_slot, j0 + t, (j0 + t) / 2, kSwiGLU);
    return;
  }
  const int groups = a.in / 32;
  const int64_t row0 = int64_t(e) * a.out + j0;
  const uint4* q0 = reinterpret_cast<const uint4*>(a.blocks + row0 * groups * 16);
  const uint8_t* sc0 = a.scales + row0 * groups;
  float acc[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) acc[t] = 0.0f;
  for (int g0 = lane; g0 < groups; g0 += kInFlight * kWarpSize) {
    uint4 q[kInFlight][kRowsPerWarp];
    uint32_t sb[kInFlight][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int g = g0 + u * kWarpSize;
#pragma unroll
      for (int t = 0; t < kRowsPerWarp; ++t) {
        const bool live = g < groups && t < nrows;
        q[u][t] = live ? q0[int64_t(t) * groups + g] : uint4{0, 0, 0, 0};
        sb[u][t] = live ? sc0[int64_t(t) * groups + g] : 127u;
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int g = g0 + u * kWarpSize;
      if (g >= groups) break;
      float xv[32];
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float4 f = *reinterpret_cast<const float4*>(xs + padded(32 * g) + 4 * v);
        xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
      }
#pragma unroll
      for (int t = 0; t < kRowsPerWarp; ++t)
        acc[t] = fmaf(mxfp4_block_dot(q[u][t], xv, lut), e8m0_to_f32(sb[u][t]), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) acc[t] = warp_sum(acc[t]);
  if (lane != 0) return;
  if constexpr (kSwiGLU) {
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; t += 2)
      if (t < nrows) write_outputs(a, e, row_slot, j0 + t, (j0 + t) / 2, true, acc[t], acc[t + 1]);
  } else {
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t)
      if (t < nrows) write_outputs(a, e, row_slot, j0 + t, j0 + t, false, acc[t], 0.0f);
  }
}

// grid (ceil(units / 256), k, B); one thread per unit.
template <typename W, bool kSwiGLU>
__global__ void __launch_bounds__(kThreads) f32_dense_moe_gemv_w(const MoeArgs a) {
  const int unit = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  const int units = kSwiGLU ? a.out / 2 : a.out;
  if (unit >= units) return;
  const int slot = int(blockIdx.y), r = int(blockIdx.z);
  const int64_t row_slot = int64_t(r) * a.k + slot;
  const int e = a.idx[row_slot];
  const int j0 = kSwiGLU ? 2 * unit : unit;
  if (e < 0 || e >= a.experts) {
    write_invalid(a, row_slot, j0, unit, kSwiGLU);
    return;
  }
  const W* we = static_cast<const W*>(a.dense) + int64_t(e) * a.in * a.out + j0;
  const float* xr = a.x + int64_t(r) * a.x_row_stride + int64_t(slot) * a.x_slot_stride;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int i = 0; i < a.in; ++i) {
    const float xi = xr[i];
    acc0 = fmaf(to_f32(we[int64_t(i) * a.out]), xi, acc0);
    if constexpr (kSwiGLU) acc1 = fmaf(to_f32(we[int64_t(i) * a.out + 1]), xi, acc1);
  }
  write_outputs(a, e, row_slot, j0, unit, kSwiGLU, acc0, acc1);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void launch_f32_moe_gemv(const ExpertWeights& w, const int32_t* idx, int batch, int k,
                         const float* x, int x_row_stride, int x_slot_stride, float* y, float* act,
                         float alpha, float limit, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(idx != nullptr && x != nullptr && y != nullptr && w.bias != nullptr,
                        "launch_f32_moe_gemv: null idx, x, y or bias");
  PARITY_DEVICE_REQUIRE(batch > 0 && k > 0, "launch_f32_moe_gemv: batch ", batch, " and k ", k,
                        " must be positive");
  PARITY_DEVICE_REQUIRE(w.experts > 0 && w.out > 0 && w.in > 0, "launch_f32_moe_gemv: experts ",
                        w.experts, ", out ", w.out, ", in ", w.in, " must be positive");
  PARITY_DEVICE_REQUIRE(x_row_stride >= 0 && x_slot_stride >= 0, "launch_f32_moe_gemv: strides");
  const bool swiglu = act != nullptr;
  PARITY_DEVICE_REQUIRE(!swiglu || w.out % 2 == 0,
                        "launch_f32_moe_gemv: the fused SwiGLU needs an "
                        "even output (interleaved gate/linear), got ",
                        w.out);
  MoeArgs a{w.blocks, w.scales, w.dense,      w.bias,        w.experts, w.out, w.in,  idx,
            k,        x,        x_row_stride, x_slot_stride, y,         act,   alpha, limit};
  const int units = swiglu ? w.out / 2 : w.out;
  if (w.mxfp4) {
    PARITY_DEVICE_REQUIRE(w.blocks != nullptr && w.scales != nullptr,
                          "launch_f32_moe_gemv: null MXFP4 blocks or scales");
    PARITY_DEVICE_REQUIRE(w.in % 32 == 0, "launch_f32_moe_gemv: MXFP4 input ", w.in,
                          " is not a multiple of 32");
    PARITY_DEVICE_REQUIRE(
        aligned16(w.blocks) && aligned16(x) && x_row_stride % 4 == 0 && x_slot_stride % 4 == 0,
        "launch_f32_moe_gemv: MXFP4 blocks and x rows must be 16-byte aligned");
    const int rows_per_block = kThreads / device_warp_size() * kRowsPerWarp;
    const dim3 grid(unsigned(ceil_div(w.out, rows_per_block)), unsigned(k), unsigned(batch));
    const size_t shared = size_t(padded(w.in)) * sizeof(float);
    PARITY_DEVICE_REQUIRE(shared <= 48 * 1024, "launch_f32_moe_gemv: MXFP4 input ", w.in,
                          " exceeds the kernel's shared-memory row of 48 KiB");
    if (swiglu)
      f32_mxfp4w_moe_gemv<true><<<grid, kThreads, shared, stream>>>(a);
    else
      f32_mxfp4w_moe_gemv<false><<<grid, kThreads, shared, stream>>>(a);
    HIP_LAUNCH_CHECK("f32_mxfp4w_moe_gemv", stream);
    return;
  }
  PARITY_DEVICE_REQUIRE(w.dense != nullptr, "launch_f32_moe_gemv: null dense expert weights");
  const dim3 grid(unsigned(ceil_div(units, kThreads)), unsigned(k), unsigned(batch));
  dispatch_weight_type(w.dense_type, [&]<typename W>() {
    if (swiglu)
      f32_dense_moe_gemv_w<W, true><<<grid, kThreads, 0, stream>>>(a);
    else
      f32_dense_moe_gemv_w<W, false><<<grid, kThreads, 0, stream>>>(a);
  });
  HIP_LAUNCH_CHECK("f32_dense_moe_gemv_w", stream);
}

}  // namespace parity::device
