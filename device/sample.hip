// Sampling on the device: the token engine/sampler.h defines, row for row (its header states the
// definition; this file keeps its step numbers). One block per row.
//
// Greedy rows (temperature <= 0 or top_k == 1): the argmax as f32_argmax (device/sampled.hip):
// one pass over the row.
//
// Other rows never sort the vocabulary. They select keys by radix descent over the 64-bit order
// key K = (descending float bits << 32) | id, six digits of 11, 11, 10 | 11, 11, 10 bits (three
// for the logit, three for the id). "Select(t)" finds the first key, in ascending order, whose
// inclusive cumulative mass exceeds t, where the mass of a key is 1 (counting) or its weight W
// (step 4): at each digit a pass over the row adds the mass of every key that matches the digits
// chosen so far into a shared-memory histogram of 2048 bins (integer atomics: exact and
// order-independent, so the result never depends on scheduling), and a block scan picks the bin.
// After the three logit digits the key's logit is known, so is its W: the remaining mass t
// becomes the rank j = t / W among the equal logits, and the smallest id of the bin (tracked in
// the third pass) answers when j = 0; ties that need a later id take the three id digits.
//
//   pass A  the finite count, the largest logit, and (top_k > 0) the first digit's counts;
//   top-k   Select(top_k - 1) by count: two more passes (plus three for a cut inside a tie);
//   then, when the top-k set has at most 2048 keys, one pass gathers them into shared memory, a
//   bitonic sort orders them, and steps 4-6 run on that list (W for those keys only);
//   otherwise a pass computes W for the set (S and the first digit's weighted histogram), top-p
//   is Select(P - 1) by weight (two passes; W computed only for keys in the chosen bin), and the
//   draw is Select(R) by weight within the kept prefix, its first digit read from the saved
//   histogram restricted to the prefix (two passes).
//
// Cost for a 201,088-entry row (804 KB, read from L2 after the first pass): top-k rows 4 passes,
// top-p-only rows 6 passes and one exp per candidate within 28.5 temperature units of the max.
#include "device/device_math.h"

namespace parity::device {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 16;  // loads in flight per thread in a pass over the row
constexpr int kBins = 2048;  // the widest digit: 11 bits
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kListCapacity = 2048;  // top-k sets up to this size are sorted in shared memory
constexpr int kLevels = 6;
constexpr uint64_t kNoKey = ~uint64_t(0);
static_assert(kBins % kThreads == 0 && kListCapacity % kThreads == 0);
static_assert(kListCapacity / kThreads == kBinsPerThread);

struct Histogram {
  uint64_t mass[kBins];
  uint64_t saved[kBins];  // the first digit's weights over the top-k set, for the draw
};
struct SortedList {
  uint64_t key[kListCapacity];
  uint64_t cumulative[kListCapacity];
};
struct SampleShared {
  union {
    Histogram hist;
    SortedList list;
  } u;
  uint32_t min_id[kBins];  // per bin of the third digit (an exact logit): its smallest id
  uint64_t scan[kThreads];
  uint64_t total;
  uint64_t found_before;
  uint32_t found_index;
  uint32_t finite;
  uint32_t max_desc;
  uint32_t count;
  float best_v[kThreads / 32];
  int best_i[kThreads / 32];
};

__device__ __forceinline__ void atomic_add_u64(uint64_t* p, uint64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

__device__ __forceinline__ bool is_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// engine/sampler.cpp sampling_descending_bits, sampling_order_key, logit_of_key, sampling_weight,
// splitmix64 and sampling_uniform: the same operations.
__device__ __forceinline__ uint32_t descending_bits(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) == 0) b = 0;  // -0 ranks as +0
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~ascending;
}
__device__ __forceinline__ uint64_t order_key(float x, int id) {
  return (uint64_t(descending_bits(x)) << 32) | uint32_t(id);
}
__device__ __forceinline__ float logit_of_desc(uint32_t desc) {
  const uint32_t ascending = ~desc;
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}
// Out of line: the passes call it from a 16-way unrolled loop.
__device__ __noinline__ uint64_t weight_of(float x, float max_logit, double temperature) {
  const double e = (double(x) - double(max_logit)) / temperature;
  if (e < -28.5) return 0;  // exp(-28.5) 2^40 = 0.46: rounds to 0 whatever exp's last bit
  return uint64_t(rint(exp(e) * 0x1p40));
}
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
__device__ __forceinline__ double sampling_uniform(uint64_t seed, uint64_t request, uint64_t step) {
  uint64_t x = splitmix64(seed);
  x = splitmix64(x ^ request);
  x = splitmix64(x ^ step);
  return double(x >> 11) * 0x1p-53;
}
// Step 5's target P = min(max(ceil(top_p S), 1), S).
__device__ __forceinline__ uint64_t top_p_target(double top_p, uint64_t total) {
  const double scaled = ceil(top_p * double(total));
  const uint64_t want = scaled >= 1 ? uint64_t(scaled) : 1;
  return want < total ? want : total;
}
// Step 6's R = min(floor(u S'), S' - 1).
__device__ __forceinline__ uint64_t draw_target(double u, uint64_t kept_total) {
  const uint64_t r = uint64_t(u * double(kept_total));
  return r < kept_total - 1 ? r : kept_total - 1;
}

