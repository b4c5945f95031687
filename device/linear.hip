// Dense GEMV with bias for the BF16/F16/F32 projections (qkv, o_proj, router, lm_head):
//   y[b, col + j] = W[j, :] . x[b, :] + bias[j],  W [out, in] (PyTorch layout), x (B, in).
// Memory bound: one warp per output row streams the row once with 16-byte loads (8 elements
// per lane per step, 8 loads in flight per lane) and serves up to RB batch rows from it; fp32
// accumulation with fmaf in a fixed lane order, then a butterfly reduction. A row's result does not
// depend on RB or on the other rows. Optional epilogue: resid_out = residual + y (o_proj ->
// resid_attn), the same single addition the unfused path does.
#include <algorithm>
#include <vector>

#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kMaxSegments = 3;
constexpr int kBlockThreads = 256;

template <typename W>
struct GemvArgs {
  const W* w[kMaxSegments];
  const float* bias[kMaxSegments];
  int row_end[kMaxSegments];  // cumulative output rows
  int y_col[kMaxSegments];
  int nseg;
  int in;
  const float* x;
  int ldx;
  int batch;
  float* y;
  int ldy;
  const float* residual;
  float* resid_out;
  int ld_res;
};

template <typename W, int RB, bool kVec>
__global__ void __launch_bounds__(kBlockThreads) f32_gemv_bias_w(const GemvArgs<W> a) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int row = int(blockIdx.x) * (int(blockDim.x) / kWarpSize) + int(threadIdx.x) / kWarpSize;
  if (row >= a.row_end[a.nseg - 1]) return;  // whole warps leave together
  // The segment holding this output row (at most three: q, k, v).
  const W* w = a.w[0];
  const float* bias = a.bias[0];
  int j = row, col = a.y_col[0];
  if (row >= a.row_end[0]) {
    if (row < a.row_end[1]) {
      w = a.w[1], bias = a.bias[1], j = row - a.row_end[0], col = a.y_col[1];
    } else {
      w = a.w[2], bias = a.bias[2], j = row - a.row_end[1], col = a.y_col[2];
    }
  }
  const W* wr = w + int64_t(j) * a.in;
  const int b0 = int(blockIdx.y) * RB;
  const int nb = min(RB, a.batch - b0);
  const float* x0 = a.x + int64_t(b0) * a.ldx;

  float acc[RB];
#pragma unroll
  for (int b = 0; b < RB; ++b) acc[b] = 0.0f;
  if constexpr (kVec) {
    // kChunks 16-byte weight loads in flight per lane before any is used; the chunks are
    // still summed in the order c = lane, lane + warp, ... (as a plain loop would).
    constexpr int kChunks = 8;
    const int n8 = a.in / 8;
    for (int c0 = lane; c0 < n8; c0 += kChunks * kWarpSize) {
      Raw8<W> wq[kChunks];
#pragma unroll
      for (int u = 0; u < kChunks; ++u)
        if (c0 + u * kWarpSize < n8) wq[u] = load_raw8(wr + 8 * (c0 + u * kWarpSize));
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int c = c0 + u * kWarpSize;
        if (c < n8) {
          float wv[8];
          decode8(wq[u], wv);
#pragma unroll
          for (int b = 0; b < RB; ++b) {
            if (b < nb) {
              float xv[8];
              load8(x0 + int64_t(b) * a.ldx + 8 * c, xv);
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[b] = fmaf(wv[e], xv[e], acc[b]);
            }
          }
        }
      }
    }
  } else {
    for (int i = lane; i < a.in; i += kWarpSize) {
      const float wv = to_f32(wr[i]);
#pragma unroll
      for (int b = 0; b < RB; ++b)
        if (b < nb) acc[b] = fmaf(wv, x0[int64_t(b) * a.ldx + i], acc[b]);
    }
  }
#pragma unroll
  for (int b = 0; b < RB; ++b) acc[b] = warp_sum(acc[b]);
  if (lane != 0) return;
  const float bj = bias != nullptr ? bias[j] : 0.0f;
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    if (b < nb) {
      const float v = bias != nullptr ? acc[b] + bj : acc[b];
      a.y[int64_t(b0 + b) * a.ldy + col + j] = v;
      if (a.resid_out != nullptr) {
        const int64_t at = int64_t(b0 + b) * a.ld_res + col + j;
        a.resid_out[at] = a.residual[at] + v;
      }
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename W, int RB>
void launch_rb(const GemvArgs<W>& a, bool vec, int grid_x, hipStream_t stream) {
  const dim3 grid(unsigned(grid_x), unsigned(ceil_div(a.batch, RB)));
  if (vec)
    f32_gemv_bias_w<W, RB, true><<<grid, kBlockThreads, 0, stream>>>(a);
  else
    f32_gemv_bias_w<W, RB, false><<<grid, kBlockThreads, 0, stream>>>(a);
}

}  // namespace

