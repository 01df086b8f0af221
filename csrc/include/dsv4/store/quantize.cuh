// Lane-group amaxes and e4m3 codes of the store kernel: interleaved shuffle reductions over
// the lanes that share a scale, and the fp32 -> e4m3 conversions of four values (numerics.h's
// e4m3x2: hardware on sm_89+, the shared software rule elsewhere), the CPU kernel's codes.
#pragma once

#include "../numerics.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace store_detail {

// Max over the lanes that share bits >= log2(width) of the lane index (width 8, 16 or 32
// lanes = 32, 64 or 128 dims) of NaN-free values, for N independent values at once: the
// shuffle stages of the N values interleave (one latency chain, not N in a row). Exact, so
// the order does not matter.
template <int kWidth, int N>
DSV4_DEVICE void subgroup_max(float (&v)[N]) {
#pragma unroll
  for (int m = kWidth / 2; m > 0; m >>= 1)
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = fmaxf(v[i], shfl_xor(v[i], m));
}
template <int kWidth>
DSV4_DEVICE float subgroup_max(float v) {
  float a[1] = {v};
  subgroup_max<kWidth>(a);
  return a[0];
}

// max |v| starting from 0; fmaxf returns the other operand of a NaN, so a NaN is never
// selected (the CPU loops' rule) and every lane of a group agrees on the amax.
DSV4_DEVICE float abs_max4(const float (&v)[4]) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) m = fmaxf(m, fabsf(v[k]));
  return m;
}

// Four codes of v[k] * s (ds_mla) or v[k] / s (indexer), little-endian in one word.
DSV4_DEVICE uint32_t e4m3x4_mul(const float (&v)[4], float s) {
  return e4m3x2(v[0] * s, v[1] * s) | (e4m3x2(v[2] * s, v[3] * s) << 16);
}

// The quotients are those of the IEEE division, whose fast path is used with the reciprocal
// shared by the four values (approximate reciprocal, one Newton step, product, FMA correction:
// nvcc's own sequence). Its slow path only matters outside the normal range: s is finite here
// (an infinite s takes the plain division), and a quotient that underflows has the code of a
// zero either way, with v's sign (copysign: -0 / s = -0).
DSV4_DEVICE uint32_t e4m3x4_div(const float (&v)[4], float s) {
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__)
  if (s <= 3.4028235e38f) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
    r = fmaf(r, fmaf(r, -s, 1.0f), r);
    float q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float q0 = v[k] * r;
      q[k] = copysignf(fmaf(r, fmaf(q0, -s, v[k]), q0), v[k]);
    }
    return e4m3x2(q[0], q[1]) | (e4m3x2(q[2], q[3]) << 16);
  }
#endif
  return e4m3x2(v[0] / s, v[1] / s) | (e4m3x2(v[2] / s, v[3] / s) << 16);
}

}  // namespace store_detail
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