// Digit `level` of a key: bits [shift, shift + width).
__device__ __forceinline__ int digit_width(int level) {
  return level % 3 == 2 ? 10 : 11;
}
__device__ __forceinline__ int digit_shift(int level) {
  return (level < 3 ? 32 : 0) + (level % 3 == 0 ? 21 : level % 3 == 1 ? 10 : 0);
}

// f(x, id) for every logit of the row, each thread over a strided slice, kUnroll loads issued
// before any is used.
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ row, int vocab, F&& f) {
  const int tid = int(threadIdx.x);
  for (int base = 0; base < vocab; base += kThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int i = base + j * kThreads + tid;
      v[j] = i < vocab ? row[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int i = base + j * kThreads + tid;
      if (i < vocab) f(v[j], i);
    }
  }
}

// Inclusive prefix sum of one value per thread (Hillis-Steele in shared memory).
__device__ uint64_t block_inclusive_scan(uint64_t v, uint64_t* buf) {
  const int tid = int(threadIdx.x);
  buf[tid] = v;
  __syncthreads();
  for (int offset = 1; offset < kThreads; offset <<= 1) {
    const uint64_t add = tid >= offset ? buf[tid - offset] : 0;
    __syncthreads();
    buf[tid] += add;
    __syncthreads();
  }
  return buf[tid];
}

struct Found {
  uint32_t bin;
  uint64_t before;  // mass of the bins before it
};
// The first bin whose inclusive cumulative mass exceeds t (the total must exceed t).
__device__ Found find_bin(SampleShared& sh, const uint64_t* mass, uint64_t t) {
  const int first = int(threadIdx.x) * kBinsPerThread;
  uint64_t local = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) local += mass[first + j];
  const uint64_t inclusive = block_inclusive_scan(local, sh.scan);
  uint64_t before = inclusive - local;
  if (before <= t && t < inclusive) {
    for (int j = 0; j < kBinsPerThread; ++j) {
      const uint64_t m = mass[first + j];
      if (t < before + m) {
        sh.found_index = uint32_t(first + j);
        sh.found_before = before;
        break;
      }
      before += m;
    }
  }
  __syncthreads();
  return {sh.found_index, sh.found_before};
}

struct Selected {
  uint64_t key;
  uint64_t before;         // mass of the keys before it (weights: in W units)
  uint64_t first_before;   // mass of the first digit's bins before its bin
};

