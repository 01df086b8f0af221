// The GPU side of numerics_exhaustive.cpp: the same functions compiled for the device (sm_89+:
// the hardware e4m3 conversions) against the same independent formulas and the software e4m3
// rule, for every one of the 2^32 fp32 bit patterns (under a second on an H200). Prints the
// mismatches per function and exits non-zero on any. Built and run by
// tests/test_numerics_exhaustive.py where a CUDA device and nvcc are present.
#include <cstdio>

#include "dsv4/low_ratio_math.h"

namespace {

using namespace dsv4;

enum Check {
  kRneIndex, kRneValue, kTiesDown, kFp4Scale, kE4m3, kE4m3x2, kE4m3Value, kChecks
};

__device__ float grid_value(uint32_t i) {
  return i < 4u ? 0.5f * float(i) : i == 4u ? 2.0f : i == 5u ? 3.0f : i == 6u ? 4.0f : 6.0f;
}
__device__ uint32_t rne_index_ref(float a) {
  return uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
         uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
}
__device__ uint8_t ties_down_ref(float v) {
  float a = fabsf(v);
  if (!(a < 6.0f)) a = 6.0f;
  const uint32_t i = uint32_t(a > 0.25f) + uint32_t(a > 0.75f) + uint32_t(a > 1.25f) +
                     uint32_t(a > 1.75f) + uint32_t(a > 2.5f) + uint32_t(a > 3.5f) +
                     uint32_t(a > 5.0f);
  return uint8_t(i | (v < 0.0f && i != 0u ? 8u : 0u));
}
// `six` is a kernel argument: a run-time IEEE division.
__device__ uint8_t fp4_scale_ref(float amax, float six) {
  float s = amax / six;
  s = s > 0.001953125f ? s : 0.001953125f;
  s = s < 448.0f ? s : 448.0f;
  return f32_to_e4m3_satfinite_rule(s);
}

__global__ void check(unsigned long long* bad, uint32_t base, float six) {
  const uint32_t u = base + blockIdx.x * blockDim.x + threadIdx.x;
  const float x = __uint_as_float(u);
  const uint32_t idx = rne_index_ref(x);
  const uint32_t pair =
      uint32_t(f32_to_e4m3_satfinite_rule(x)) | (uint32_t(f32_to_e4m3_satfinite_rule(-x)) << 8);
  const bool fail[kE4m3Value] = {
      e2m1_rne_index(x) != idx,
      __float_as_uint(e2m1_rne_value(x)) != __float_as_uint(grid_value(idx)),
      f32_to_e2m1(x) != ties_down_ref(x),
      v41_fp4_scale_byte(x) != fp4_scale_ref(x, six),
      f32_to_e4m3_satfinite(x) != f32_to_e4m3_satfinite_rule(x),
      e4m3x2(x, -x) != pair,
  };
  for (int c = 0; c < kE4m3Value; ++c)
    if (fail[c]) atomicAdd(&bad[c], 1ull);
  if (u < 256u) {  // every e4m3 byte's value: subnormals m * 2^-9, normals 1.m * 2^(e-7)
    const int e = (u >> 3) & 15, m = u & 7;
    const float ref = e == 0 ? ldexpf(float(m), -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    if (__float_as_uint(e4m3_value(uint8_t(u))) != __float_as_uint(ref))
      atomicAdd(&bad[kE4m3Value], 1ull);
  }
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
