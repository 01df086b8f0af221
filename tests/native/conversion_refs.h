// The contract's formulas of the conversions checked by numerics_exhaustive.cpp (CPU) and
// numerics_exhaustive_gpu.cu (device), written independently of csrc/include/dsv4's rules
// except for the software e4m3 rule (f32_to_e4m3_satfinite_rule), which the V41_FP4 scale
// formula applies to its quotient.
#pragma once

#include <math.h>

#include "dsv4/numerics.h"

namespace conversion_refs {

// The e2m1 magnitude of index i: {0, .5, 1, 1.5, 2, 3, 4, 6}.
DSV4_HD float grid_value(uint32_t i) {
  return i < 4u ? 0.5f * float(i) : i == 4u ? 2.0f : i == 5u ? 3.0f : i == 6u ? 4.0f : 6.0f;
}
// Nearest-even e2m1 index of a (the threshold count; NaN and a <= 0.25 give 0).
DSV4_HD uint32_t rne_index(float a) {
  return uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
         uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
}
// The ties-down e2m1 nibble of v: min(|v|, 6) with a NaN as 6, the thresholds strictly
// below it, the sign bit on a non-zero magnitude of a negative v.
DSV4_HD uint8_t ties_down_nibble(float v) {
  float a = v < 0.0f ? -v : v;
  if (!(a < 6.0f)) a = 6.0f;
  const uint32_t i = uint32_t(a > 0.25f) + uint32_t(a > 0.75f) + uint32_t(a > 1.25f) +
                     uint32_t(a > 1.75f) + uint32_t(a > 2.5f) + uint32_t(a > 3.5f) +
                     uint32_t(a > 5.0f);
  return uint8_t(i | (v < 0.0f && i != 0u ? 8u : 0u));
}
// e4m3_rne(clamp(amax / six, 2^-9, 448)); `six` (6) comes from outside so that the division
// is an IEEE division at run time.
DSV4_HD uint8_t fp4_scale_byte(float amax, float six) {
  float s = amax / six;
  s = s > 0.001953125f ? s : 0.001953125f;
  s = s < 448.0f ? s : 448.0f;
  return dsv4::f32_to_e4m3_satfinite_rule(s);
}

// The value of e4m3fn byte b (sign bit ignored): subnormals m * 2^-9, normals 1.m * 2^(e-7).
DSV4_HD float e4m3_byte_value(uint32_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  return e == 0 ? ldexpf(float(m), -9) : ldexpf(1.0f + float(m) / 8.0f, e - 7);
}

}  // namespace conversion_refs