// Select(t): the first key <= bound (ascending) whose inclusive cumulative mass exceeds t; the
// mass of a key is its weight (weighted) or 1. With first_ready, sh.u.hist.mass already holds
// the first digit's histogram over the keys <= bound.
__device__ Selected select_key(SampleShared& sh, const float* __restrict__ row, int vocab,
                               uint64_t bound, uint64_t t, bool weighted, float max_logit,
                               double temperature, bool first_ready) {
  const int tid = int(threadIdx.x);
  uint64_t prefix = 0, before = 0, first_before = 0;
  for (int level = 0; level < kLevels; ++level) {
    const bool weigh = weighted && level < 3;
    if (level > 0 || !first_ready) {
      __syncthreads();
      for (int b = tid; b < kBins; b += kThreads) {
        sh.u.hist.mass[b] = 0;
        sh.min_id[b] = 0xffffffffu;
      }
      __syncthreads();
      const int shift = digit_shift(level);
      const uint32_t mask = (1u << digit_width(level)) - 1;
      const int prefix_shift = level > 0 ? digit_shift(level - 1) : 0;
      for_each_logit(row, vocab, [&](float x, int id) {
        if (!is_finite(x)) return;
        const uint64_t key = order_key(x, id);
        if (key > bound || (level > 0 && (key >> prefix_shift) != prefix)) return;
        const uint32_t d = uint32_t(key >> shift) & mask;
        const uint64_t m = weigh ? weight_of(x, max_logit, temperature) : 1;
        if (m != 0) atomic_add_u64(&sh.u.hist.mass[d], m);
        if (level == 2) atomicMin(&sh.min_id[d], uint32_t(id));
      });
      __syncthreads();
    }
    const Found f = find_bin(sh, sh.u.hist.mass, t);
    t -= f.before;
    if (!(weighted && level >= 3)) before += f.before;
    if (level == 0) first_before = f.before;
    prefix = (prefix << digit_width(level)) | f.bin;
    if (level == 2) {  // prefix is one logit's descending bits: its keys are equal but for the id
      if (weighted) {
        const uint64_t w = weight_of(logit_of_desc(uint32_t(prefix)), max_logit, temperature);
        const uint64_t rank = t / w;  // w > 0: the bin's mass exceeds t
        before += rank * w;
        t = rank;
      }
      if (t == 0) return {(prefix << 32) | sh.min_id[f.bin], before, first_before};
    }
  }
  return {prefix, before, first_before};
}

// Bitonic sort, ascending, of key[0, size), size a power of two.
__device__ void bitonic_sort(uint64_t* key, int size) {
  const int tid = int(threadIdx.x);
  for (int k = 2; k <= size; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < size; i += kThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const uint64_t a = key[i], b = key[partner];
          if ((a > b) == ((i & k) == 0)) key[i] = b, key[partner] = a;
        }
      }
      __syncthreads();
    }
}

// Steps 4-6 on the `kept` keys <= bound (at most kListCapacity), gathered and sorted.
__device__ int32_t sample_from_list(SampleShared& sh, const float* __restrict__ row, int vocab,
                                    uint64_t bound, int kept, const SampleParams& p,
                                    float max_logit, double u) {
  const int tid = int(threadIdx.x);
  uint64_t* key = sh.u.list.key;
  uint64_t* cumulative = sh.u.list.cumulative;
  __syncthreads();
  if (tid == 0) sh.count = 0;
  __syncthreads();
  for_each_logit(row, vocab, [&](float x, int id) {
    if (!is_finite(x)) return;
    const uint64_t k = order_key(x, id);
    if (k <= bound) key[atomicAdd(&sh.count, 1u)] = k;  // exactly `kept` keys
  });
  int size = 1;
  while (size < kept) size <<= 1;
  __syncthreads();
  for (int i = kept + tid; i < size; i += kThreads) key[i] = kNoKey;
  __syncthreads();
  bitonic_sort(key, size);

  const int first = tid * kBinsPerThread;
  uint64_t w[kBinsPerThread], local = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int i = first + j;
    w[j] = i < kept ? weight_of(logit_of_desc(uint32_t(key[i] >> 32)), max_logit, p.temperature)
                    : 0;
    local += w[j];
  }
  const uint64_t inclusive = block_inclusive_scan(local, sh.scan);
  uint64_t c = inclusive - local;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    c += w[j];
    if (first + j < kept) cumulative[first + j] = c;
  }
  if (tid == kThreads - 1) sh.total = inclusive;
  __syncthreads();

  int last = kept - 1;
  if (p.top_p < 1) {  // step 5: the first index whose cumulative weight reaches P
    const uint64_t want = top_p_target(p.top_p, sh.total);
    for (int i = tid; i < kept; i += kThreads)
      if (cumulative[i] >= want && (i == 0 || cumulative[i - 1] < want)) sh.found_index = i;
    __syncthreads();
    last = int(sh.found_index);
    __syncthreads();
  }
  const uint64_t r = draw_target(u, cumulative[last]);
  for (int i = tid; i <= last; i += kThreads)
    if (cumulative[i] > r && (i == 0 || cumulative[i - 1] <= r)) sh.found_index = i;
  __syncthreads();
  return int32_t(uint32_t(key[sh.found_index]));
}

