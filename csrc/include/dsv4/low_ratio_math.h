// The ratio-1 / ratio-2 compressors of V4.1 and their stores (docs/contract.md, "V4.1"):
// torch-free per-value math shared by the CPU kernels (csrc/low_ratio/low_ratio_cpu.cpp), the
// GPU kernels (csrc/include/dsv4/low_ratio/*.cuh) and the V4.1 layouts of
// compress_norm_rope_store. Every function is built from IEEE operations with one rounding
// each (explicit fmaf, no library exp), so the CPU and the GPU produce the same bits. The
// RMSNorm sums follow store_math.h's lane layout (lane_dim, sumsq_step, lane_tree_sum); the
// 512-dim latent's adds its four 128-dim chunks' sums in order (latent_sumsq).
#pragma once

#include <math.h>

#include "kv_layout.h"
#include "numerics.h"
#include "store_math.h"

namespace dsv4 {

constexpr int kLowRatioHeadDim = 512;                  // latent dims
constexpr int kPairRowWidth = 2 * kLowRatioHeadDim;    // ratio-2 input / state row: kv | score
constexpr int kFakeQuantBlock = 16;                    // dims per scale of the fp4 fake quant
constexpr int kIndexKBlock = 32;                       // dims per scale of index-K
constexpr float kOneSixth = 0.16666667163372039795f;  // fp32(1/6), a multiplier by contract
constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3ScaleMin = 0.001953125f;          // 2^-9, the smallest e4m3 subnormal
constexpr uint8_t kV41MinExponent = 114;               // ue8m0_ceil(1e-4) = 2^-13
constexpr float kIndexKAmaxFloor = 7.052966105e-38f;    // 6 * 2^-126

// The low-ratio index-K cache is the fp4_indexer page of store_math.h: `ps` slots of 64 code
// bytes, then their 4 exponent bytes each.
constexpr int kIndexKDim = store_head_dim(kStoreFp4Indexer);
constexpr int64_t kIndexKDataBytes = store_data_bytes(kStoreFp4Indexer);
constexpr int64_t kIndexKScaleBytes = store_scale_bytes(kStoreFp4Indexer);
DSV4_HD constexpr int64_t index_k_page_bytes(int64_t page_size) {
  return store_page_bytes(kStoreFp4Indexer, page_size);
}

// ---- exp ---------------------------------------------------------------------------------------

// e^x for x <= 0 (NaN passes through), within 2 ulp; the same bits on every backend (Cephes'
// range reduction and polynomial, each step one fmaf). Exactly 1 at 0, and 0 (through a
// subnormal-free scaling) from -104 down. Branch-free: the GPU runs it as selects.
DSV4_HD float exp_nonpositive(float x) {
  x = x < -104.0f ? -104.0f : x;  // e^-104 rounds to 0; a NaN stays
  const float k = rintf(x * 1.44269504088896341f);
  float r = fmaf(-k, 0.693359375f, x);
  r = fmaf(-k, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float y = fmaf(p, r * r, r) + 1.0f;
  // y * 2^k, k in [-150, 0], as two normal powers of two: the first product is exact, the
  // second rounds once (into the subnormals below k = -126).
  const int ki = k == k ? int(k) : 0;
  const int k1 = ki / 2, k2 = ki - k1;
  return (y * bits_f32(uint32_t(k1 + 127) << 23)) * bits_f32(uint32_t(k2 + 127) << 23);
}

// ---- ratio-2 pair pooling (contract V4.1 1.2) ------------------------------------------------

// softmax([z0, z1]) pooling of one channel in closed form: with d = z0 - z1 and e = e^-|d|,
// (kv0 * a + kv1 * b) / (1 + e), (a, b) = (1, e) if d > 0 else (e, 1). One exp, no overflow; a
// tie gives the mean, a cleared partner (kv 0, score -inf) gives kv1 exactly.
DSV4_HD float pair_pool(float kv_even, float score_even, float kv_odd, float score_odd) {
  const float d = score_even - score_odd;
  const float e = exp_nonpositive(-fabsf(d));
  const bool even_wins = d > 0.0f;
  const float a = even_wins ? 1.0f : e;
  const float b = even_wins ? e : 1.0f;
  return fmaf(kv_even, a, kv_odd * b) / (1.0f + e);
}

// The RoPE position of a compressed token: the group's first position, pos & ~(ratio - 1).
DSV4_HD int64_t group_position(int64_t pos, int ratio) { return pos & ~int64_t(ratio - 1); }

// ---- the latent's RMSNorm sum (contract V4.1 1.4) ------------------------------------------

// The sum of squares of a 512-dim latent input in its one fixed order: per 128-dim chunk j,
// the lane layout's sum (lane l: fmaf partials over dims lane_dim(j, l, k), k = 0..3, then the
// 32 lanes' xor-butterfly), and the four chunk sums added in chunk order. The GPU kernels hold
// a row as four lane groups (one a chunk) or one, in this order either way (row_encode.cuh).
DSV4_HD float chunk_sumsq_total(float s0, float s1, float s2, float s3) {
  return ((s0 + s1) + s2) + s3;
}

// Host side: chunk j's sum of the 512 values x, and the row's.
inline float chunk_sumsq(const float* x, int j) {
  float partial[kLaneGroup];
  for (int l = 0; l < kLaneGroup; ++l) {
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[lane_dim(j, l, k)]);
    partial[l] = acc;
  }
  return lane_tree_sum(partial);
}
inline float latent_sumsq(const float* x) {
  return chunk_sumsq_total(chunk_sumsq(x, 0), chunk_sumsq(x, 1), chunk_sumsq(x, 2),
                           chunk_sumsq(x, 3));
}

// ---- e2m1 / e4m3 helpers -----------------------------------------------------------------------

// Index (0..7 into {0, .5, 1, 1.5, 2, 3, 4, 6}) of a >= 0 rounded to nearest, ties to the even
// index, saturating at 6 (NaN and a < 0 give 0): the e2m1 code, whose grid is uniform (step
// 0.5) below 1 and a 1-mantissa-bit float from 1. Below 1: rint(2a), the last bits of
// a + 2^22 (one rounding at a unit of 0.5, ties to the even multiple); from 1: the exponent
// and one mantissa bit of a rounded to nearest even (the bits plus 2^21 - 1 plus the kept
// bit), as an index from 1.0's (2). The threshold count (a > 0.25) + (a >= 0.75) +
// (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5) for every fp32 input
// (tests/test_numerics_exhaustive.py), in fewer than half its instructions.
DSV4_HD uint32_t e2m1_rne_index(float a) {
  a = a > 0.0f ? a : 0.0f;
  const uint32_t u = f32_bits(a);
  const uint32_t hi = (u + (0x1fffffu - (252u << 22)) + ((u >> 22) & 1u)) >> 22;
  return (a < 1.0f ? f32_bits(a + 0x1p22f) : hi < 7u ? hi : 7u) & 7u;
}
// The magnitude of index e2m1_rne_index(a), computed as a float the same way: below 1 the
// multiple of 0.5, from 1 the bits rounded to one mantissa bit, at most 6.
DSV4_HD float e2m1_rne_value(float a) {
  a = a > 0.0f ? a : 0.0f;
  const float lo = (a + 0x1p22f) - 0x1p22f;
  const uint32_t u = f32_bits(a);
  const float hi = bits_f32((u + 0x1fffffu + ((u >> 22) & 1u)) & 0xffc00000u);
  return a < 1.0f ? lo : hi < kE2m1Max ? hi : kE2m1Max;
}
// The value of an e4m3fn byte of a finite positive number (the sign bit ignored): its 7 bits
// at fp32's exponent / mantissa position are the value times 2^-120, a subnormal fp32 for the
// e4m3 subnormals, so one exact product rebiases both.
DSV4_HD float e4m3_value(uint8_t b) {
  return bits_f32(uint32_t(b & 0x7fu) << 20) * 0x1p120f;
}
// ue8m0_ceil(y) for a positive normal y: its biased exponent, plus one if the mantissa is not
// zero (the exponent byte of the smallest power of two >= y).
DSV4_HD uint32_t ue8m0_ceil_byte(float y) {
  const uint32_t u = f32_bits(y);
  const uint32_t e = u >> 23;
  return e >= 0xffu ? 0xffu : e + ((u & 0x7fffffu) != 0u ? 1u : 0u);
}

// ---- division by a tile's scale ------------------------------------------------------------

// The divisor of one tile with its reciprocal, so that the tile's values divide without a
// division each: quotient() is Markstein's correction of a * (1 / b), the IEEE quotient a / b
// for 2^-100 < |a| < 2^100 and no overflow (compared with a / b over every bf16 a and e4m3 b and
// 2e8 random fp32 a). The encoders' quotients stay far from overflow, and for smaller |a| both
// give e2m1 index 0 with the sign taken from elsewhere.
struct TileDivisor {
  float b, r;
};
DSV4_HD TileDivisor tile_divisor(float b) { return {b, 1.0f / b}; }
DSV4_HD float quotient(float a, TileDivisor d) {
  const float q = a * d.r;
  return fmaf(fmaf(-q, d.b, a), d.r, q);
}

// ---- fp4 fake quantisation of a ratio-1/2 rotated row (contract V4.1 1.6) --------------------

// Scale of a 16-dim block: e4m3_rne(clamp(amax * fp32(1/6), 2^-9, 448)), as a float.
DSV4_HD float fake_quant_scale(float amax) {
  float s = amax * kOneSixth;
  s = s > kE4m3ScaleMin ? s : kE4m3ScaleMin;
  s = s < kE4m3Max ? s : kE4m3Max;
  return e4m3_value(f32_to_e4m3_satfinite(s));
}
// v on the e2m1 x scale grid: t = v / s + 0 (IEEE; -0 becomes +0), a negative t that rounds to
// magnitude 0 gives -0.
DSV4_HD float fake_quant_value(float v, TileDivisor s) {
  const float t = quotient(v, s) + 0.0f;
  const float m = e2m1_rne_value(fabsf(t));
  return (t < 0.0f ? -m : m) * s.b;
}

// ---- V41 row encodings (contract V4.1 3.2 - 3.4) ---------------------------------------------

// V41 (fp8, one UE8M0 per 32 dims): ue8m0_ceil(max(amax / 448, 1e-4)). Below 2^-6 the quotient
// is under 2^-13 and the floor byte 114 applies; above, ue8m0_ceil_quotient gives the exponent
// of fl(amax / 448) rounded up.
DSV4_HD uint8_t v41_exponent(float amax) {
  if (!(amax >= 0.015625f)) return kV41MinExponent;
  const uint8_t e = ue8m0_ceil_quotient(amax, 8, 0x600000u);
  return e > kV41MinExponent ? e : kV41MinExponent;
}
// e4m3_rne(x * 2^(127 - e)) with inv = ue8m0_inv_scale(e): never saturates, -0 gives 0x80.
DSV4_HD uint8_t v41_code(float x, float inv) { return f32_to_e4m3_satfinite(x * inv); }

// V41_FP4 (e2m1, one e4m3 scale per 16 dims): e4m3_rne(clamp(amax / 6, 2^-9, 448)), IEEE
// division (unlike the fake quant's multiplier). The clamp applies to amax (6 * 2^-9, 6 * 448:
// the division is monotonic and exact at both ends), which keeps the quotient where quotient()
// is the IEEE one (checked for every fp32 amax: tests/test_numerics_exhaustive.py); a NaN
// gives 2^-9 as before.
DSV4_HD uint8_t v41_fp4_scale_byte(float amax) {
  float a = amax > 6.0f * kE4m3ScaleMin ? amax : 6.0f * kE4m3ScaleMin;
  a = a < 6.0f * kE4m3Max ? a : 6.0f * kE4m3Max;
  return f32_to_e4m3_satfinite(quotient(a, tile_divisor(kE2m1Max)));
}
// e2m1_rne_satfinite(x / scale), the sign bit kept for every negative x (-0 included: 0x8).
DSV4_HD uint8_t v41_fp4_code(float x, TileDivisor scale) {
  return uint8_t(e2m1_rne_index(fabsf(quotient(x, scale))) | ((f32_bits(x) >> 31) << 3));
}

// UNIFORM_FP8: e4m3_satfinite(x), unit scale.
DSV4_HD uint8_t uniform_fp8_code(float x) { return f32_to_e4m3_satfinite(x); }

// ---- low-ratio index-K (contract V4.1 1.8) -------------------------------------------------

// Stage 1 (fake quant per 32 dims): 2^ceil(log2(max(amax, 6 * 2^-126) * fp32(1/6))).
DSV4_HD float index_k_stage1_scale(float amax) {
  const float y = (amax > kIndexKAmaxFloor ? amax : kIndexKAmaxFloor) * kOneSixth;
  return bits_f32(ue8m0_ceil_byte(y) << 23);
}
// e2m1_rne(clamp(k / sc, +-6)) * sc, signed (a negative k / sc rounding to 0 gives -0).
DSV4_HD float index_k_stage1_value(float k, float sc) {
  const float t = k * (1.0f / sc);  // sc is a power of two: the exact quotient
  const float m = e2m1_rne_value(fabsf(t));
  return (t < 0.0f ? -m : m) * sc;
}
// Stage 2 (the packer) exponent of 32 stage-1 values: clamp(ue8m0_ceil(max(amax / 6, 1e-4)),
// 1, 254), IEEE division, the floor after it.
DSV4_HD uint8_t index_k_exponent(float amax_q) {
  float y = amax_q / kE2m1Max;
  y = y > kScaleFloor ? y : kScaleFloor;
  const uint32_t e = ue8m0_ceil_byte(y);
  return uint8_t(e < 1u ? 1u : e > 254u ? 254u : e);
}
// e2m1_rne(q * 2^(127 - e)) with inv = ue8m0_inv_scale(e); the sign bit only on a non-zero
// magnitude (no 0x8 code).
DSV4_HD uint8_t index_k_code(float q, float inv) {
  const float t = q * inv;
  const uint32_t idx = e2m1_rne_index(fabsf(t));
  return uint8_t(idx | ((t < 0.0f && idx != 0u) ? 8u : 0u));
}

}  // namespace dsv4