void launch_f32_gemv_bias(std::span<const GemvSegment> segments, const float* x, int ldx, int batch,
                          float* y, int ldy, GemvResidual residual, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(!segments.empty(), "launch_f32_gemv_bias: no segments");
  PARITY_DEVICE_REQUIRE(x != nullptr && y != nullptr, "launch_f32_gemv_bias: null x or y");
  PARITY_DEVICE_REQUIRE(batch > 0, "launch_f32_gemv_bias: batch ", batch, " must be positive");
  PARITY_DEVICE_REQUIRE(residual.residual == nullptr || segments.size() == 1,
                        "launch_f32_gemv_bias: the residual epilogue takes one segment");
  PARITY_DEVICE_REQUIRE((residual.residual == nullptr) == (residual.out == nullptr),
                        "launch_f32_gemv_bias: residual and its output go together");
  const int in = segments[0].w.cols;
  bool same_type = segments.size() <= size_t(kMaxSegments);
  for (const auto& s : segments) {
    PARITY_DEVICE_REQUIRE(s.w.data != nullptr && s.w.rows > 0 && s.w.cols == in,
                          "launch_f32_gemv_bias: segment [", s.w.rows, ", ", s.w.cols,
                          "] does not take inputs of ", in);
    PARITY_DEVICE_REQUIRE(s.y_col >= 0 && s.y_col + s.w.rows <= ldy,
                          "launch_f32_gemv_bias: segment columns [", s.y_col, ", ",
                          s.y_col + s.w.rows, ") outside the output row of ", ldy);
    same_type = same_type && s.w.type == segments[0].w.type;
  }
  PARITY_DEVICE_REQUIRE(in > 0 && ldx >= in, "launch_f32_gemv_bias: ldx ", ldx, " < in ", in);
  PARITY_DEVICE_REQUIRE(
      residual.residual == nullptr || residual.ld >= segments[0].y_col + segments[0].w.rows,
      "launch_f32_gemv_bias: residual row of ", residual.ld, " too short");
  if (!same_type) {  // mixed dtypes (never in practice): one launch per segment
    for (const auto& s : segments)
      launch_f32_gemv_bias(std::span<const GemvSegment>(&s, 1), x, ldx, batch, y, ldy, residual,
                           stream);
    return;
  }
  dispatch_weight_type(segments[0].w.type, [&]<typename W>() {
    GemvArgs<W> a{};
    int rows = 0;
    bool vec = in % 8 == 0 && ldx % 4 == 0 && aligned16(x);
    for (size_t i = 0; i < segments.size(); ++i) {
      a.w[i] = static_cast<const W*>(segments[i].w.data);
      a.bias[i] = segments[i].bias;
      rows += segments[i].w.rows;
      a.row_end[i] = rows;
      a.y_col[i] = segments[i].y_col;
      vec = vec && aligned16(a.w[i]);
    }
    for (size_t i = segments.size(); i < size_t(kMaxSegments); ++i) {
      a.w[i] = a.w[0], a.bias[i] = a.bias[0], a.row_end[i] = rows, a.y_col[i] = 0;
    }
    a.nseg = int(segments.size());
    a.in = in;
    a.x = x;
    a.ldx = ldx;
    a.batch = batch;
    a.y = y;
    a.ldy = ldy;
    a.residual = residual.residual;
    a.resid_out = residual.out;
    a.ld_res = residual.ld;
    const int rows_per_block = kBlockThreads / device_warp_size();
    const int grid_x = ceil_div(rows, rows_per_block);
    if (batch == 1)
      launch_rb<W, 1>(a, vec, grid_x, stream);
    else if (batch == 2)
      launch_rb<W, 2>(a, vec, grid_x, stream);
    else if (batch <= 4)
      launch_rb<W, 4>(a, vec, grid_x, stream);
    else
      launch_rb<W, 8>(a, vec, grid_x, stream);
  });
  HIP_LAUNCH_CHECK("f32_gemv_bias_w", stream);
}

}  // namespace parity::device