// Steps 4-6 on the keys <= bound by weighted selection (a top-k set too large for the list).
__device__ int32_t sample_by_selection(SampleShared& sh, const float* __restrict__ row, int vocab,
                                       uint64_t bound, const SampleParams& p, float max_logit,
                                       double u) {
  const int tid = int(threadIdx.x);
  uint64_t* mass = sh.u.hist.mass;
  __syncthreads();
  for (int b = tid; b < kBins; b += kThreads) mass[b] = 0;
  if (tid == 0) sh.total = 0;
  __syncthreads();
  uint64_t local = 0;
  for_each_logit(row, vocab, [&](float x, int id) {
    if (!is_finite(x)) return;
    const uint64_t key = order_key(x, id);
    if (key > bound) return;
    const uint64_t w = weight_of(x, max_logit, p.temperature);
    if (w == 0) return;
    local += w;
    atomic_add_u64(&mass[key >> digit_shift(0)], w);
  });
  atomic_add_u64(&sh.total, local);
  __syncthreads();
  const uint64_t total = sh.total;

  uint64_t kept_bound = bound, kept_total = total;
  if (p.top_p < 1) {
    for (int b = tid; b < kBins; b += kThreads) sh.u.hist.saved[b] = mass[b];
    __syncthreads();
    const Selected cut = select_key(sh, row, vocab, bound, top_p_target(p.top_p, total) - 1, true,
                                    max_logit, p.temperature, true);
    kept_bound = cut.key;
    kept_total =
        cut.before + weight_of(logit_of_desc(uint32_t(cut.key >> 32)), max_logit, p.temperature);
    // The draw's first-digit histogram: the saved one, restricted to the keys <= cut.key.
    const uint32_t cut_bin = uint32_t(cut.key >> digit_shift(0));
    __syncthreads();
    for (int b = tid; b < kBins; b += kThreads)
      mass[b] = uint32_t(b) < cut_bin    ? sh.u.hist.saved[b]
                : uint32_t(b) == cut_bin ? kept_total - cut.first_before
                                         : 0;
    __syncthreads();
  }
  const Selected drawn = select_key(sh, row, vocab, kept_bound, draw_target(u, kept_total), true,
                                    max_logit, p.temperature, true);
  return int32_t(uint32_t(drawn.key));
}

// (value, index) a ranks before b: a number before NaN, then larger, then lower index
// (device/sampled.hip).
__device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi) {
  const bool a_nan = av != av, b_nan = bv != bv;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && av != bv) return av > bv;
  return ai < bi;
}

__device__ int32_t greedy_token(SampleShared& sh, const float* __restrict__ row, int vocab) {
  float v = NAN;
  int idx = vocab;  // none
  for_each_logit(row, vocab, [&](float x, int i) {
    if (idx == vocab || ranks_before(x, i, v, idx)) v = x, idx = i;
  });
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor(v, o);
    const int oi = __shfl_xor(idx, o);
    if (oi != vocab && (idx == vocab || ranks_before(ov, oi, v, idx))) v = ov, idx = oi;
  }
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  if (lane == 0) sh.best_v[warp] = v, sh.best_i[warp] = idx;
  __syncthreads();
  for (int w = 0; w < kThreads / kWarpSize; ++w)
    if (sh.best_i[w] != vocab && (idx == vocab || ranks_before(sh.best_v[w], sh.best_i[w], v, idx)))
      v = sh.best_v[w], idx = sh.best_i[w];
  return (idx == vocab || v != v) ? 0 : idx;
}

