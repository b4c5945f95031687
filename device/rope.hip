// qkv split + YaRN RoPE (gpt_oss/torch/model.py RotaryEmbedding / _apply_rotary_emb): the
// fused qkv row is split into q (nH heads), k (nKV heads) and v (nKV heads); q and k are rotated
// in half-split (NeoX) pairs (i, i + d/2); v is copied. Three stage outputs from one kernel:
// q_rope, k_rope and v depend only on qkv, so producing them together is exact.
//   angle = float(pos) * inv_freq[i]   (inv_freq: the YaRN table computed in double on the host
//   from Rope::from_config and rounded to float; the angle in float, as transformers does)
//   c = cos(angle) * concentration, s = sin(angle) * concentration
//   out[i] = x[i] c - x[i + d/2] s,   out[i + d/2] = x[i + d/2] c + x[i] s
#include <algorithm>

#include "device/device_math.h"
#include "device/kv_access.h"

namespace parity::device {
namespace {

constexpr int kRopeThreads = 256;

// grid (B, ceil((nH + nKV) / heads_per_block) + 1): block y rotates heads y hpb .. y hpb + hpb - 1
// of q then k, one (head, i) pair per thread (its angle's cos and sin computed once); the last
// block of the row copies v. With `append`, the k heads and v also go to the row's KV-cache rows
// (the cache's K(pos) and V(pos) of the layer's slot, in its dtype, as f32_kv_cache_append writes
// them).
__global__ void __launch_bounds__(kRopeThreads)
    f32_qkv_split_yarn_rope(const float* __restrict__ qkv, const StepRow* __restrict__ rows,
                            int n_heads, int n_kv, int head_dim, int heads_per_block,
                            const float* __restrict__ inv_freq, float concentration,
                            float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                            bool append, AttentionShape a, KvCacheView kv) {
  wait_for_previous_grid();  // launched to overlap the end of the kernel before (qkv)
  allow_next_grid_start();
  const int r = int(blockIdx.x);
  const int half = head_dim / 2;
  const int qkv_dim = (n_heads + 2 * n_kv) * head_dim;
  const int kv_dim = n_kv * head_dim;
  const float* src = qkv + int64_t(r) * qkv_dim;
  // Element offset of the row's K(pos) (which = 0) or V(pos) (1) in the cache.
  const auto cache_row = [&](int which) {
    const int32_t* table = kv.block_tables + rows[r].kv_table[a.kv_group];
    return kv_row_offset(kv, table, a.kv_slot, which, rows[r].pos, kv_dim);
  };
  if (int(blockIdx.y) + 1 == int(gridDim.y)) {  // v
    const float* vsrc = src + (n_heads + n_kv) * head_dim;
    const int64_t vc = append ? cache_row(1) : 0;
    for (int t = int(threadIdx.x); t < kv_dim; t += int(blockDim.x)) {
      const float x = vsrc[t];
      v[int64_t(r) * kv_dim + t] = x;
      if (append) kv_store(kv, vc + t, x);
    }
    return;
  }
  const float pos = float(rows[r].pos);
  const int head0 = int(blockIdx.y) * heads_per_block;
  const int pairs = min(heads_per_block, n_heads + n_kv - head0) * half;
  for (int t = int(threadIdx.x); t < pairs; t += int(blockDim.x)) {
    const int head = head0 + t / half, i = t % half;
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle) * concentration;
    const float s = sinf(angle) * concentration;
    const float* x = src + head * head_dim;  // q heads, then k heads: contiguous in qkv
    float* out = head < n_heads ? q + (int64_t(r) * n_heads + head) * head_dim
                                : k + (int64_t(r) * n_kv + (head - n_heads)) * head_dim;
    const float x1 = x[i], x2 = x[i + half];
    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    out[i] = y1;
    out[i + half] = y2;
    if (append && head >= n_heads) {
      const int64_t kc = cache_row(0) + (head - n_heads) * head_dim;
      kv_store(kv, kc + i, y1);
      kv_store(kv, kc + i + half, y2);
    }
  }
}

}  // namespace

void launch_f32_qkv_split_yarn_rope(const float* qkv, const StepRow* rows, int batch, int n_heads,
                                    int n_kv, int head_dim, const float* inv_freq,
                                    float concentration, float* q, float* k, float* v,
                                    const KvAppend* append, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(qkv != nullptr && rows != nullptr && inv_freq != nullptr && q != nullptr &&
                            k != nullptr && v != nullptr,
                        "launch_f32_qkv_split_yarn_rope: null pointer argument");
  PARITY_DEVICE_REQUIRE(batch > 0 && n_heads > 0 && n_kv > 0,
                        "launch_f32_qkv_split_yarn_rope: batch ", batch, ", heads ", n_heads,
                        ", kv heads ", n_kv, " must be positive");
  PARITY_DEVICE_REQUIRE(head_dim > 0 && head_dim % 2 == 0,
                        "launch_f32_qkv_split_yarn_rope: head_dim ", head_dim,
                        " must be positive and even (half-split pairs)");
  const int heads_per_block = std::max(1, kRopeThreads / (head_dim / 2));
  const int blocks_y = ceil_div(n_heads + n_kv, heads_per_block) + 1;
  PARITY_DEVICE_REQUIRE(blocks_y <= 65535, "launch_f32_qkv_split_yarn_rope: ", n_heads + n_kv,
                        " heads of dimension ", head_dim, " need too many blocks");
  AttentionShape a;
  KvCacheView kv{};
  if (append != nullptr) {
    a = append->shape, kv = append->kv;
    PARITY_DEVICE_REQUIRE(a.n_heads == n_heads && a.n_kv == n_kv && a.head_dim == head_dim &&
                              a.kv_group >= 0 && a.kv_group < kKvGroups && a.kv_slot >= 0 &&
                              a.kv_slot < kv.slots && kv.blocks != nullptr &&
                              kv.block_tables != nullptr,
                          "launch_f32_qkv_split_yarn_rope: the KV append's shape (", a.n_heads,
                          " heads, ", a.n_kv, " kv heads, d ", a.head_dim, ", slot ", a.kv_slot,
                          ") does not match or has no cache");
  }
  HIP_CHECK(launch_programmatic(&f32_qkv_split_yarn_rope, dim3(unsigned(batch), unsigned(blocks_y)),
                                dim3(kRopeThreads), 0, stream, qkv, rows, n_heads, n_kv, head_dim,
                                heads_per_block, inv_freq, concentration, q, k, v,
                                append != nullptr, a, kv));
  HIP_LAUNCH_CHECK("f32_qkv_split_yarn_rope", stream);
}

}  // namespace parity::device
