// Bit-exact scalar conversions shared by every backend: bf16, e4m3 (fn, satfinite),
// e2m1 and UE8M0 scales. Implemented on the bits so that CPU and GPU agree exactly.
#pragma once

#include "portability.h"

namespace dsv4 {

DSV4_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSV4_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 <-> fp32; bf16 values travel as their uint16_t bits.
DSV4_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// sm_80+ converts fp32 to bf16 in hardware (cvt.rn: round to nearest even, subnormals kept,
// overflow to inf: the same bits as the integer rounding below, except for NaN payloads,
// which the callers fix up). The integer rounding was a fifth of the store kernels' code.
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define DSV4_HW_BF16 1
#endif

// Round to nearest even. Every NaN becomes the canonical quiet NaN 0x7fc0 (as torch's own
// conversion does), so backends whose arithmetic yields NaNs of different sign agree.
DSV4_HD uint16_t f32_to_bf16(float f) {
#if defined(DSV4_HW_BF16)
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return f != f ? uint16_t(0x7fc0) : uint16_t(r);
#else
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t(0x7fc0);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
#endif
}

// f32_to_bf16(lo) | f32_to_bf16(hi) << 16: one packed conversion on sm_80+.
DSV4_HD uint32_t bf16x2_bits(float lo, float hi) {
#if defined(DSV4_HW_BF16)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  if (lo != lo) r = (r & 0xffff0000u) | 0x7fc0u;
  if (hi != hi) r = (r & 0x0000ffffu) | 0x7fc00000u;
  return r;
#else
  return uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
#endif
}

DSV4_HD float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// round_to_bf16 of a pair, except that a NaN stays a NaN of unspecified payload: for values
// whose consumers treat every NaN alike (amax, e4m3 codes), this skips the fix-up.
DSV4_HD void round_to_bf16_pair(float& a, float& b) {
#if defined(DSV4_HW_BF16)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  a = bits_f32(r << 16);
  b = bits_f32(r & 0xffff0000u);
#else
  a = round_to_bf16(a);
  b = round_to_bf16(b);
#endif
}

// Element loads/stores that hide whether a buffer holds fp32 or bf16 (uint16_t bits).
DSV4_HD float load_as_f32(const float* p, int64_t i) { return p[i]; }
DSV4_HD float load_as_f32(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
DSV4_HD void store_from_f32(float* p, int64_t i, float v) { p[i] = v; }
DSV4_HD void store_from_f32(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

// 2^(127 - e) as an exact fp32 (inverse of the UE8M0 scale). Normal for e <= 253; e = 254
// and 255 (only reachable from an infinite amax) give the subnormals 2^-127 and 2^-128
// instead of the zero / -inf that the plain exponent shift would produce.
DSV4_HD float ue8m0_inv_scale(uint8_t e) {
  return e <= 253 ? bits_f32(uint32_t(254 - e) << 23) : bits_f32(0x00400000u >> (e - 254));
}

// sm_89+ converts fp32 to e4m3 in hardware (cvt.rn.satfinite.e4m3x2: round to nearest even,
// saturating at +-448, every NaN to 0x7f: the software rule's codes below for all 2^32 inputs,
// checked exhaustively on the H200). The software rule costs about 25 instructions a value.
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
#define DSV4_HW_E4M3 1
#endif

// fp32 -> e4m3fn with saturation to +-448 and round-to-nearest-even, on the bits.
DSV4_HD uint8_t f32_to_e4m3_satfinite_rule(float x) {
  uint32_t u = f32_bits(x);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(0x7f);  // NaN: canonical, positive (see f32_to_bf16)
  float ax = bits_f32(a);
  if (ax >= 448.0f) return uint8_t(sign | 0x7e);      // satfinite
  if (ax <= 0.0009765625f) return sign;  // <= 2^-10, half the smallest subnormal: ties to 0
  int exp = int((a >> 23) & 0xffu) - 127;  // unbiased, >= -10
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand
  if (exp < -6) {
    // Subnormal e4m3: value = m * 2^-9, m in [0, 7]. Shift so that m has its binary point.
    int shift = 20 + (-6 - exp);  // bits to drop
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q += 1;
    // q == 8 means it rounded up to the smallest normal 2^-6 (code 0x08): same encoding.
    return uint8_t(sign | q);
  }
  uint32_t q = mant >> 20;  // 1.xxx with 3 mantissa bits: q in [8, 15]
  uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) q += 1;
  if (q == 16) { q = 8; exp += 1; }
  uint32_t code = (uint32_t(exp + 7) << 3) | (q & 7u);
  if (code > 0x7e) code = 0x7e;
  return uint8_t(sign | code);
}

// f32_to_e4m3_satfinite_rule(a) | f32_to_e4m3_satfinite_rule(b) << 8: one hardware conversion
// on sm_89+, the rule elsewhere (CPU, HIP, older GPUs).
DSV4_HD uint32_t e4m3x2(float a, float b) {
#if defined(DSV4_HW_E4M3)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  return uint32_t(f32_to_e4m3_satfinite_rule(a)) | (uint32_t(f32_to_e4m3_satfinite_rule(b)) << 8);
#endif
}

// One e4m3 code (the GPU's scalar conversions: tile scales and single codes).
DSV4_HD uint8_t f32_to_e4m3_satfinite(float x) {
#if defined(DSV4_HW_E4M3)
  return uint8_t(e4m3x2(x, 0.0f));
#else
  return f32_to_e4m3_satfinite_rule(x);
#endif
}

// fp32 (already scaled) -> e2m1 nibble. Magnitude index = number of thresholds
// {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} strictly below min(|v|, 6) (NaN counts as 6); ties
// therefore go to the smaller magnitude, by contract. Computed as: below 1, two compares;
// from 1, the exponent and one mantissa bit of |v| rounded half down (the bits plus 2^21 - 1),
// as an index from 1.0's (2). The same nibble as the threshold count for every fp32 input
// (tests/test_numerics_exhaustive.py).
DSV4_HD uint8_t f32_to_e2m1(float v) {
  float a = v < 0.0f ? -v : v;
  a = a < 6.0f ? a : 6.0f;
  const uint32_t hi = (f32_bits(a) + (0x1fffffu - (252u << 22))) >> 22;
  const uint32_t idx = a < 1.0f ? uint32_t(a > 0.25f) + uint32_t(a > 0.75f) : hi;
  return uint8_t(idx | ((v < 0.0f && idx != 0u) ? 0x8u : 0u));
}

}  // namespace dsv4
