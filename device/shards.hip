// A tensor-parallel group's joins (device/runtime/shard_plan.h), after each rank's partial rows
// were gathered from every rank (Communicator::all_gather; the ranks' rows [rank][n]):
//   rank sum    sum[i] = ((part[0][i] + part[1][i]) + part[2][i]) + ...   (rank order, so every
//               rank and every batch gives the same bits), and resid_out[i] = residual[i] + sum[i]
//               (the same single addition as the unsplit fused residual): o_proj's and moe_out's
//               all-reduce;
//   vocab join  logits[b][j] = the row b, column j - begin(r) of rank r's shard, r the rank whose
//               vocabulary rows (split_range(vocab, ranks, r)) hold j: lm_head's shards into the
//               full rows the sampler reads.
// And both without NCCL for ranks that reach each other's memory: each rank's part stored
// straight into every rank's parts, then the same rank sum or the same join.
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

// The peer-store kernels (kernels.h: launch_f32_peer_rank_sum_residual,
// launch_f32_peer_vocab_join). Block b owns the same slice of float4s of a part on every rank: it
// writes that slice of this rank's part into every rank's parts, raises its flag at every rank,
// waits for every rank's flag of this call at its own, and then uses the slice of every rank's
// part. The blocks need not meet each other, only their namesakes on the other ranks, and the
// kernels' 32 blocks are all resident at once.
constexpr int kPeerThreads = 256;

struct PeerSlice {
  int64_t lo, hi;  // float4s of a part this block owns
  int parity;      // the parts buffer of this call
  bool ok;         // every rank arrived
};

// The exchange of this block's slice of `data` (n floats, this rank's part) into every rank's
// parts; returns the slice, the call's parity and whether every rank came.
__device__ PeerSlice peer_exchange(const PeerReduceView& v, const float* data, int64_t n) {
  __shared__ uint32_t s_epoch;
  __shared__ int s_ok;
  const int b = int(blockIdx.x), t = int(threadIdx.x);
  if (t == 0) s_epoch = v.epoch[b] + 1;
  __syncthreads();
  const uint32_t e = s_epoch;
  PeerSlice slice;
  slice.parity = int(e & 1u);
  const int64_t n4 = n / 4, per = (n4 + kPeerBlocks - 1) / kPeerBlocks;
  slice.lo = min(n4, int64_t(b) * per);
  slice.hi = min(n4, slice.lo + per);

  for (int64_t i = slice.lo + t; i < slice.hi; i += kPeerThreads) {
    const float4 x = reinterpret_cast<const float4*>(data)[i];
    for (int r = 0; r < v.ranks; ++r)
      reinterpret_cast<float4*>(v.parts[r][slice.parity] + int64_t(v.rank) * n)[i] = x;
  }
  __threadfence_system();  // the stores are visible to every GPU before the flags below
  __syncthreads();

  if (t == 0) {
    for (int r = 0; r < v.ranks; ++r)
      *reinterpret_cast<volatile uint32_t*>(v.flags[r] + b * kPeerMaxRanks + v.rank) = e;
    // Every rank's flag of this call (or of the next: a rank may be one call ahead).
    const volatile uint32_t* mine = v.flags[v.rank] + b * kPeerMaxRanks;
    const uint64_t start = device_wall_clock();
    int ok = 1;
    for (int r = 0; r < v.ranks && ok; ++r) {
      uint32_t spins = 0;
      while (int32_t(mine[r] - e) < 0) {
        if ((++spins & 255u) != 0) continue;
        if (*v.abort != 0u || device_wall_clock() - start > v.timeout_ticks) {
          // A plain store: host memory takes no atomics over every bus, and any waiting block's
          // rank will do for the message.
          if (*v.abort == 0u) *reinterpret_cast<volatile uint32_t*>(v.failed) = uint32_t(r + 1);
          ok = 0;
          break;
        }
      }
    }
    __threadfence_system();  // the parts' loads after this come after the flags'
    v.epoch[b] = e;
    s_ok = ok;
  }
  __syncthreads();
  slice.ok = s_ok != 0;
  return slice;
}

