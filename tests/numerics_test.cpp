// The checkpoint number formats (model/numerics.h): BF16 encode/decode against an independent
// round-to-nearest-even oracle and its boundary cases, F16 decode, and MXFP4 (FP4 E2M1 codes,
// E8M0 scales, nibble order, whole blocks) against hand-computed values and the OCP formulas.
#include "model/numerics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/checkpoint.h"

namespace parity {
namespace {

float f32(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}

// Value of a finite non-negative bf16 bit pattern, built from the format definition (sign,
// 8-bit exponent with bias 127, 7-bit mantissa), not from the code under test. 0x7f80 is taken
// as 2^128: the first value past the largest finite, where IEEE rounding places overflow.
double bf16_magnitude(uint32_t b) {
  const int exp = int((b >> 7) & 0xff);
  const int man = int(b & 0x7f);
  if (exp == 0) return std::ldexp(double(man), -126 - 7);
  return std::ldexp(1.0 + man / 128.0, exp - 127);
}

// Independent round-to-nearest-even float -> bf16 for finite input: the two bf16 neighbours of
// |x| compared in double (exact for these values), ties to the even mantissa.
uint16_t bf16_oracle(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t lo = (u & 0x7fffffffu) >> 16;  // truncated magnitude
  const double mag = std::fabs(double(x));
  const double below = mag - bf16_magnitude(lo), above = bf16_magnitude(lo + 1) - mag;
  uint32_t r = lo;
  if (above < below || (above == below && (lo & 1u) != 0)) r = lo + 1;
  return uint16_t(sign | r);
}

TEST(NumericsBf16, DecodeIsExactForNamedValues) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x0080), 0x1p-126f);        // smallest normal
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);        // smallest denormal
  EXPECT_EQ(bf16_to_float(0x007f), 127 * 0x1p-133f);  // largest denormal
  EXPECT_EQ(bf16_to_float(0x7f7f), 0x1.fep127f);      // largest finite
  EXPECT_EQ(bf16_to_float(0xff7f), -0x1.fep127f);     // most negative finite
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7f81)));  // signalling pattern is a NaN too
  EXPECT_EQ(bf16_to_float(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(bf16_to_float(0x0000)));
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
}

TEST(NumericsBf16, DecodeMatchesTheFormatDefinitionForEveryFiniteValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint32_t mag = b & 0x7fffu;
    if ((mag >> 7) == 0xff) continue;  // Inf and NaN: above
    const double want = (b & 0x8000u) ? -bf16_magnitude(mag) : bf16_magnitude(mag);
    ASSERT_EQ(double(bf16_to_float(uint16_t(b))), want) << "bf16 0x" << std::hex << b;
  }
}

TEST(NumericsBf16, EncodeOfEveryBf16ValueIsTheIdentity) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_float(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), b) << "bf16 0x" << std::hex << b;
  }
}

TEST(NumericsBf16, TiesRoundToEvenInBothDirections) {
  // At 1.0 the bf16 step is 2^-7, so 2^-8 is exactly half a step.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie, even below: down
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(float_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
  EXPECT_EQ(float_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  // One float ulp either side of a tie goes to the nearer neighbour.
  EXPECT_EQ(float_to_bf16(f32(0x3f808001)), 0x3f81);
  EXPECT_EQ(float_to_bf16(f32(0x3f807fff)), 0x3f80);
  EXPECT_EQ(float_to_bf16(f32(0x3f818001)), 0x3f82);
  EXPECT_EQ(float_to_bf16(f32(0x3f817fff)), 0x3f81);
  // Truncation would give 0x3f81 here; nearest is 0x3f82.
  EXPECT_EQ(float_to_bf16(f32(0x3f81ffff)), 0x3f82);
  // A carry out of the mantissa moves the exponent: 2 - 2^-9 rounds to 2.
  EXPECT_EQ(float_to_bf16(f32(0x3fffc000)), 0x4000);
  EXPECT_EQ(float_to_bf16(f32(0xbfffc000)), 0xc000);
}

TEST(NumericsBf16, EncodeMatchesAnIndependentNearestEvenOracle) {
  // Every top half (all signs, exponents and bf16 mantissas) with low halves at and around the
  // tie, at the ends, and a pseudo-random one.
  uint32_t lcg = 12345;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    if (((hi >> 7) & 0xff) == 0xff) continue;  // Inf/NaN: separate test
    lcg = lcg * 1664525u + 1013904223u;
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, lcg >> 16}) {
      const float x = f32((hi << 16) | low);
      ASSERT_EQ(float_to_bf16(x), bf16_oracle(x)) << "float bits 0x" << std::hex << bits_of(x);
    }
  }
}