__global__ void __launch_bounds__(kThreads)
    f32_sample(const float* __restrict__ logits, int ld, int vocab,
               const SampleParams* __restrict__ params, int32_t* __restrict__ tokens) {
  __shared__ SampleShared sh;
  const int tid = int(threadIdx.x);
  const float* row = logits + int64_t(blockIdx.x) * ld;
  const SampleParams p = params[blockIdx.x];
  if (!(p.temperature > 0) || p.top_k == 1) {  // step 1
    const int32_t token = greedy_token(sh, row, vocab);
    if (tid == 0) tokens[blockIdx.x] = token;
    return;
  }

  // Pass A: the candidates (step 2), the largest logit, the first digit's counts for top-k.
  const bool top_k_on = p.top_k > 0;
  for (int b = tid; b < kBins; b += kThreads) sh.u.hist.mass[b] = 0;
  if (tid == 0) sh.finite = 0, sh.max_desc = 0xffffffffu;
  __syncthreads();
  uint32_t finite = 0, max_desc = 0xffffffffu;
  for_each_logit(row, vocab, [&](float x, int) {
    if (!is_finite(x)) return;
    const uint32_t d = descending_bits(x);
    ++finite;
    max_desc = d < max_desc ? d : max_desc;
    if (top_k_on) atomic_add_u64(&sh.u.hist.mass[d >> (digit_shift(0) - 32)], 1);
  });
  atomicAdd(&sh.finite, finite);
  atomicMin(&sh.max_desc, max_desc);
  __syncthreads();
  const int candidates = int(sh.finite);
  if (candidates == 0) {
    if (tid == 0) tokens[blockIdx.x] = 0;
    return;
  }
  const float max_logit = logit_of_desc(sh.max_desc);

  // Step 3: the top-k set is the keys <= the key of rank top_k - 1.
  uint64_t bound = kNoKey;
  int kept = candidates;
  if (top_k_on && p.top_k < candidates) {
    bound = select_key(sh, row, vocab, kNoKey, uint64_t(p.top_k - 1), false, max_logit,
                       p.temperature, true)
                .key;
    kept = p.top_k;
  }
  const double u = sampling_uniform(p.seed, p.request, p.step);
  const int32_t token = kept <= kListCapacity
                            ? sample_from_list(sh, row, vocab, bound, kept, p, max_logit, u)
                            : sample_by_selection(sh, row, vocab, bound, p, max_logit, u);
  if (tid == 0) tokens[blockIdx.x] = token;
}

}  // namespace

void launch_f32_sample(const float* logits, int ld, int batch, int vocab,
                       const SampleParams* params, int32_t* tokens, hipStream_t stream) {
  PARITY_DEVICE_REQUIRE(logits != nullptr, "launch_f32_sample: logits is null");
  PARITY_DEVICE_REQUIRE(params != nullptr, "launch_f32_sample: params is null");
  PARITY_DEVICE_REQUIRE(tokens != nullptr, "launch_f32_sample: tokens is null");
  PARITY_DEVICE_REQUIRE(batch > 0 && batch <= kMaxSampleBatch, "launch_f32_sample: batch ", batch,
                        " outside [1, ", kMaxSampleBatch, "]");
  PARITY_DEVICE_REQUIRE(vocab > 0 && vocab <= kMaxSampleVocab, "launch_f32_sample: vocab ", vocab,
                        " outside [1, ", kMaxSampleVocab, "] (longer rows: launch_f32_argmax)");
  PARITY_DEVICE_REQUIRE(ld >= vocab, "launch_f32_sample: ld ", ld, " shorter than vocab ", vocab);
  f32_sample<<<batch, kThreads, 0, stream>>>(logits, ld, vocab, params, tokens);
  HIP_LAUNCH_CHECK("f32_sample", stream);
}

}  // namespace parity::device
