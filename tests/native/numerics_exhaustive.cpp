// Checks the bit-level conversions of csrc/include/dsv4 against independent formulas over fp32
// inputs given as bit patterns: every one of the 2^32 ("all") or a spread sample with every
// pattern near the rounding boundaries ("sample"). Prints the mismatches per function (the first
// input of each) and exits non-zero on any. Built and run by tests/test_numerics_exhaustive.py.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dsv4/low_ratio_math.h"

namespace {

using namespace dsv4;

// e2m1 magnitudes and the two threshold rules of the contract: ties to the even index
// (e2m1_rne_index) and ties to the smaller magnitude (f32_to_e2m1, |v| clamped to 6 with a NaN
// counting as 6).
const float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
uint32_t rne_index_ref(float a) {
  return uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
         uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
}
uint8_t ties_down_ref(float v) {
  float a = std::fabs(v);
  if (!(a < 6.0f)) a = 6.0f;
  const float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint32_t idx = 0;
  for (float x : t) idx += a > x ? 1u : 0u;
  return uint8_t(idx | (v < 0.0f && idx != 0u ? 8u : 0u));
}
// e4m3_rne(clamp(amax / 6, 2^-9, 448)) with the IEEE division.
uint8_t fp4_scale_ref(float amax) {
  volatile float six = 6.0f;  // a run-time IEEE division
  float s = amax / six;
  s = s > 0.001953125f ? s : 0.001953125f;
  s = s < 448.0f ? s : 448.0f;
  return f32_to_e4m3_satfinite_rule(s);
}

enum Check { kRneIndex, kRneValue, kTiesDown, kFp4Scale, kChecks };
const char* const kNames[kChecks] = {"e2m1_rne_index", "e2m1_rne_value", "f32_to_e2m1",
                                     "v41_fp4_scale_byte"};

struct Tally {
  unsigned long long bad[kChecks] = {};
  uint32_t first[kChecks] = {};
};

void check(uint32_t u, Tally& t) {
  const float x = bits_f32(u);
  const uint32_t idx = rne_index_ref(x);
  const bool fail[kChecks] = {
      e2m1_rne_index(x) != idx,
      f32_bits(e2m1_rne_value(x)) != f32_bits(kGrid[idx]),
      f32_to_e2m1(x) != ties_down_ref(x),
      v41_fp4_scale_byte(x) != fp4_scale_ref(x),
  };
  for (int c = 0; c < kChecks; ++c)
    if (fail[c] && t.bad[c]++ == 0) t.first[c] = u;
}

void merge(Tally& into, const Tally& t) {
  for (int c = 0; c < kChecks; ++c) {
    if (t.bad[c] != 0 && (into.bad[c] == 0 || t.first[c] < into.first[c]))
      into.first[c] = t.first[c];
    into.bad[c] += t.bad[c];
  }
}

// Bit patterns of both signs within `radius` of every boundary of the functions above.
std::vector<uint32_t> boundary_patterns(uint32_t radius) {
  const float points[] = {0.0f,   0.25f, 0.5f,  0.75f, 1.0f,        1.25f,   1.5f,
                          1.75f,  2.0f,  2.5f,  3.0f,  3.5f,        4.0f,    5.0f,
                          6.0f,   8.0f,  0.01171875f,  2688.0f,     0.001953125f,
                          448.0f, 1e-30f, 1e30f, INFINITY, NAN};
  std::vector<uint32_t> out;
  for (float p : points)
    for (uint32_t sign = 0; sign < 2; ++sign) {
      const uint32_t c = (f32_bits(p) & 0x7fffffffu) | (sign << 31);
      for (uint32_t d = 0; d <= 2 * radius; ++d) out.push_back(c - radius + d);
    }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool all = argc > 1 && std::strcmp(argv[1], "all") == 0;
  Tally total;
  unsigned long long n = 0;
  if (all) {
#pragma omp parallel
    {
      Tally t;
#pragma omp for schedule(static)
      for (long long i = 0; i < (1ll << 32); ++i) check(uint32_t(i), t);
#pragma omp critical
      merge(total, t);
    }
    n = 1ull << 32;
  } else {
    Tally t;
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) check(uint32_t(u), t), ++n;
    for (uint32_t u : boundary_patterns(1u << 12)) check(u, t), ++n;
    merge(total, t);
  }
  // Every e4m3 byte's value against its definition: subnormals m * 2^-9, normals 1.m * 2^(e-7).
  unsigned long long bad_value = 0;
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const float ref = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
    if (f32_bits(e4m3_value(uint8_t(b))) != f32_bits(ref)) ++bad_value;
  }
  int rc = 0;
  std::printf("inputs %llu\n", n);
  for (int c = 0; c < kChecks; ++c) {
    std::printf("%s: %llu mismatches", kNames[c], total.bad[c]);
    if (total.bad[c] != 0) std::printf(" (first 0x%08x)", total.first[c]), rc = 1;
    std::printf("\n");
  }
  std::printf("e4m3_value: %llu mismatches\n", bad_value);
  return rc != 0 || bad_value != 0;
}
