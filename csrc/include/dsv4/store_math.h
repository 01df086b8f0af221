// compress_norm_rope_store (docs/contract.md 1.3 and 4): torch-free math shared by the CPU kernel
// (store_cpu.cpp) and the GPU kernel (store/store_kernel.cuh).
//
// Both backends walk a token with the same "lane layout": 32 lanes, lane l holding the
// values of dims 128*j + 4*l + k (j < hd/128, k < 4). The GPU runs one lane per thread; the
// CPU emulates the lanes only where the order of fp32 operations matters: the RMS sum of
// squares, in the reference engine's order (hd 128: a per-lane partial sum followed by the
// xor-butterfly tree of group_sum; the 512-dim V4.0 stores: block_order_sumsq). Everything
// else is element-wise or exact (max, Hadamard stages in the fixed order bit 0..6), so with
// the per-value functions below the two backends produce bit-identical caches. All products
// that feed an addition go through an explicit fmaf, so no compiler contraction (nvcc and
// hipcc fuse a*b+c by default) can change a rounding.
#pragma once

#include <math.h>

#include "dcp.h"
#include "numerics.h"
#include "plan_records.h"

namespace dsv4 {

// ---- store formats (contract 4 table) ---------------------------------------------------------

enum StoreFormat : int {
  kStoreFp8DsMla = 0,   // hd 512: 448 e4m3 + 64 bf16 rope dims, 7 UE8M0 scales (+1 unused byte)
  kStoreBf16 = 1,       // hd 512: 512 bf16
  kStoreFp8Indexer = 2, // hd 128: 128 e4m3, one fp32 scale
  kStoreFp4Indexer = 3, // hd 128: 128 e2m1 nibbles, 4 UE8M0 scales
};

constexpr int kRopeDim = 64;
constexpr int kDsMlaNopeDim = 448;   // dims quantised to e4m3 in fp8_ds_mla
constexpr int kDsMlaGroup = 64;      // dims per UE8M0 scale in fp8_ds_mla
constexpr int kFp4Group = 32;        // dims per UE8M0 scale in fp4_indexer
constexpr float kScaleFloor = 1e-4f; // amax floor of every scale rule
constexpr float kE4m3Max = 448.0f;
// 1/sqrt(128) rounded to fp32; the Hadamard multiplies by it once, after all butterflies.
constexpr float kHadamardScale = 0.08838834764831845f;

DSV4_HD constexpr int store_head_dim(int fmt) {
  return (fmt == kStoreFp8DsMla || fmt == kStoreBf16) ? 512 : 128;
}
// Bytes of one token's data in a page (the "token data" column of the table).
DSV4_HD constexpr int64_t store_data_bytes(int fmt) {
  return fmt == kStoreFp8DsMla     ? 576
         : fmt == kStoreBf16       ? 1024
         : fmt == kStoreFp8Indexer ? 128
                                   : 64;
}
// Bytes between consecutive tokens' scales (0: none). fp8_ds_mla: 7 UE8M0 bytes + 1 unused
// byte, which the store never writes.
DSV4_HD constexpr int64_t store_scale_bytes(int fmt) {
  return fmt == kStoreFp8DsMla ? 8 : fmt == kStoreBf16 ? 0 : 4;
}
// Minimum page bytes of the format for `page_size` tokens per page.
DSV4_HD constexpr int64_t store_page_bytes(int fmt, int64_t page_size) {
  return fmt == kStoreFp8DsMla ? (584 * page_size + 575) / 576 * 576
                               : (store_data_bytes(fmt) + store_scale_bytes(fmt)) * page_size;
}
// Byte offsets inside a page of token `off`'s data and scales.
DSV4_HD constexpr int64_t store_data_offset(int fmt, int64_t off) {
  return off * store_data_bytes(fmt);
}
DSV4_HD constexpr int64_t store_scale_offset(int fmt, int64_t page_size, int64_t off) {
  return store_data_bytes(fmt) * page_size + off * store_scale_bytes(fmt);
}

// ---- which rows write, and where ----------------------------------------------------------

// Reads plan row t (16 bytes) and decides whether it stores a token. On success returns true
// with `loc_index` = the index into out_loc (decode: t; prefill: ragged_id) and `pos` = the
// RoPE position seq_len - compress_ratio, already checked against [0, max_pos).
//   decode  (DecodePlan):   active iff seq_len % cr == 0 and write_loc >= 0
//   prefill (CompressPlan): active iff the record is valid (seq_len != 0xFFFFFFFF)
DSV4_HD bool store_row_target(uint32_t seq_len, int32_t word1, bool is_decode, int compress_ratio,
                              int64_t t, int64_t num_out_loc, int64_t max_pos, int64_t* loc_index,
                              int64_t* pos) {
  int64_t idx;
  if (is_decode) {
    // compress_ratio is 4 or 128 (checked by the op): a mask, not a division.
    if ((seq_len & uint32_t(compress_ratio - 1)) != 0u || word1 < 0) return false;
    idx = t;
  } else {
    if (seq_len == kInvalidSeqLen) return false;
    idx = int64_t(uint32_t(word1) & 0xffffu);  // ragged_id: low half of the second word
  }
  if (idx >= num_out_loc) return false;
  const int64_t p = int64_t(seq_len) - compress_ratio;
  if (p < 0 || p >= max_pos) return false;
  *loc_index = idx;
  *pos = p;
  return true;
}

// Cache page of `loc`, or -1 when the location writes nothing (negative or past the cache).
DSV4_HD int64_t store_page_of(int64_t loc, int log2_page_size, int64_t num_pages) {
  if (loc < 0) return -1;
  const int64_t page = loc >> log2_page_size;
  return page < num_pages ? page : -1;
}

// Where this rank stores global cache entry g (the slot out_loc names with one rank), after the
// op's own skip rules: the page and in-page offset of g's local slot (dcp.h). page -1: g writes
// nothing here (negative, another rank's, or past this rank's num_pages). Every store path of
// every backend resolves its destination here; with world_size 1 it is store_page_of(g).
struct CacheSlot {
  int64_t page;
  int64_t off;
};
DSV4_HD CacheSlot store_slot_of(int64_t g, const Dcp& dcp, int log2_page_size,
                                int64_t num_pages) {
  const int64_t loc = dcp_is_identity(dcp) || g < 0 ? g : dcp_local_slot(dcp, g);
  return {store_page_of(loc, log2_page_size, num_pages),
          loc & ((int64_t(1) << log2_page_size) - 1)};
}

// ---- per-value math --------------------------------------------------------------------------

// Dim held by (j, lane, k) in the lane layout.
DSV4_HD constexpr int lane_dim(int j, int lane, int k) { return 128 * j + 4 * lane + k; }

// One lane's partial sum of squares: its values in (j, k) order, fused multiply-adds.
DSV4_HD float sumsq_step(float acc, float x) { return fmaf(x, x, acc); }

// The sum of squares of dims (2t, 2t+1), the leaf of block_order_sumsq: x0^2 rounded, then x1^2
// fused in.
DSV4_HD float pair_sumsq(float x0, float x1) { return fmaf(x1, x1, x0 * x0); }

// rsqrt(mean(x^2) + eps) from the full sum of squares (hd is a power of two: exact mean).
DSV4_HD float rms_inv(float sumsq, int hd, float eps) {
  return 1.0f / sqrtf(fmaf(sumsq, 1.0f / float(hd), eps));
}

DSV4_HD float norm_value(float x, float inv, float w) { return (x * inv) * w; }

// Rotation of the interleaved pair (re, im) by (c, s) = freqs[pos][2i], freqs[pos][2i+1].
DSV4_HD void rope_pair(float& re, float& im, float c, float s) {
  const float r = fmaf(re, c, -(im * s));
  const float i = fmaf(re, s, im * c);
  re = r;
  im = i;
}

// One Walsh-Hadamard butterfly on (lo, hi) = values whose indices differ in one bit.
DSV4_HD void hadamard_pair(float& lo, float& hi) {
  const float a = lo, b = hi;
  lo = a + b;
  hi = a - b;
}
// The same butterfly seen from one side, given the partner's value (GPU shuffle stages):
// partner - own (upper) or own + partner, as one fused multiply-add by +-1 (exact product,
// one rounding: the same sums).
DSV4_HD float hadamard_side(float own, float partner, bool upper) {
  return fmaf(upper ? -1.0f : 1.0f, own, partner);
}

DSV4_HD float floor_amax(float amax) { return amax > kScaleFloor ? amax : kScaleFloor; }

// The UE8M0 byte of the smallest power of two >= fl(a / d) (rounding up keeps the scaled
// values inside the code range; rounding down would saturate the largest codes), for
// a >= kScaleFloor (finite or +inf) and a divisor d = 1.m * 2^k, without the division: the
// rounded quotient's exponent is a's minus k, plus one exactly when a's mantissa exceeds d's
// (`d_mant`). The quotient never rounds onto a power of two: its distance from one is at least
// 2^-23 / 1.m, more than half an ulp on either side. Compared with the division rule over
// every float when written (a one-off program, not in the suite); test_ue8m0_scale_rounds_up
// pins the boundaries (mantissa just below, at and above d's) on every backend.
DSV4_HD uint8_t ue8m0_ceil_quotient(float a, int k, uint32_t d_mant) {
  const uint32_t u = f32_bits(a);
  const uint32_t e = u >> 23;
  if (e == 0xffu) return uint8_t(0xff);  // +inf / d = +inf
  return uint8_t(e - uint32_t(k) + ((u & 0x7fffffu) > d_mant ? 1u : 0u));
}

// fp8_ds_mla: UE8M0 exponent of a 64-dim group from the amax of its bf16-rounded values, for
// floor_amax(amax) / 448, 448 = 1.75 * 2^8.
DSV4_HD uint8_t ds_mla_exponent(float amax) {
  return ue8m0_ceil_quotient(floor_amax(amax), 8, 0x600000u);
}
// fp4_indexer: UE8M0 exponent of a 32-dim group, for floor_amax(amax) / 6, 6 = 1.5 * 2^2.
DSV4_HD uint8_t fp4_exponent(float amax) {
  return ue8m0_ceil_quotient(floor_amax(amax), 2, 0x400000u);
}
// fp8_indexer: fp32 scale of the whole 128-dim token.
DSV4_HD float fp8_indexer_scale(float amax) { return floor_amax(amax) / kE4m3Max; }

// Quantised codes. `inv` = ue8m0_inv_scale(e) (exact power of two).
DSV4_HD uint8_t ds_mla_code(float y_bf16, float inv) { return f32_to_e4m3_satfinite(y_bf16 * inv); }
DSV4_HD uint8_t fp8_indexer_code(float y, float scale) { return f32_to_e4m3_satfinite(y / scale); }
DSV4_HD uint8_t fp4_code(float y, float inv) { return f32_to_e2m1(y * inv); }

// Host-side emulation of an xor-butterfly sum over N lanes (group_sum of portability.h for
// N = 32), masks N/2 .. 1: every lane ends with the same value, so lane 0's result is the
// group's.
template <int N>
inline float lane_tree_sum(float (&p)[N]) {
  for (int m = N / 2; m > 0; m >>= 1) {
    float q[N];
    for (int l = 0; l < N; ++l) q[l] = p[l] + p[l ^ m];
    for (int l = 0; l < N; ++l) p[l] = q[l];
  }
  return p[0];
}

// Sum of squares of a 512-dim row of the V4.0 stores (fp8_ds_mla, bf16) in the order of the
// reference engine's kernel, one 256-thread block per token (docs/contract.md 4): thread
// t = 32w + r holds pair_sumsq(x[2t], x[2t+1]); an xor tree over the 32 lanes r of each warp w
// (masks 16 .. 1), then one over the 8 warp sums (masks 4, 2, 1). The GPU forms the same sums
// in the lane layout (row_sumsq in store/store_kernel.cuh).
inline float block_order_sumsq(const float* x) {
  float warp[8];
  for (int w = 0; w < 8; ++w) {
    float p[kLaneGroup];
    for (int r = 0; r < kLaneGroup; ++r) p[r] = pair_sumsq(x[64 * w + 2 * r], x[64 * w + 2 * r + 1]);
    warp[w] = lane_tree_sum(p);
  }
  return lane_tree_sum(warp);
}

}  // namespace dsv4
