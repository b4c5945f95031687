// The shared dot product, and dot_block: several weight rows against several input rows, each
// result in dot's exact order, compiled for the widest vector unit the CPU has.
//
// Why the wide builds give the same bits as the baseline one: dot's eight partial sums are
// independent lanes, so a vector of eight T holds them and one vector multiply and one vector add
// perform the eight scalar operations of one step of dot, each an IEEE-rounded mul then add.
// SSE2, AVX2 and AVX-512 round those identically; only a fused multiply-add would not, and
// -ffp-contract=off (no contraction anywhere on the CPU side) keeps the compiler from forming
// one, whatever the target allows. The tests compare every level with dot() bit for bit; that is
// why each level is its own function with a target attribute rather than a target_clones pair
// the loader chooses between: a test can call every level the CPU has.
#include <cmath>
#include <cstring>

#include "model/error.h"
#include "reference/ops.h"

namespace parity::ref {

template <typename T>
T dot(const T* a, const T* b, int n) {
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) s[l] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

double dot_magnitude(const double* a, const double* b, int n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += std::fabs(a[i + l] * b[i + l]);
  for (int l = 0; i < n; ++i, ++l) s[l] += std::fabs(a[i] * b[i]);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

namespace {

// dot's eight partial sums as one vector; the compiler splits it into as many registers as the
// target needs (4 SSE2, 2 AVX2 or 1 AVX-512 register for double).
template <typename T>
struct LanesOf;
template <>
struct LanesOf<double> {
  typedef double type __attribute__((vector_size(8 * sizeof(double))));
};
template <>
struct LanesOf<float> {
  typedef float type __attribute__((vector_size(8 * sizeof(float))));
};
template <typename T>
using Lanes = typename LanesOf<T>::type;

// out[j * ldo + r] = dot(ws[j], xs[r], n) for a kRows x kInputs tile. Each loaded weight vector
// serves kInputs dots and each input vector kRows dots, and the tile's kRows * kInputs lane
// vectors are independent add chains, so the adder's latency is hidden even for one input; the
// arithmetic per output is dot's, step for step.
template <typename T, int kRows, int kInputs>
[[gnu::always_inline]] inline void dot_tile(const T* const* ws, const T* const* xs, int n, T* out,
                                            int ldo) {
  Lanes<T> acc[kRows][kInputs] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes<T> wv[kRows];
    for (int j = 0; j < kRows; ++j) std::memcpy(&wv[j], ws[j] + i, sizeof wv[j]);
    for (int r = 0; r < kInputs; ++r) {
      Lanes<T> xv;
      std::memcpy(&xv, xs[r] + i, sizeof xv);
      for (int j = 0; j < kRows; ++j) acc[j][r] += wv[j] * xv;
    }
  }
  for (int j = 0; j < kRows; ++j)
    for (int r = 0; r < kInputs; ++r) {
      T s[8];
      std::memcpy(s, &acc[j][r], sizeof s);
      for (int k = i, l = 0; k < n; ++k, ++l) s[l] += ws[j][k] * xs[r][k];
      out[size_t(j) * size_t(ldo) + size_t(r)] =
          ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
}

// kRows weight rows against every input: full tiles, then the remainder in halving tiles.
template <typename T, int kRows, int kInputs>
[[gnu::always_inline]] inline void dot_rows_against_inputs(const T* const* ws, const T* const* xs,
                                                           int count, int n, T* out, int ldo) {
  int r = 0;
  for (; r + kInputs <= count; r += kInputs)
    dot_tile<T, kRows, kInputs>(ws, xs + r, n, out + r, ldo);
  if constexpr (kInputs > 1)
    dot_rows_against_inputs<T, kRows, kInputs / 2>(ws, xs + r, count - r, n, out + r, ldo);
}

template <typename T, int kRows, int kInputs>
[[gnu::always_inline]] inline void dot_block_tiled(const T* const* ws, int rows, const T* const* xs,
                                                   int count, int n, T* out) {
  int j = 0;
  for (; j + kRows <= rows; j += kRows)
    dot_rows_against_inputs<T, kRows, kInputs>(ws + j, xs, count, n,
                                               out + size_t(j) * size_t(count), count);
  if constexpr (kRows > 1)
    dot_block_tiled<T, kRows / 2, kInputs>(ws + j, rows - j, xs, count, n,
                                           out + size_t(j) * size_t(count));
}

// Tiles: as many accumulators as the register file holds beside the loaded vectors (16 SSE2 and
// AVX2 registers, 32 with AVX-512VL); a double Lanes takes 4 SSE2, 2 AVX2 or 1 AVX-512 register,
// a float Lanes half that.
template <typename T>
void dot_block_baseline(const T* const* ws, int rows, const T* const* xs, int count, int n,
                        T* out) {
  if constexpr (sizeof(T) == 8)
    dot_block_tiled<T, 1, 2>(ws, rows, xs, count, n, out);
  else
    dot_block_tiled<T, 2, 2>(ws, rows, xs, count, n, out);
}

#if defined(__x86_64__)
template <typename T>
[[gnu::target("avx2")]] void dot_block_avx2(const T* const* ws, int rows, const T* const* xs,
                                            int count, int n, T* out) {
  if constexpr (sizeof(T) == 8)
    dot_block_tiled<T, 2, 2>(ws, rows, xs, count, n, out);
  else
    dot_block_tiled<T, 2, 4>(ws, rows, xs, count, n, out);
}

template <typename T>
[[gnu::target("avx512f,avx512vl")]] void dot_block_avx512(const T* const* ws, int rows,
                                                          const T* const* xs, int count, int n,
                                                          T* out) {
  dot_block_tiled<T, 4, 4>(ws, rows, xs, count, n, out);
}
#endif

}  // namespace

bool simd_supported(Simd s) {
  switch (s) {
    case Simd::Baseline: return true;
#if defined(__x86_64__)
    case Simd::Avx2: return __builtin_cpu_supports("avx2");
    case Simd::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#else
    case Simd::Avx2:
    case Simd::Avx512: return false;
#endif
  }
  return false;
}

std::string_view simd_name(Simd s) {
  switch (s) {
    case Simd::Baseline: return "baseline";
    case Simd::Avx2: return "avx2";
    case Simd::Avx512: return "avx512f+vl";
  }
  return "?";
}

Simd widest_simd() {
  static const Simd widest = [] {
    for (Simd s : {Simd::Avx512, Simd::Avx2})
      if (simd_supported(s)) return s;
    return Simd::Baseline;
  }();
  return widest;
}

template <typename T>
void dot_block(Simd simd, const T* const* ws, int rows, const T* const* xs, int count, int n,
               T* out) {
  PARITY_CHECK(simd_supported(simd), "dot_block: this CPU lacks {}", simd_name(simd));
  switch (simd) {
    case Simd::Baseline: return dot_block_baseline(ws, rows, xs, count, n, out);
#if defined(__x86_64__)
    case Simd::Avx2: return dot_block_avx2(ws, rows, xs, count, n, out);
    case Simd::Avx512: return dot_block_avx512(ws, rows, xs, count, n, out);
#else
    default: return dot_block_baseline(ws, rows, xs, count, n, out);
#endif
  }
}

template <typename T>
void dot_block(const T* const* ws, int rows, const T* const* xs, int count, int n, T* out) {
#if defined(__x86_64__)
  const Simd simd = widest_simd();
  if (simd == Simd::Avx512) return dot_block_avx512(ws, rows, xs, count, n, out);
  if (simd == Simd::Avx2) return dot_block_avx2(ws, rows, xs, count, n, out);
#endif
  dot_block_baseline(ws, rows, xs, count, n, out);
}

#define PARITY_INSTANTIATE(T)                                                            \
  template T dot<T>(const T*, const T*, int);                                            \
  template void dot_block<T>(Simd, const T* const*, int, const T* const*, int, int, T*); \
  template void dot_block<T>(const T* const*, int, const T* const*, int, int, T*);
PARITY_INSTANTIATE(double)
PARITY_INSTANTIATE(float)
#undef PARITY_INSTANTIATE

}  // namespace parity::ref
