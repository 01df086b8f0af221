// Checks the bit-level conversions of csrc/include/dsv4 against independent formulas over fp32
// inputs given as bit patterns: every one of the 2^32 ("all") or a spread sample with every
// pattern near the rounding boundaries ("sample"). Prints the mismatches per function (the first
// input of each) and exits non-zero on any. Built and run by tests/test_numerics_exhaustive.py.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "conversion_refs.h"
#include "dsv4/low_ratio_math.h"

namespace {

using namespace dsv4;
using namespace conversion_refs;

// A run-time IEEE division in the scale formula.
volatile float six = 6.0f;

enum Check { kRneIndex, kRneValue, kTiesDown, kFp4Scale, kChecks };
const char* const kNames[kChecks] = {"e2m1_rne_index", "e2m1_rne_value", "f32_to_e2m1",
                                     "v41_fp4_scale_byte"};

struct Tally {
  unsigned long long bad[kChecks] = {};
  uint32_t first[kChecks] = {};
};

void check(uint32_t u, Tally& t) {
  const float x = bits_f32(u);
  const uint32_t idx = rne_index(x);
  const bool fail[kChecks] = {
      e2m1_rne_index(x) != idx,
      f32_bits(e2m1_rne_value(x)) != f32_bits(grid_value(idx)),
      f32_to_e2m1(x) != ties_down_nibble(x),
      v41_fp4_scale_byte(x) != fp4_scale_byte(x, six),
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
  // Every e4m3 byte's value.
  unsigned long long bad_value = 0;
  for (uint32_t b = 0; b < 256; ++b)
    if (f32_bits(e4m3_value(uint8_t(b))) != f32_bits(e4m3_byte_value(b))) ++bad_value;
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
