// Float32 inputs split into three BF16 parts for the MMA kernels (experts.hip, linear.hip): hi =
// bf16(x), mid = bf16(x - hi), lo = x - hi - mid (each difference is exact in float32, and lo has
// at most 8 significant bits), so hi + mid + lo = x exactly. Weights exact in BF16 (BF16 matrices;
// MXFP4 codes times their scales) then give exact products on the tiles, whose three sums make
// w * x: the tiles' only roundings are their float32 accumulations, as in a float32 dot product.
//
// Layout (32-bit words): block b of 32 inputs (inputs 32 b .. 32 b + 31 of the flat array) at
// split + 48 b; part q (0 hi, 1 mid, 2 lo) at + 16 q; lane t's 8 inputs at + 4 t as the BF16 pairs
// (8t, 8t+4), (8t+1, 8t+5), (8t+2, 8t+6), (8t+3, 8t+7): the k order of the A fragments the MMA
// kernels build from a lane's 8 consecutive weights, so one 16-byte load is a lane's B fragments
// for both k steps of a block.
#include "device/device_math.h"
#include "device/split_inputs.h"

namespace parity::device {
namespace {

__global__ void __launch_bounds__(256)
    split_bf16x3(const float* x, int64_t blocks, uint32_t* split) {
  allow_next_grid_start();  // a projection after it may load its weights meanwhile
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= blocks * 4) return;
  const int64_t b = i / 4;
  const int t = int(i % 4);
  const float4 f0 = *reinterpret_cast<const float4*>(x + 32 * b + 8 * t);
  const float4 f1 = *reinterpret_cast<const float4*>(x + 32 * b + 8 * t + 4);
  const float v[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
  split_bf16x3_write8(v, split + kSplitWordsPerBlock * b, t);
}

}  // namespace

size_t split_bf16x3_words(int64_t floats) {
  return size_t(floats) / 32 * kSplitWordsPerBlock;
}

void launch_split_bf16x3(const float* x, int64_t floats, std::span<uint32_t> split,
                         hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(floats > 0 && floats % 32 == 0, "launch_split_bf16x3: ", floats,
                        " inputs are not a positive multiple of 32");
  PARITY_DEVICE_REQUIRE(x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                        "launch_split_bf16x3: x must be 16-byte aligned");
  PARITY_DEVICE_REQUIRE(split.data() != nullptr &&
                            reinterpret_cast<uintptr_t>(split.data()) % 16 == 0 &&
                            split.size() >= split_bf16x3_words(floats),
                        "launch_split_bf16x3: the split workspace holds ", split.size(),
                        " words (16-byte aligned), the inputs need ", split_bf16x3_words(floats));
  const int64_t blocks = floats / 32;
  split_bf16x3<<<unsigned(ceil_div(blocks * 4, 256)), 256, 0, stream>>>(x, blocks, split.data());
  HIP_LAUNCH_CHECK("split_bf16x3", stream);
}

}  // namespace parity::device
