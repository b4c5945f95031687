// Exact number formats of the checkpoints: BF16, F16 and MXFP4 (OCP MX, FP4 E2M1 codes with an
// E8M0 scale per block of 32 along the input axis). Every decoded value is exact in float and
// in double; nothing here rounds except the explicit float->bf16 encoders.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace parity {

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// Round to nearest, ties to even; NaN stays a quiet NaN (never rounds into Inf).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// FP4 E2M1 code -> value; index = 4-bit code, bit 3 = sign.
inline constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr int kMxfp4Block = 32;       // elements per scale
inline constexpr int kMxfp4BlockBytes = 16;  // two elements per byte

// E8M0 scale byte -> 2^(s-127), exact as a double for every byte (255 is NaN in OCP MX; the
// loader refuses it).
inline double e8m0_to_double(uint8_t s) { return std::ldexp(1.0, int(s) - 127); }

// Decode one MXFP4 row of `n` elements (n a multiple of 32): the low nibble of byte j in block
// g is element 32 g + 2 j, the high nibble element 32 g + 2 j + 1.
template <typename T>
void decode_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int n, T* out) {
  for (int g = 0; g < n / kMxfp4Block; ++g) {
    const T scale = T(e8m0_to_double(scales[g]));
    const uint8_t* b = blocks + size_t(g) * kMxfp4BlockBytes;
    T* o = out + size_t(g) * kMxfp4Block;
    for (int j = 0; j < kMxfp4BlockBytes; ++j) {
      o[2 * j] = T(kFp4Values[b[j] & 0x0f]) * scale;
      o[2 * j + 1] = T(kFp4Values[b[j] >> 4]) * scale;
    }
  }
}

}  // namespace parity
