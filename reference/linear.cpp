// Dense GEMV/GEMM with BF16/F16/F32 weights stored [out, in], and its error magnitude.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/error.h"
#include "model/numerics.h"
#include "reference/ops.h"

namespace parity::ref {
namespace {

template <typename T>
void bf16_row_scalar(const uint8_t* p, int64_t from, int64_t n, T* out) {
  for (int64_t i = from; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    out[i] = T(bf16_to_float(b));
  }
}

// BF16 widens exactly: its bits are the top half of a float's, and float to double is exact. So
// shifting code units into place, 8 or 16 at a time, gives read_row's values bit for bit (NaN
// payloads included: float to double quiets a NaN the same way in scalar and vector form).
// The zero-masking AVX-512 forms with an all-ones mask are the plain instructions; the plain
// intrinsics trip GCC 12's false -Wmaybe-uninitialized (bug 105593).
#if defined(__x86_64__)
[[gnu::target("avx2")]] void bf16_row_avx2(const uint8_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  bf16_row_scalar(p, i, n, out);
}

[[gnu::target("avx2")]] void bf16_row_avx2(const uint8_t* p, int64_t n, double* out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 * i));
    const __m128 f = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
    _mm256_storeu_pd(out + i, _mm256_cvtps_pd(f));
  }
  bf16_row_scalar(p, i, n, out);
}

[[gnu::target("avx512f,avx512vl")]] void bf16_row_avx512(const uint8_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
    _mm512_storeu_si512(
        out + i, _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
  }
  bf16_row_scalar(p, i, n, out);
}

[[gnu::target("avx512f,avx512vl")]] void bf16_row_avx512(const uint8_t* p, int64_t n, double* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm512_storeu_pd(out + i, _mm512_maskz_cvtps_pd(0xff, f));
  }
  bf16_row_scalar(p, i, n, out);
}
#endif

// Weight rows decoded together, once per call, then swept by every batch row in dot_block's
// register tiles: four rows fill the tiles and stay in cache while the batch passes. A single
// input row gains nothing from tiles and streams the weights fastest one row at a time, when
// decoding the next row overlaps the dot of the last (measured on the 20b's q projection).
constexpr int kRowsPerBlock = 4;
int rows_per_block(int batch) { return batch == 1 ? 1 : kRowsPerBlock; }

}  // namespace

template <typename T>
void weight_row(Simd simd, const TensorView& t, int64_t row, int64_t n, T* out) {
  PARITY_CHECK(simd_supported(simd), "weight_row: this CPU lacks {}", simd_name(simd));
#if defined(__x86_64__)
  if (t.dtype == DType::BF16 && simd != Simd::Baseline) {
    const uint8_t* p = t.data + 2 * row * n;
    if (simd == Simd::Avx512) return bf16_row_avx512(p, n, out);
    return bf16_row_avx2(p, n, out);
  }
#endif
  read_row(t, row, n, out);
}

template <typename T>
void weight_row(const TensorView& t, int64_t row, int64_t n, T* out) {
  weight_row(widest_simd(), t, row, n, out);
}

template <typename T>
void linear(const Linear& w, const T* x, int batch, T* y) {
  const int out = w.out, in = w.in;
  std::vector<T> bias(size_t(out), T(0));
  if (w.bias != nullptr) read_vector(*w.bias, bias.data());
  std::vector<const T*> inputs(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) inputs[size_t(b)] = x + size_t(b) * in;
  const Simd simd = widest_simd();
  const int block_rows = rows_per_block(batch);
  const int blocks = (out + block_rows - 1) / block_rows;
#pragma omp parallel if (worth_threads(int64_t(out) * in * batch))
  {
    std::vector<T> rows(size_t(block_rows) * size_t(in)), dots(size_t(block_rows) * size_t(batch));
    const T* row_ptrs[kRowsPerBlock];
    for (int r = 0; r < block_rows; ++r) row_ptrs[r] = rows.data() + size_t(r) * size_t(in);
#pragma omp for schedule(static)
    for (int block = 0; block < blocks; ++block) {
      const int first = block * block_rows, count = std::min(block_rows, out - first);
      for (int r = 0; r < count; ++r)
        weight_row(simd, *w.weight, first + r, in, rows.data() + size_t(r) * size_t(in));
      dot_block(simd, row_ptrs, count, inputs.data(), batch, in, dots.data());
      for (int r = 0; r < count; ++r)
        for (int b = 0; b < batch; ++b)
          y[size_t(b) * out + size_t(first + r)] =
              dots[size_t(r) * size_t(batch) + size_t(b)] + bias[size_t(first + r)];
    }
  }
}

void linear_magnitude(const Linear& w, const double* x, double* m) {
  const int out = w.out, in = w.in;
  std::vector<double> bias(size_t(out), 0.0);
  if (w.bias != nullptr) read_vector(*w.bias, bias.data());
#pragma omp parallel if (worth_threads(int64_t(out) * in))
  {
    std::vector<double> row(static_cast<size_t>(in));
#pragma omp for schedule(static)
    for (int j = 0; j < out; ++j) {
      weight_row(*w.weight, j, in, row.data());
      m[j] = dot_magnitude(row.data(), x, in) + std::fabs(bias[size_t(j)]);
    }
  }
}

#define PARITY_INSTANTIATE(T)                                                 \
  template void weight_row<T>(Simd, const TensorView&, int64_t, int64_t, T*); \
  template void weight_row<T>(const TensorView&, int64_t, int64_t, T*);       \
  template void linear<T>(const Linear&, const T*, int, T*);
PARITY_INSTANTIATE(double)
PARITY_INSTANTIATE(float)
#undef PARITY_INSTANTIATE

}  // namespace parity::ref
