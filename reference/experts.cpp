// Expert projections mlp1 (gate_up) and mlp2 (down), MXFP4 or dense weights, their error
// magnitude, and the weighted expert sum. W[e] rows are decoded exactly, then dotted in the
// shared order.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/error.h"
#include "model/numerics.h"
#include "reference/ops.h"

namespace parity::ref {
namespace {

// E8M0 byte -> its scale as T, computed once: e8m0_to_double is an ldexp call, too slow per block.
template <typename T>
const std::array<T, 256>& e8m0_scales() {
  static const std::array<T, 256> table = [] {
    std::array<T, 256> t{};
    for (int s = 0; s < 256; ++s) t[size_t(s)] = T(e8m0_to_double(uint8_t(s)));
    return t;
  }();
  return table;
}

// Every decoder below forms each value as T(kFp4Values[code]) * T(scale), the product
// decode_mxfp4_row forms, once per code and block; they differ only in how values are gathered.
template <typename T>
void decode_mxfp4_row_baseline(const uint8_t* blocks, const uint8_t* scales, int n, T* out) {
  const auto& scale_of = e8m0_scales<T>();
  for (int g = 0; g < n / kMxfp4Block; ++g) {
    const T scale = scale_of[scales[g]];
    T code_value[16];
    for (int c = 0; c < 16; ++c) code_value[c] = T(kFp4Values[c]) * scale;
    const uint8_t* b = blocks + size_t(g) * kMxfp4BlockBytes;
    T* o = out + size_t(g) * kMxfp4Block;
    for (int j = 0; j < kMxfp4BlockBytes; ++j) {
      o[2 * j] = code_value[b[j] & 0x0f];
      o[2 * j + 1] = code_value[b[j] >> 4];
    }
  }
}

#if defined(__x86_64__)
// The 32 codes of a block in element order (low nibble of byte j is element 2j): two vectors of
// 16 code bytes.
[[gnu::target("avx512f,avx512vl")]] inline void mxfp4_block_codes(const uint8_t* block,
                                                                  __m128i codes[2]) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m128i low = _mm_and_si128(bytes, nibble);
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
  codes[0] = _mm_unpacklo_epi8(low, high);
  codes[1] = _mm_unpackhi_epi8(low, high);
}

// The block's 16 values sit in two (double) or one (float) registers, and a permute by code
// gathers 8 or 16 elements at once. The zero-masking forms with an all-ones mask are the plain
// instructions; the plain intrinsics trip GCC 12's false -Wmaybe-uninitialized (bug 105593).
[[gnu::target("avx512f,avx512vl")]] void decode_mxfp4_row_avx512(const uint8_t* blocks,
                                                                 const uint8_t* scales, int n,
                                                                 double* out) {
  const auto& scale_of = e8m0_scales<double>();
  double fp4[16];
  for (int c = 0; c < 16; ++c) fp4[c] = double(kFp4Values[c]);
  const __m512d fp4_positive = _mm512_loadu_pd(fp4), fp4_negative = _mm512_loadu_pd(fp4 + 8);
  for (int g = 0; g < n / kMxfp4Block; ++g) {
    const __m512d scale = _mm512_set1_pd(scale_of[scales[g]]);
    const __m512d positive = _mm512_mul_pd(fp4_positive, scale);
    const __m512d negative = _mm512_mul_pd(fp4_negative, scale);
    __m128i codes[2];
    mxfp4_block_codes(blocks + size_t(g) * kMxfp4BlockBytes, codes);
    double* o = out + size_t(g) * kMxfp4Block;
    for (int h = 0; h < 2; ++h) {
      const __m512i first = _mm512_maskz_cvtepu8_epi64(0xff, codes[h]);
      const __m512i second = _mm512_maskz_cvtepu8_epi64(0xff, _mm_srli_si128(codes[h], 8));
      _mm512_storeu_pd(o + 16 * h, _mm512_permutex2var_pd(positive, first, negative));
      _mm512_storeu_pd(o + 16 * h + 8, _mm512_permutex2var_pd(positive, second, negative));
    }
  }
}

[[gnu::target("avx512f,avx512vl")]] void decode_mxfp4_row_avx512(const uint8_t* blocks,
                                                                 const uint8_t* scales, int n,
                                                                 float* out) {
  const auto& scale_of = e8m0_scales<float>();
  const __m512 fp4 = _mm512_loadu_ps(kFp4Values);
  for (int g = 0; g < n / kMxfp4Block; ++g) {
    const __m512 values = _mm512_mul_ps(fp4, _mm512_set1_ps(scale_of[scales[g]]));
    __m128i codes[2];
    mxfp4_block_codes(blocks + size_t(g) * kMxfp4BlockBytes, codes);
    float* o = out + size_t(g) * kMxfp4Block;
    for (int h = 0; h < 2; ++h)
      _mm512_storeu_ps(o + 16 * h,
                       _mm512_maskz_permutexvar_ps(
                           0xffff, _mm512_maskz_cvtepu8_epi32(0xffff, codes[h]), values));
  }
}
#endif

// Output rows per unit of OpenMP work, decoded together: enough rows for full register tiles in
// dot_block, few enough that one job's projection still spreads over many threads and the rows
// stay in cache while every job of the expert sweeps them.
constexpr int kRowsPerWorkItem = 8;

}  // namespace

