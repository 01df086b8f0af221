// Lane-group amaxes and e4m3 codes of the store kernel: interleaved shuffle reductions over
// the lanes that share a scale, and the fp32 -> e4m3 conversions (hardware on sm_89+, the
// shared software rule of numerics.h elsewhere) with the same codes as the CPU kernel.
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

// Two e4m3 codes (a in bits 0-7, b in bits 8-15) of f32_to_e4m3_satfinite: one hardware
// conversion on sm_89+ (round-to-nearest-even, saturating, every NaN to 0x7f: the software
// rule's codes for all 2^32 inputs, checked exhaustively on the H200), the shared software
// rule elsewhere. The conversion was most of the fp8 store kernels' instruction count.
DSV4_DEVICE uint32_t e4m3x2(float a, float b) {
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  return uint32_t(f32_to_e4m3_satfinite(a)) | (uint32_t(f32_to_e4m3_satfinite(b)) << 8);
#endif
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
