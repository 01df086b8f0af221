// The GPU side of numerics_exhaustive.cpp: the same functions compiled for the device (sm_89+:
// the hardware e4m3 conversions) against the same independent formulas and the software e4m3
// rule, for every one of the 2^32 fp32 bit patterns (under a second on an H200). Prints the
// mismatches per function and exits non-zero on any. Built and run by
// tests/test_numerics_exhaustive.py where a CUDA device and nvcc are present.
#include <cstdio>

#include "conversion_refs.h"
#include "dsv4/low_ratio_math.h"

namespace {

using namespace dsv4;
using namespace conversion_refs;

enum Check {
  kRneIndex, kRneValue, kTiesDown, kFp4Scale, kE4m3, kE4m3x2, kE4m3Value, kChecks
};

// `six` (6) is a kernel argument: the reference scale divides at run time.
__global__ void check(unsigned long long* bad, uint32_t base, float six) {
  const uint32_t u = base + blockIdx.x * blockDim.x + threadIdx.x;
  const float x = __uint_as_float(u);
  const uint32_t idx = rne_index(x);
  const uint32_t pair =
      uint32_t(f32_to_e4m3_satfinite_rule(x)) | (uint32_t(f32_to_e4m3_satfinite_rule(-x)) << 8);
  const bool fail[kE4m3Value] = {
      e2m1_rne_index(x) != idx,
      __float_as_uint(e2m1_rne_value(x)) != __float_as_uint(grid_value(idx)),
      f32_to_e2m1(x) != ties_down_nibble(x),
      v41_fp4_scale_byte(x) != fp4_scale_byte(x, six),
      f32_to_e4m3_satfinite(x) != f32_to_e4m3_satfinite_rule(x),
      e4m3x2(x, -x) != pair,
  };
  for (int c = 0; c < kE4m3Value; ++c)
    if (fail[c]) atomicAdd(&bad[c], 1ull);
  if (u < 256u && __float_as_uint(e4m3_value(uint8_t(u))) != __float_as_uint(e4m3_byte_value(u)))
    atomicAdd(&bad[kE4m3Value], 1ull);
}

}  // namespace

int main() {
  const char* const names[kChecks] = {"e2m1_rne_index", "e2m1_rne_value", "f32_to_e2m1",
                                      "v41_fp4_scale_byte", "f32_to_e4m3_satfinite",
                                      "e4m3x2", "e4m3_value"};
  unsigned long long* bad = nullptr;
  if (cudaMalloc(&bad, sizeof(unsigned long long) * kChecks) != cudaSuccess) return 2;
  cudaMemset(bad, 0, sizeof(unsigned long long) * kChecks);
  constexpr uint32_t kStep = 1u << 30, kThreads = 256;
  for (uint64_t base = 0; base < (1ull << 32); base += kStep)
    check<<<kStep / kThreads, kThreads>>>(bad, uint32_t(base), 6.0f);
  unsigned long long h[kChecks];
  cudaMemcpy(h, bad, sizeof(h), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("cuda error: %s\n", cudaGetErrorString(err));
    return 2;
  }
  int rc = 0;
  std::printf("inputs %llu\n", 1ull << 32);
  for (int c = 0; c < kChecks; ++c) {
    std::printf("%s: %llu mismatches\n", names[c], h[c]);
    rc |= h[c] != 0;
  }
  return rc;
}