TEST(NumericsBf16, NanStaysNanAndInfinityStaysInfinity) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // NaNs whose payload lies only in the low 16 bits would truncate to Inf; ones with all
  // mantissa bits set would carry into the sign under plain rounding.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xff800001u, 0xffffffffu,
                       0xffc00000u}) {
    const uint16_t b = float_to_bf16(f32(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << nan << " -> " << b;
    EXPECT_EQ(b & 0x8000u, (nan >> 16) & 0x8000u) << "sign of NaN 0x" << std::hex << nan;
  }
}

TEST(NumericsBf16, DenormalsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(f32(0x00000001)), 0x0000);  // 2^-149: far below half of 2^-133
  EXPECT_EQ(float_to_bf16(f32(0x80000001)), 0x8000);  // sign kept on underflow to zero
  EXPECT_EQ(float_to_bf16(f32(0x00010000)), 0x0001);  // 2^-133 is a bf16 denormal: exact
  EXPECT_EQ(float_to_bf16(f32(0x00008000)), 0x0000);  // tie between 0 and 2^-133: even is 0
  EXPECT_EQ(float_to_bf16(f32(0x00008001)), 0x0001);  // just above the tie
  EXPECT_EQ(float_to_bf16(f32(0x00018000)), 0x0002);  // tie between 1 and 2 units: even is 2
  EXPECT_EQ(float_to_bf16(f32(0x80018000)), 0x8002);
  EXPECT_EQ(float_to_bf16(f32(0x007fffff)), 0x0080);  // largest float denormal -> 2^-126
  EXPECT_EQ(float_to_bf16(f32(0x007f7fff)), 0x007f);  // stays the largest bf16 denormal
}

TEST(NumericsBf16, LargestFiniteValuesAndOverflow) {
  EXPECT_EQ(float_to_bf16(0x1.fep127f), 0x7f7f);  // largest bf16 finite: exact
  EXPECT_EQ(float_to_bf16(-0x1.fep127f), 0xff7f);
  EXPECT_EQ(float_to_bf16(f32(0x7f7f7fff)), 0x7f7f);  // below the midpoint to 2^128: stays
  // The midpoint between the largest finite and 2^128 is a tie with an odd mantissa: IEEE
  // rounds it (and everything above, FLT_MAX included) to infinity.
  EXPECT_EQ(float_to_bf16(f32(0x7f7f8000)), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::lowest()), 0xff80);
  EXPECT_EQ(float_to_bf16(0x1p127f), 0x7f00);
}

TEST(NumericsF16, DecodesNamedValuesExactly) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x3555), 0x1.554p-2f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0400), 0x1p-14f);
  EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x83ff), -1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7c01)));
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
  EXPECT_EQ(f16_to_float(0x8000), 0.0f);
}

// ---- MXFP4 -----------------------------------------------------------------------------------

// FP4 E2M1 from its fields (OCP MX spec): sign, 2 exponent bits (bias 1), 1 mantissa bit;
// exponent 0 is subnormal (m * 0.5).
double e2m1_from_fields(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return s ? -mag : mag;
}

// One 32-element block whose 16 bytes hold the given codes, element i in the nibble the spec
// assigns (even i low, odd i high).
std::vector<uint8_t> pack_block(const int (&codes)[32]) {
  std::vector<uint8_t> b(16);
  for (int j = 0; j < 16; ++j) b[size_t(j)] = uint8_t(codes[2 * j] | (codes[2 * j + 1] << 4));
  return b;
}