template <typename T>
void expert_row(Simd simd, const ExpertLinear& w, int expert, int row, T* out) {
  PARITY_CHECK(simd_supported(simd), "expert_row: this CPU lacks {}", simd_name(simd));
  if (w.layout != ExpertLayout::Mxfp4) return read_expert_row(w, expert, row, out);
  const int groups = w.in / kMxfp4Block;
  const size_t r = size_t(expert) * size_t(w.out) + size_t(row);
  const uint8_t* blocks = w.blocks->data + r * size_t(groups) * kMxfp4BlockBytes;
  const uint8_t* scales = w.scales->data + r * size_t(groups);
#if defined(__x86_64__)
  if (simd == Simd::Avx512) return decode_mxfp4_row_avx512(blocks, scales, w.in, out);
#endif
  decode_mxfp4_row_baseline(blocks, scales, w.in, out);
}

template <typename T>
void expert_row(const ExpertLinear& w, int expert, int row, T* out) {
  expert_row(widest_simd(), w, expert, row, out);
}

template <typename T>
void expert_linear(const ExpertLinear& w, int expert, const T* x, T* y) {
  const ExpertJob<T> job{expert, x, y};
  expert_linear_batch(w, std::span<const ExpertJob<T>>(&job, 1));
}

// Work items are (expert, block of output rows); each output element is written by the one item
// that owns its row, in dot's fixed order, so any thread count and any schedule give the same
// bits.
template <typename T>
void expert_linear_batch(const ExpertLinear& w, std::span<const ExpertJob<T>> jobs) {
  if (jobs.empty()) return;
  for (const ExpertJob<T>& job : jobs)
    PARITY_CHECK(job.expert >= 0 && job.expert < w.experts,
                 "expert_linear_batch: expert {} is outside 0..{}", job.expert, w.experts - 1);
  std::vector<int> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return jobs[size_t(a)].expert < jobs[size_t(b)].expert; });
  struct ExpertGroup {
    int expert, first, count;  // jobs order[first .. first + count)
  };
  std::vector<ExpertGroup> groups;
  std::vector<const T*> inputs(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const ExpertJob<T>& job = jobs[size_t(order[i])];
    inputs[i] = job.x;
    if (groups.empty() || groups.back().expert != job.expert)
      groups.push_back({job.expert, int(i), 0});
    ++groups.back().count;
  }
  const int out = w.out, in = w.in;
  std::vector<T> bias(groups.size() * size_t(out));
  int largest_group = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    read_row(*w.bias, groups[g].expert, out, bias.data() + g * size_t(out));
    largest_group = std::max(largest_group, groups[g].count);
  }
  const Simd simd = widest_simd();
  const int blocks_per_expert = (out + kRowsPerWorkItem - 1) / kRowsPerWorkItem;
  const int items = int(groups.size()) * blocks_per_expert;
#pragma omp parallel if (worth_threads(int64_t(out) * in * int64_t(jobs.size())))
  {
    std::vector<T> rows(size_t(kRowsPerWorkItem) * size_t(in)),
        dots(size_t(kRowsPerWorkItem) * size_t(largest_group));
    const T* row_ptrs[kRowsPerWorkItem];
    for (int r = 0; r < kRowsPerWorkItem; ++r) row_ptrs[r] = rows.data() + size_t(r) * size_t(in);
#pragma omp for schedule(dynamic)
    for (int item = 0; item < items; ++item) {
      const size_t g = size_t(item / blocks_per_expert);
      const ExpertGroup& group = groups[g];
      const int first_row = (item % blocks_per_expert) * kRowsPerWorkItem;
      const int row_count = std::min(kRowsPerWorkItem, out - first_row);
      for (int r = 0; r < row_count; ++r)
        expert_row(simd, w, group.expert, first_row + r, rows.data() + size_t(r) * size_t(in));
      dot_block(simd, row_ptrs, row_count, inputs.data() + group.first, group.count, in,
                dots.data());
      for (int r = 0; r < row_count; ++r) {
        const int j = first_row + r;
        const T b = bias[g * size_t(out) + size_t(j)];
        for (int i = 0; i < group.count; ++i)  // bias before the routing weight
          jobs[size_t(order[size_t(group.first + i)])].y[j] =
              dots[size_t(r) * size_t(group.count) + size_t(i)] + b;
      }
    }
  }
}

void expert_linear_magnitude(const ExpertLinear& w, int expert, const double* x, double* m) {
  PARITY_CHECK(expert >= 0 && expert < w.experts,
               "expert_linear_magnitude: expert {} is outside 0..{}", expert, w.experts - 1);
  std::vector<double> bias(size_t(w.out));
  read_row(*w.bias, expert, w.out, bias.data());
#pragma omp parallel if (worth_threads(int64_t(w.out) * w.in))
  {
    std::vector<double> row(static_cast<size_t>(w.in));
#pragma omp for schedule(static)
    for (int j = 0; j < w.out; ++j) {
      expert_row(w, expert, j, row.data());
      m[j] = dot_magnitude(row.data(), x, w.in) + std::fabs(bias[size_t(j)]);
    }
  }
}

template <typename T>
void moe_sum(const T* w, const T* expert_out, int k, int n, T* y) {
  for (int i = 0; i < n; ++i) {
    T acc = 0;
    for (int s = 0; s < k; ++s) acc += w[s] * expert_out[size_t(s) * n + i];
    y[i] = acc;
  }
}

#define PARITY_INSTANTIATE(T)                                                               \
  template void expert_row<T>(Simd, const ExpertLinear&, int, int, T*);                     \
  template void expert_row<T>(const ExpertLinear&, int, int, T*);                           \
  template void expert_linear<T>(const ExpertLinear&, int, const T*, T*);                   \
  template void expert_linear_batch<T>(const ExpertLinear&, std::span<const ExpertJob<T>>); \
  template void moe_sum<T>(const T*, const T*, int, int, T*);
PARITY_INSTANTIATE(double)
PARITY_INSTANTIATE(float)
#undef PARITY_INSTANTIATE

}  // namespace parity::ref
