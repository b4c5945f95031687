// A tensor-parallel group's joins (device/runtime/shard_plan.h), after each rank's partial rows
// were gathered from every rank (Communicator::all_gather; the ranks' rows [rank][n]):
//   rank sum    sum[i] = ((part[0][i] + part[1][i]) + part[2][i]) + ...   (rank order, so every
//               rank and every batch gives the same bits), and resid_out[i] = residual[i] + sum[i]
//               (the same single addition as the unsplit fused residual): o_proj's and moe_out's
//               all-reduce;
//   vocab join  logits[b][j] = the row b, column j - begin(r) of rank r's shard, r the rank whose
//               vocabulary rows (split_range(vocab, ranks, r)) hold j: lm_head's shards into the
//               full rows the sampler reads.
#include "device/device_math.h"

namespace parity::device {
namespace {

__global__ void __launch_bounds__(256)
    f32_rank_sum_residual(const float* __restrict__ parts, int ranks, int64_t n,
                          const float* __restrict__ residual, float* __restrict__ sum,
                          float* __restrict__ resid_out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = parts[i];
  for (int r = 1; r < ranks; ++r) acc += parts[int64_t(r) * n + i];
  sum[i] = acc;
  if (resid_out != nullptr) resid_out[i] = residual[i] + acc;
}

__global__ void __launch_bounds__(256)
    f32_vocab_join(const float* __restrict__ parts, int ranks, int vocab, int64_t part_floats,
                   float* __restrict__ logits) {
  const int j = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  const int b = int(blockIdx.y);
  if (j >= vocab) return;
  // split_range(vocab, ranks, r): the first `extra` ranks hold base + 1 rows.
  const int base = vocab / ranks, extra = vocab % ranks;
  const int boundary = extra * (base + 1);
  const int r = j < boundary ? j / (base + 1) : extra + (j - boundary) / base;
  const int begin = r * base + min(r, extra), size = base + (r < extra ? 1 : 0);
  logits[int64_t(b) * vocab + j] =
      parts[int64_t(r) * part_floats + int64_t(b) * size + (j - begin)];
}

}  // namespace

void launch_f32_rank_sum_residual(const float* parts, int ranks, int64_t n, const float* residual,
                                  float* sum, float* resid_out, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(parts != nullptr && sum != nullptr && ranks >= 1 && n > 0,
                        "launch_f32_rank_sum_residual: null pointer or empty range");
  PARITY_DEVICE_REQUIRE((residual == nullptr) == (resid_out == nullptr),
                        "launch_f32_rank_sum_residual: residual and its output go together");
  f32_rank_sum_residual<<<ceil_div(n, 256), 256, 0, stream>>>(parts, ranks, n, residual, sum,
                                                              resid_out);
  HIP_LAUNCH_CHECK("f32_rank_sum_residual", stream);
}

void launch_f32_vocab_join(const float* parts, int ranks, int rows, int vocab, int64_t part_floats,
                           float* logits, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(
      parts != nullptr && logits != nullptr && ranks >= 1 && rows > 0 && vocab >= ranks,
      "launch_f32_vocab_join: null pointer or empty range");
  PARITY_DEVICE_REQUIRE(part_floats >= int64_t(rows) * ((vocab + ranks - 1) / ranks),
                        "launch_f32_vocab_join: a rank's part of ", part_floats,
                        " floats is short of its rows");
  f32_vocab_join<<<dim3(unsigned(ceil_div(vocab, 256)), unsigned(rows)), 256, 0, stream>>>(
      parts, ranks, vocab, part_floats, logits);
  HIP_LAUNCH_CHECK("f32_vocab_join", stream);
}

}  // namespace parity::device