__global__ void __launch_bounds__(kPeerThreads)
    f32_peer_rank_sum_residual(PeerReduceView v, const float* data, int64_t n,
                               const float* __restrict__ residual, float* sum,
                               float* __restrict__ resid_out) {
  const PeerSlice slice = peer_exchange(v, data, n);
  if (!slice.ok) return;
  // The rank-order sum of launch_f32_rank_sum_residual, four floats at a time.
  const float* own = v.parts[v.rank][slice.parity];
  for (int64_t i = slice.lo + int(threadIdx.x); i < slice.hi; i += kPeerThreads) {
    float4 acc = load_published(reinterpret_cast<const float4*>(own) + i);
    for (int r = 1; r < v.ranks; ++r) {
      const float4 x = load_published(reinterpret_cast<const float4*>(own + int64_t(r) * n) + i);
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    reinterpret_cast<float4*>(sum)[i] = acc;
    if (resid_out != nullptr) {
      const float4 res = reinterpret_cast<const float4*>(residual)[i];
      reinterpret_cast<float4*>(resid_out)[i] =
          make_float4(res.x + acc.x, res.y + acc.y, res.z + acc.z, res.w + acc.w);
    }
  }
}

// The vocabulary join of f32_vocab_join from the exchanged parts: this block's slice of every
// rank's part (rank r's rows of size(r) columns, the part `part` floats) to its place in logits.
__global__ void __launch_bounds__(kPeerThreads)
    f32_peer_vocab_join(PeerReduceView v, const float* shard, int64_t part, int rows, int vocab,
                        float* __restrict__ logits) {
  const PeerSlice slice = peer_exchange(v, shard, part);
  if (!slice.ok) return;
  const float* parts = v.parts[v.rank][slice.parity];
  const int base = vocab / v.ranks, extra = vocab % v.ranks;
  for (int r = 0; r < v.ranks; ++r) {
    const int begin = r * base + min(r, extra), size = base + (r < extra ? 1 : 0);
    const int64_t valid = int64_t(rows) * size;
    const float4* src = reinterpret_cast<const float4*>(parts + int64_t(r) * part);
    for (int64_t i = slice.lo + int(threadIdx.x); i < slice.hi; i += kPeerThreads) {
      const float4 x = load_published(src + i);
      const float xs[4] = {x.x, x.y, x.z, x.w};
      for (int c = 0; c < 4; ++c) {
        const int64_t at = 4 * i + c;
        if (at >= valid) break;
        const int64_t row = at / size, col = at % size;
        logits[row * vocab + begin + col] = xs[c];
      }
    }
  }
}

}  // namespace

void launch_f32_peer_rank_sum_residual(const PeerReduceView& peers, const float* data, int64_t n,
                                       const float* residual, float* sum, float* resid_out,
                                       hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(
      data != nullptr && sum != nullptr && n > 0 && n % 4 == 0 && n <= peers.capacity,
      "launch_f32_peer_rank_sum_residual: ", n, " floats (a multiple of 4, at most ",
      peers.capacity, ")");
  PARITY_DEVICE_REQUIRE(peers.ranks >= 2 && peers.ranks <= kPeerMaxRanks && peers.rank >= 0 &&
                            peers.rank < peers.ranks && peers.epoch != nullptr &&
                            peers.abort != nullptr && peers.failed != nullptr,
                        "launch_f32_peer_rank_sum_residual: rank ", peers.rank, " of ", peers.ranks,
                        " without its places");
  PARITY_DEVICE_REQUIRE((residual == nullptr) == (resid_out == nullptr),
                        "launch_f32_peer_rank_sum_residual: residual and its output go together");
  PARITY_DEVICE_REQUIRE(
      aligned16(data) && aligned16(sum) && aligned16(residual) && aligned16(resid_out),
      "launch_f32_peer_rank_sum_residual: buffers not 16-byte aligned");
  f32_peer_rank_sum_residual<<<kPeerBlocks, kPeerThreads, 0, stream>>>(peers, data, n, residual,
                                                                       sum, resid_out);
  HIP_LAUNCH_CHECK("f32_peer_rank_sum_residual", stream);
}

void launch_f32_peer_vocab_join(const PeerReduceView& peers, const float* shard, int64_t part,
                                int rows, int vocab, float* logits, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(shard != nullptr && logits != nullptr && rows > 0 && part > 0 &&
                            part % 4 == 0 && part <= peers.capacity && aligned16(shard),
                        "launch_f32_peer_vocab_join: a part of ", part,
                        " floats (a multiple of 4, at most ", peers.capacity, ")");
  PARITY_DEVICE_REQUIRE(peers.ranks >= 2 && peers.ranks <= kPeerMaxRanks && peers.rank >= 0 &&
                            peers.rank < peers.ranks && peers.epoch != nullptr &&
                            peers.abort != nullptr && peers.failed != nullptr,
                        "launch_f32_peer_vocab_join: rank ", peers.rank, " of ", peers.ranks,
                        " without its places");
  PARITY_DEVICE_REQUIRE(
      vocab >= peers.ranks && part >= int64_t(rows) * ((vocab + peers.ranks - 1) / peers.ranks),
      "launch_f32_peer_vocab_join: a part of ", part, " floats is short of ", rows, " rows");
  f32_peer_vocab_join<<<kPeerBlocks, kPeerThreads, 0, stream>>>(peers, shard, part, rows, vocab,
                                                                logits);
  HIP_LAUNCH_CHECK("f32_peer_vocab_join", stream);
}

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