TEST(NumericsMxfp4, EveryCodeDecodesToTheE2M1Value) {
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  int codes[32];
  for (int i = 0; i < 32; ++i) codes[i] = i % 16;
  const auto blocks = pack_block(codes);
  const uint8_t scale = 127;  // 2^0
  double out[32];
  decode_mxfp4_row(blocks.data(), &scale, 32, out);
  for (int i = 0; i < 32; ++i) {
    const int c = i % 16;
    EXPECT_EQ(out[i], want[c]) << "code " << c;
    EXPECT_EQ(out[i], e2m1_from_fields(c)) << "code " << c;
    EXPECT_EQ(std::signbit(out[i]), c >= 8) << "sign of code " << c;  // code 8 is -0
    EXPECT_EQ(double(kFp4Values[c]), want[c]);
  }
}

TEST(NumericsMxfp4, E8M0ScaleExtremes) {
  EXPECT_EQ(e8m0_to_double(127), 1.0);
  EXPECT_EQ(e8m0_to_double(128), 2.0);
  EXPECT_EQ(e8m0_to_double(126), 0.5);
  EXPECT_EQ(e8m0_to_double(0), 0x1p-127);  // smallest: exact (a float denormal, exact too)
  EXPECT_GT(e8m0_to_double(0), 0.0);
  EXPECT_EQ(e8m0_to_double(254), 0x1p127);  // largest finite E8M0 value
  // 255 is NaN in OCP MX. The references do no NaN handling (spec section 3) and numerics.h
  // documents the plain formula, 2^128, with the loader refusing the byte (tested in
  // SafetensorsCheckpoint.ScaleByte255IsRefused).
  EXPECT_EQ(e8m0_to_double(255), 0x1p128);
  EXPECT_FALSE(std::isnan(e8m0_to_double(255)));
}

TEST(NumericsMxfp4, EveryCodeAtEveryScaleIsExactInDouble) {
  int codes[32];
  for (int i = 0; i < 32; ++i) codes[i] = (i * 7 + 3) % 16;  // every code, scrambled
  const auto blocks = pack_block(codes);
  for (int s = 0; s <= 254; ++s) {
    const uint8_t scale = uint8_t(s);
    double out[32];
    decode_mxfp4_row(blocks.data(), &scale, 32, out);
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(out[i], std::ldexp(e2m1_from_fields(codes[i]), s - 127))
          << "scale " << s << " element " << i;
    // float holds every value up to scale 252 (6 * 2^125 < FLT_MAX), denormals included.
    if (s <= 252) {
      float outf[32];
      decode_mxfp4_row(blocks.data(), &scale, 32, outf);
      for (int i = 0; i < 32; ++i)
        ASSERT_EQ(double(outf[i]), out[i]) << "float, scale " << s << " element " << i;
    }
  }
}

TEST(NumericsMxfp4, LowNibbleIsTheEvenElement) {
  // Byte 0x71: low nibble 1 (+0.5), high nibble 7 (+6). A swapped decoder gives 6, 0.5.
  std::vector<uint8_t> blocks(16, 0x00);
  blocks[0] = 0x71;
  blocks[15] = 0xc2;  // element 30 = code 2 (+1), element 31 = code 12 (-2)
  const uint8_t scale = 127;
  double out[32];
  decode_mxfp4_row(blocks.data(), &scale, 32, out);
  EXPECT_EQ(out[0], 0.5);
  EXPECT_EQ(out[1], 6.0);
  EXPECT_EQ(out[30], 1.0);
  EXPECT_EQ(out[31], -2.0);
  for (int i = 2; i < 30; ++i) EXPECT_EQ(out[i], 0.0) << i;
}

TEST(NumericsMxfp4, WholeBlockMatchesHandComputedValues) {
  const uint8_t blocks[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
                              0x07, 0x70, 0x8f, 0xf8, 0x25, 0x52, 0xa9, 0x9a};
  const uint8_t scale = 125;  // 2^-2
  // Byte j gives elements 2j (low nibble) and 2j+1 (high nibble), each times 0.25.
  const double want[32] = {0,    0.125,  0.25,  0.375,  0.5,    0.75,  1,     1.5,
                           -0.0, -0.125, -0.25, -0.375, -0.5,   -0.75, -1,    -1.5,
                           1.5,  0,      0,     1.5,    -1.5,   -0.0,  -0.0,  -1.5,
                           0.75, 0.25,   0.25,  0.75,   -0.125, -0.25, -0.25, -0.125};
  double out[32];
  float outf[32];
  decode_mxfp4_row(blocks, &scale, 32, out);
  decode_mxfp4_row(blocks, &scale, 32, outf);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], want[i]) << "element " << i;
    EXPECT_EQ(std::signbit(out[i]), std::signbit(want[i])) << "sign of element " << i;
    EXPECT_EQ(double(outf[i]), want[i]) << "float, element " << i;
  }
}

