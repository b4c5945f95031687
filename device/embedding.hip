// Embedding gather (gpt_oss/torch/model.py Transformer.forward: x = embedding(token), no
// scaling): one block per row copies table[token] (checkpoint dtype) into float. Also the plain
// row gather the engine's epilogue uses.
#include "device/device_math.h"

namespace parity::device {
namespace {

template <typename W>
__global__ void __launch_bounds__(256)
    f32_embedding_gather_w(const W* __restrict__ table, int vocab, int hidden,
                           const StepRow* __restrict__ rows, float* __restrict__ x) {
  const int r = int(blockIdx.x);
  const int token = rows[r].token;
  float* out = x + int64_t(r) * hidden;
  if (token < 0 || token >= vocab) {  // the host validates tokens; never read out of bounds
    for (int i = int(threadIdx.x); i < hidden; i += int(blockDim.x)) out[i] = NAN;
    return;
  }
  const W* src = table + int64_t(token) * hidden;
  for (int i = int(threadIdx.x); i < hidden; i += int(blockDim.x)) out[i] = to_f32(src[i]);
}

__global__ void __launch_bounds__(256)
    f32_gather_rows(const float* __restrict__ x, const int32_t* __restrict__ rows, int n,
                    float* __restrict__ y) {
  const float* src = x + int64_t(rows[blockIdx.x]) * n;
  float* out = y + int64_t(blockIdx.x) * n;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) out[i] = src[i];
}

}  // namespace

void launch_f32_gather_rows(const float* x, const int32_t* rows, int count, int n, float* y,
                            hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(x != nullptr && rows != nullptr && y != nullptr,
                        "launch_f32_gather_rows: null pointer argument");
  PARITY_DEVICE_REQUIRE(count > 0 && n > 0, "launch_f32_gather_rows: count ", count, " and n ", n,
                        " must be positive");
  f32_gather_rows<<<count, 256, 0, stream>>>(x, rows, n, y);
  HIP_LAUNCH_CHECK("f32_gather_rows", stream);
}

void launch_f32_embedding_gather(const Matrix& table, const StepRow* rows, int batch, float* x,
                                 hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(table.data != nullptr && rows != nullptr && x != nullptr,
                        "launch_f32_embedding_gather: null pointer argument");
  PARITY_DEVICE_REQUIRE(batch > 0 && table.rows > 0 && table.cols > 0,
                        "launch_f32_embedding_gather: batch ", batch, " and table [", table.rows,
                        ", ", table.cols, "] must be positive");
  dispatch_weight_type(table.type, [&]<typename W>() {
    f32_embedding_gather_w<W><<<batch, 256, 0, stream>>>(static_cast<const W*>(table.data),
                                                         table.rows, table.cols, rows, x);
  });
  HIP_LAUNCH_CHECK("f32_embedding_gather_w", stream);
}

}  // namespace parity::device