TEST(NumericsMxfp4, EachBlockUsesItsOwnScale) {
  // Two blocks of the same bytes, scales 2^0 and 2^3: the second half is 8 times the first.
  std::vector<uint8_t> blocks(32);
  for (int j = 0; j < 16; ++j)
    blocks[size_t(j)] = blocks[size_t(16 + j)] = uint8_t(j * 17);  // codes j, j
  const uint8_t scales[2] = {127, 130};
  double out[64];
  decode_mxfp4_row(blocks.data(), scales, 64, out);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], e2m1_from_fields(i / 2)) << i;
    EXPECT_EQ(out[32 + i], 8 * e2m1_from_fields(i / 2)) << 32 + i;
  }
}

// read_expert_row over hand-built views: the MXFP4 layout ([E, out, in/32, 16] blocks and
// [E, out, in/32] scales) and the dense input-major layout ([E, in, out]).
TEST(NumericsMxfp4, ExpertRowsIndexExpertRowAndBlock) {
  const int E = 2, out = 3, groups = 2, in = 64;
  std::vector<uint8_t> blocks(size_t(E * out * groups * 16)), scales(size_t(E * out * groups));
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < out; ++r)
      for (int g = 0; g < groups; ++g) {
        const size_t rg = (size_t(e) * out + size_t(r)) * groups + size_t(g);
        scales[rg] = uint8_t(120 + e * 4 + r * 2 + g);  // distinct per (e, r, g)
        for (int j = 0; j < 16; ++j)
          blocks[rg * 16 + size_t(j)] = uint8_t(((j + r) % 16) | (((j + e + g) % 16) << 4));
      }
  TensorView bv, sv;
  bv.dtype = sv.dtype = DType::U8;
  bv.shape = {E, out, groups, 16};
  sv.shape = {E, out, groups};
  bv.data = blocks.data();
  sv.data = scales.data();
  bv.nbytes = blocks.size();
  sv.nbytes = scales.size();
  ExpertLinear w;
  w.layout = ExpertLayout::Mxfp4;
  w.blocks = &bv;
  w.scales = &sv;
  w.experts = E;
  w.out = out;
  w.in = in;
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < out; ++r) {
      std::vector<double> row(static_cast<size_t>(in));
      read_expert_row(w, e, r, row.data());
      for (int k = 0; k < in; ++k) {
        const int g = k / 32, j = (k % 32) / 2;
        const int code = k % 2 == 0 ? (j + r) % 16 : (j + e + g) % 16;
        const double want = std::ldexp(e2m1_from_fields(code), 120 + e * 4 + r * 2 + g - 127);
        ASSERT_EQ(row[size_t(k)], want) << "expert " << e << " row " << r << " element " << k;
      }
    }
}

TEST(NumericsMxfp4, DenseInMajorExpertRowsAreColumnsOfTheStoredMatrix) {
  const int E = 2, in = 3, out = 4;
  std::vector<float> dense(size_t(E * in * out));
  for (size_t i = 0; i < dense.size(); ++i) dense[i] = float(i) + 0.25f;  // stored [e][k][j]
  TensorView dv;
  dv.dtype = DType::F32;
  dv.shape = {E, in, out};
  dv.data = reinterpret_cast<const uint8_t*>(dense.data());
  dv.nbytes = dense.size() * sizeof(float);
  ExpertLinear w;
  w.layout = ExpertLayout::DenseInMajor;
  w.dense = &dv;
  w.experts = E;
  w.out = out;
  w.in = in;
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < out; ++j) {
      double row[3];
      read_expert_row(w, e, j, row);
      for (int k = 0; k < in; ++k)  // W[e][j][k] = gate_up_proj[e][k][j]
        EXPECT_EQ(row[k], double((e * in + k) * out + j) + 0.25) << e << " " << j << " " << k;
    }
}

}  // namespace
}  // namespace parity
