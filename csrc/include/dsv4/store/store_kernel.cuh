// compress_norm_rope_store GPU kernel (docs/contract.md 1.3 and 4), shared by CUDA and HIP.
//
// One 32-lane group (kLaneGroup) per token, several tokens per block (a V4.1 layout's launch
// of at most kStoreSplitRowsPerSm tokens an SM: four groups a token, one chunk each). Lane l
// holds dims 128*j + 4*l + k (store_math.h's lane layout): every load and store instruction of
// a group then touches one contiguous stretch of the row / cache slot. The RMS sum and the amaxes
// are group reductions through the width-32 shuffles of portability.h (so a 64-lane AMD
// wavefront runs two tokens, one per half); the 128-point Hadamard is two in-thread
// butterfly stages followed by five xor-shuffle stages.
//
// Instantiation: compress_norm_rope_store_kernel<Format, KvT[, RowGroups]> with Format one of
// kStoreFp8DsMla, kStoreBf16, kStoreFp8Indexer, kStoreFp4Indexer or a V4.1 layout's
// store_layout_format, KvT float or uint16_t (bf16 bits), RowGroups 1 or (a V4.1 layout) 4, e.g.
//   template __global__ void dsv4::compress_norm_rope_store_kernel<dsv4::kStoreBf16, float>(
//       dsv4::StoreKernelArgs);
#pragma once

#include "../low_ratio/row_encode.cuh"
#include "../store_math.h"
#include "memory_access.cuh"
#include "quantize.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

constexpr int kStoreMaxBlockThreads = 256;  // a multiple of 64: whole wavefronts on AMD
// A V4.1 layout's launch of at most this many rows an SM runs four lane groups a row.
constexpr int64_t kStoreSplitRowsPerSm = 2;

// fp8_ds_mla rows stored in a V4.1 layout (contract V4.1 4.2): kernel formats past the four of
// StoreFormat, one per layout other than V4 (whose rows are today's kStoreFp8DsMla). The layout
// is a template constant rather than a kernel argument, so that StoreKernelArgs (and with it
// the V4.0 instances' machine code) stays as it is.
DSV4_HD constexpr int store_layout_format(int layout) {
  return layout == kLayoutV4 ? int(kStoreFp8DsMla) : int(kStoreFp4Indexer) + layout;
}
DSV4_HD constexpr bool store_format_is_layout(int format) { return format > kStoreFp4Indexer; }
DSV4_HD constexpr int store_format_layout(int format) { return format - kStoreFp4Indexer; }
DSV4_HD constexpr int store_kernel_head_dim(int format) {
  return store_format_is_layout(format) ? kLowRatioHeadDim : store_head_dim(format);
}

struct StoreKernelArgs {
  const void* kv;           // [n_rows, hd], KvT elements, contiguous
  const uint8_t* plan;      // [n_rows, 16] DecodePlan or CompressPlan records
  const void* norm_weight;  // [hd] fp32 (w_bf16 false) or bf16 bits
  const float* freqs;       // [max_pos, 64] (cos, sin) pairs
  const void* out_loc;      // [num_out_loc] int32 (loc64 false) or int64
  uint8_t* cache;           // num_pages pages of page_bytes
  int64_t n_rows;
  int64_t num_out_loc;
  int64_t max_pos;
  int64_t num_pages;
  int64_t page_bytes;
  int64_t page_size;
  Dcp dcp;  // out_loc names global entries: this rank stores the ones it owns (contract 9)
  int log2_page_size;
  int compress_ratio;
  float eps;
  bool is_decode;
  bool w_bf16;
  bool loc64;
  bool vec_in;   // kv, norm_weight, freqs and plan are 16-byte aligned: vector loads
  bool vec_out;  // cache and page_bytes are 8-byte aligned: 2/4/8-byte stores
#if defined(DSV4_TEST_HOOKS)
  uint32_t guess_xor;  // XORed into the plan guess (load_early): DSV4_OPS_TEST_STALE_PLAN
#endif
};

// Blocks of kStoreMaxBlockThreads that an SM must hold at once (CUDA): the indexer formats
// (hd 128) fit 8, a whole SM (at most 32 registers), so that a prefill's rows go out in one
// wave. HIP reads the second __launch_bounds__ argument as waves per execution unit: no bound.
constexpr int store_min_blocks(int format) {
#if defined(DSV4_HIP)
  (void)format;
  return 1;
#else
  return store_kernel_head_dim(format) == 128 ? 8 : 1;
#endif
}

// The sum of squares of a V4.0 token in the lane layout, in every lane. hd 128: per-lane partial
// sum in (j, k) order, then the group's xor-butterfly sum. hd 512: block_order_sumsq's order
// (store_math.h). Lane l holds its pairs t = 64j + 2l + h (k = 2h, 2h + 1), i.e. warp 2j + l/16,
// warp lane 2(l % 16) + h: the warp trees' masks 16 .. 2 are lane masks 8 .. 1 and mask 1 is h;
// the warp-sum tree's masks 4, 2, 1 are bit 1 of j, bit 0 of j and lane mask 16.
template <int kJ>
DSV4_DEVICE float row_sumsq(const float (&x)[kJ][4]) {
  if constexpr (kJ == 4) {
    float p[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) p[j][h] = pair_sumsq(x[j][2 * h], x[j][2 * h + 1]);
#pragma unroll
    for (int m = kLaneGroup / 4; m > 0; m >>= 1)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) p[j][h] += shfl_xor(p[j][h], m);
    const float s = ((p[0][0] + p[0][1]) + (p[2][0] + p[2][1])) +
                    ((p[1][0] + p[1][1]) + (p[3][0] + p[3][1]));
    return s + shfl_xor(s, kLaneGroup / 2);
  } else {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[j][k]);
    return group_sum(acc);
  }
}

// RMSNorm of a token's values x (weights w) in the lane layout, then RoPE on its last 64 dims
// (pairs (k = 0, 1) and (2, 3) of the last chunk, rope lanes only, by their (cos, sin) pairs f).
template <int kJ>
DSV4_DEVICE void norm_rope(const float (&x)[kJ][4], const float (&w)[kJ][4], const float (&f)[4],
                           bool rope_lane, float eps, float (&y)[kJ][4]) {
  const float inv = rms_inv(row_sumsq<kJ>(x), 128 * kJ, eps);
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) y[j][k] = norm_value(x[j][k], inv, w[j][k]);
  if (rope_lane) {
    rope_pair(y[kJ - 1][0], y[kJ - 1][1], f[0], f[1]);
    rope_pair(y[kJ - 1][2], y[kJ - 1][3], f[2], f[3]);
  }
}

// The rows of a V4.1 layout (contract V4.1 4.2): w' = w rounded to kv's dtype, y = x * inv * w'
// rounded to kv's dtype, the RoPE dims rotated and rounded to it again. inv: every lane's 16
// values one sum-of-squares chain, then the group's butterfly.
DSV4_DEVICE float store_v41_rms_inv(const float (&x)[4][4], float eps) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[j][k]);
  return rms_inv(group_sum(acc), kLowRatioHeadDim, eps);
}
// One chunk's 4 values of a lane; `rotates`: they are RoPE dims (chunk 3, a rope lane).
template <typename KvT>
DSV4_DEVICE void store_v41_chunk(const float (&x)[4], const float (&w)[4], float inv,
                                 const float (&f)[4], bool rotates, float (&y)[4]) {
  constexpr bool kBf16 = sizeof(KvT) == 2;
  const auto to_kv = [](float v) { return kBf16 ? round_to_bf16(v) : v; };
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = to_kv(norm_value(x[k], inv, to_kv(w[k])));
  if (rotates) {
    rope_pair(y[0], y[1], f[0], f[1]);
    rope_pair(y[2], y[3], f[2], f[3]);
#pragma unroll
    for (int k = 0; k < 4; ++k) y[k] = to_kv(y[k]);
  }
}
template <typename KvT>
DSV4_DEVICE void store_norm_rope_v41(const float (&x)[4][4], const float (&w)[4][4],
                                     const float (&f)[4], bool rope_lane, float eps,
                                     float (&y)[4][4]) {
  const float inv = store_v41_rms_inv(x, eps);
#pragma unroll
  for (int j = 0; j < 4; ++j) store_v41_chunk<KvT>(x[j], w[j], inv, f, rope_lane && j == 3, y[j]);
}
// The same for chunk g of the token only (the row groups of a split launch); wg: chunk g's
// norm weights.
template <typename KvT>
DSV4_DEVICE void store_norm_rope_v41_chunk(const float (&x)[4][4], const float (&wg)[4],
                                           const float (&f)[4], bool rope_lane, float eps, int g,
                                           float (&y)[1][4]) {
  const float inv = store_v41_rms_inv(x, eps);
  float xg[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // chunk g's values by selects (no indexed register array)
    xg[k] = x[0][k];
#pragma unroll
    for (int j = 1; j < 4; ++j) xg[k] = g == j ? x[j][k] : xg[k];
  }
  store_v41_chunk<KvT>(xg, wg, inv, f, rope_lane && g == 3, y[0]);
}

// The first 8 bytes of a plan record (seq_len, second word) read byte by byte (a plan that
// may be unaligned), and read either way.
DSV4_DEVICE uint2 plan_head_bytes(const uint8_t* rec) {
  return make_uint2(uint32_t(rec[0]) | (uint32_t(rec[1]) << 8) | (uint32_t(rec[2]) << 16) |
                        (uint32_t(rec[3]) << 24),
                    uint32_t(rec[4]) | (uint32_t(rec[5]) << 8) | (uint32_t(rec[6]) << 16) |
                        (uint32_t(rec[7]) << 24));
}
DSV4_DEVICE uint2 plan_head(const StoreKernelArgs& a, int64_t t) {
  const uint8_t* rec = a.plan + t * 16;
  return a.vec_in ? *reinterpret_cast<const uint2*>(rec) : plan_head_bytes(rec);
}

// Row t of the store, by the 32-lane group whose lane this is: the store kernel's body, also
// run by the fused compress_and_store kernels (include/dsv4/fused/) after their
// pooling. kInKernel false: the caller has waited for the grid dependency and made the rows
// (a block barrier after its writes): the record is read once, no guess, no PDL calls.
// kRegRow (fused kernels whose pooling threads are the lane group, hd 128): the row's values are
// this lane's x_reg, as the rows buffer of type KvT holds them, and the row is not loaded.
// kRowGroups 4 (a V4.1 layout, store_cuda.cu launch_store): four lane groups a token, the
// calling one its chunk `chunk`; each loads the whole token for the RMS sum (its own chunk's
// weights only), encodes its chunk.
// One body (about 180 lines): with the format writes split into functions nvcc schedules the fp8
// instances' code differently, so the cache writes stay inline.
template <int kFormat, typename KvT, bool kInKernel, bool kRegRow = false, int kRowGroups = 1>
DSV4_DEVICE void store_row(const StoreKernelArgs& a, int64_t t, int lane,
                           const float* x_reg = nullptr, int chunk = 0) {
  using namespace store_detail;
  constexpr int kHd = store_kernel_head_dim(kFormat);
  constexpr int kJ = kHd / 128;  // 4-value chunks per lane
  static_assert(kRowGroups == 1 || (store_format_is_layout(kFormat) && !kRegRow),
                "only the V4.1 layouts' rows split over lane groups");

  // The first 8 bytes of the plan record (seq_len, second word), guessed before the wait
  // (load_early; a plan that may be unaligned is only read after the wait).
  const bool active = t < a.n_rows;  // uniform over the lane group
  const uint8_t* rec = a.plan + t * 16;
  uint2 early = make_uint2(0u, 0u);
  if (active && a.vec_in) {
    early = kInKernel ? load_early(reinterpret_cast<const uint2*>(rec))
                      : *reinterpret_cast<const uint2*>(rec);
  }
#if defined(DSV4_TEST_HOOKS)
  // DSV4_OPS_TEST_STALE_PLAN: a wrong guess. The record itself stays `early` where that is
  // the real one (no PDL).
  const uint2 guess = make_uint2(early.x ^ a.guess_xor, early.y ^ a.guess_xor);
#elif defined(DSV4_GRID_DEPENDENCY)
  // The guess XORed with a zero nvcc cannot see through (n_rows >= 1). Knowing guess == early,
  // nvcc first consumes the early read after the round's loads are out, on a scoreboard they
  // share, so the round waits for the record read after the wait (check_load_batching.py).
  const uint32_t zero = uint32_t(uint64_t(a.n_rows) >> 63);
  const uint2 guess = make_uint2(early.x ^ zero, early.y ^ zero);
#else
  const uint2 guess = early;  // no PDL: the record read after the wait is `early` itself
#endif
  if constexpr (kInKernel) {
    pdl_wait();
    pdl_trigger();
  }
  if (!active) return;

  // Round 1: the plan record (broadcast to the group), and for the guessed record its
  // destination, rope (cos, sin) pairs, norm weights and row. A row the guess says stores
  // nothing (the invalid tail of a padded CUDA-graph plan) loads none of them, so a padded plan
  // costs its valid rows' traffic only. Every load of the round goes out before any loaded value
  // is used (the bits are converted afterwards, see load_bits).
  uint32_t seq_len, word1;
  if (a.vec_in) {
    const uint2 q = kInKernel ? load_after_wait(reinterpret_cast<const uint2*>(rec), early)
                              : early;
    seq_len = q.x;
    word1 = q.y;
  } else {
    const uint2 q = plan_head_bytes(rec);
    seq_len = q.x;
    word1 = q.y;
  }
  // A split row's group loads only its own chunk's weights (into w_bits[0]).
  constexpr int kWJ = kRowGroups > 1 ? 1 : kJ;
  uint32_t w_bits[kJ][4], x_bits[kJ][4];
  const KvT* row = static_cast<const KvT*>(a.kv) + t * kHd;
  const auto load_inputs = [&] {
#pragma unroll
    for (int j = 0; j < kWJ; ++j) {
      const int wj = kRowGroups > 1 ? chunk : j;
      if (a.w_bf16)
        load_bits(static_cast<const uint16_t*>(a.norm_weight) + lane_dim(wj, lane, 0), a.vec_in,
                  w_bits[j]);
      else
        load_bits(static_cast<const float*>(a.norm_weight) + lane_dim(wj, lane, 0), a.vec_in,
                  w_bits[j]);
    }
    if constexpr (!kRegRow) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) load_bits(row + lane_dim(j, lane, 0), a.vec_in, x_bits[j]);
    }
  };
  // Destination and the rope lanes' (cos, sin) pairs of record (sl, w1); false: the row
  // stores nothing.
  const bool rope_lane = lane >= kLaneGroup / 2;  // dims hd-64.. live in chunk kJ-1, lanes 16..31
  // The out_loc entry as loaded, in the register of its load: an int32 one is sign-extended
  // only where it is used (a move or extension in the branch of its load waits for the load).
  uint2 loc_bits = make_uint2(0xffffffffu, 0xffffffffu);
  float f[4] = {1.0f, 0.0f, 1.0f, 0.0f};
  const auto load_target = [&](uint32_t sl, uint32_t w1) {
    int64_t loc_index = 0, pos = 0;
    if (!store_row_target(sl, int32_t(w1), a.is_decode, a.compress_ratio, t, a.num_out_loc,
                          a.max_pos, &loc_index, &pos))
      return false;
    if (a.loc64) loc_bits = static_cast<const uint2*>(a.out_loc)[loc_index];
    else loc_bits.x = static_cast<const uint32_t*>(a.out_loc)[loc_index];
    if (rope_lane && (kRowGroups == 1 || chunk == kJ - 1))
      load4(a.freqs + pos * kRopeDim + 4 * (lane - kLaneGroup / 2), a.vec_in, f);
    return true;
  };
  bool stores = load_target(guess.x, guess.y);
  if (stores) load_inputs();
  if (seq_len != guess.x || word1 != guess.y) {
    const bool loaded = stores;
    stores = load_target(seq_len, word1);
    if (stores && !loaded) load_inputs();
  }
  if (!stores) return;  // inactive row: writes nothing

  float w[kJ][4], x[kJ][4];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    if (j < kWJ) bits_to_f32(w_bits[j], a.w_bf16, w[j]);
    if constexpr (kRegRow) {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[j][k] = x_reg[4 * j + k];
    } else {
      bits_to_f32(x_bits[j], sizeof(KvT) == 2, x[j]);
    }
  }
  const int64_t loc = a.loc64 ? int64_t((uint64_t(loc_bits.y) << 32) | loc_bits.x)
                              : int64_t(int32_t(loc_bits.x));
  const CacheSlot slot = store_slot_of(loc, a.dcp, a.log2_page_size, a.num_pages);
  constexpr bool kLayoutFormat = store_format_is_layout(kFormat);
  // Negative, another rank's or past the cache: writes nothing. A V4.1 layout's row is encoded
  // whether or not it is stored (its norm and encoding do not wait for the slot).
  const bool writes = slot.page >= 0;
  if (!kLayoutFormat && !writes) return;
  const int64_t off = slot.off;
  uint8_t* page_base = a.cache + slot.page * a.page_bytes;
  constexpr int kLayout = store_format_layout(kFormat);
  uint8_t* data = page_base + (kLayoutFormat ? layout_data_offset(kLayout, off)
                                             : store_data_offset(kFormat, off));
  uint8_t* scales = page_base + (kLayoutFormat ? layout_scale_offset(kLayout, a.page_size, off)
                                               : store_scale_offset(kFormat, a.page_size, off));

  if constexpr (kRowGroups > 1) {
    float y1[1][4];
    store_norm_rope_v41_chunk<KvT>(x, w[0], f, rope_lane, a.eps, chunk, y1);
    low_ratio::encode_store_chunks<layout_encoding(kLayout), 1>(y1, chunk, lane,
                                                                {data, scales}, a.vec_out, writes);
    return;
  }
  float y[kJ][4];
  if constexpr (kLayoutFormat) store_norm_rope_v41<KvT>(x, w, f, rope_lane, a.eps, y);
  else norm_rope<kJ>(x, w, f, rope_lane, a.eps, y);
  if constexpr (kLayoutFormat) {
    // one lane group holds the token's four chunks (0..3)
    low_ratio::encode_store_chunks<layout_encoding(kLayout), kJ>(y, 0, lane, {data, scales},
                                                                 a.vec_out, writes);
  } else if constexpr (kFormat == kStoreFp8DsMla) {
    // bf16-round first; one UE8M0 scale per 64 dims = 16 lanes of one chunk. All chunks'
    // amaxes, exponents and codes first, then the stores: a store between two chunks (its
    // aligned / byte-wise branch) would serialise their shuffle chains. Lane 0 gathers the 7
    // scale bytes and writes them as 4 + 2 + 1 bytes (byte 7 is unused by the format and left
    // untouched, as by the CPU kernel and dsv4_ops.testing.reference.store).
    float am[kJ];
    uint32_t lo[kJ], hi[kJ], ex[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      round_to_bf16_pair(y[j][0], y[j][1]);  // NaNs go to 0x7f codes whatever their payload
      round_to_bf16_pair(y[j][2], y[j][3]);
      am[j] = abs_max4(y[j]);
    }
    subgroup_max<16>(am);
    // Dims 64*group .. 64*group+63: e4m3 codes for groups 0..6, bf16 rope dims for group 7
    // (lanes 16..31 of the last chunk; bf16 rounding is idempotent).
    const auto is_rope = [&](int j) { return 2 * j + lane / 16 >= kDsMlaNopeDim / kDsMlaGroup; };
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      ex[j] = ds_mla_exponent(am[j]);
      if (is_rope(j)) {
        lo[j] = bf16x2_bits(y[j][0], y[j][1]);
        hi[j] = bf16x2_bits(y[j][2], y[j][3]);
      } else {
        lo[j] = e4m3x4_mul(y[j], ue8m0_inv_scale(uint8_t(ex[j])));
      }
    }
    // Scale of group 2j + 1 lives in lane 16 of chunk j.
    const uint32_t e1 = shfl_xor(ex[0], 16), e3 = shfl_xor(ex[1], 16), e5 = shfl_xor(ex[2], 16);
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      if (is_rope(j))  // rope dims 448..511 as bf16 at byte 448 + 2*(dim-448) = 2*dim - 448
        store_u64(data + 2 * lane_dim(j, lane, 0) - kDsMlaNopeDim, lo[j], hi[j], a.vec_out);
      else
        store_u32(data + lane_dim(j, lane, 0), lo[j], a.vec_out);
    }
    if (lane == 0) {
      store_u32(scales, ex[0] | (e1 << 8) | (ex[1] << 16) | (e3 << 24), a.vec_out);
      store_u16(scales + 4, ex[2] | (e5 << 8), a.vec_out);
      scales[6] = uint8_t(ex[3]);
    }
  } else if constexpr (kFormat == kStoreBf16) {
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      store_u64(data + 2 * lane_dim(j, lane, 0), bf16x2_bits(y[j][0], y[j][1]),
                bf16x2_bits(y[j][2], y[j][3]), a.vec_out);
    }
  } else {
    // Indexer (hd 128, one chunk): Walsh-Hadamard, Sylvester order. Index bits 0-1 = k
    // (in-thread), bits 2-6 = lane bits 0-4 (shuffles); stages in bit order 0..6.
    static_assert(kJ == 1, "indexer formats have head_dim 128");
    float* v = y[0];
    hadamard_pair(v[0], v[1]);
    hadamard_pair(v[2], v[3]);
    hadamard_pair(v[0], v[2]);
    hadamard_pair(v[1], v[3]);
#pragma unroll
    for (int m = 1; m < kLaneGroup; m <<= 1) {
      const bool upper = (lane & m) != 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = hadamard_side(v[k], shfl_xor(v[k], m), upper);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] *= kHadamardScale;

    if constexpr (kFormat == kStoreFp8Indexer) {
      const float scale = fp8_indexer_scale(subgroup_max<kLaneGroup>(abs_max4(y[0])));
      store_u32(data + 4 * lane, e4m3x4_div(y[0], scale), a.vec_out);
      if (lane == 0) store_u32(scales, f32_bits(scale), a.vec_out);
    } else {
      static_assert(kFormat == kStoreFp4Indexer, "unknown store format");
      // One UE8M0 scale per 32 dims = 8 lanes.
      const uint8_t e = fp4_exponent(subgroup_max<8>(abs_max4(y[0])));
      const float s = ue8m0_inv_scale(e);
      const uint32_t b0 = uint32_t(fp4_code(v[0], s)) | (uint32_t(fp4_code(v[1], s)) << 4);
      const uint32_t b1 = uint32_t(fp4_code(v[2], s)) | (uint32_t(fp4_code(v[3], s)) << 4);
      store_u16(data + 2 * lane, b0 | (b1 << 8), a.vec_out);
      if (lane % 8 == 0) scales[lane / 8] = e;
    }
  }
}

// The fused kernels' store step: rows first .. first + rows - 1, one 32-lane group each, after
// the block barrier that follows their pooling.
template <int kFormat, typename KvT>
DSV4_DEVICE void store_block_rows(const StoreKernelArgs& a, int64_t first, int rows) {
  const int g = int(threadIdx.x) / kLaneGroup;
  if (g < rows) store_row<kFormat, KvT, false>(a, first + g, int(threadIdx.x) % kLaneGroup);
}

// kRowGroups lane groups a token (1, or 4 for a V4.1 layout's launch of few rows: launch_store).
template <int kFormat, typename KvT, int kRowGroups = 1>
__global__ void __launch_bounds__(kStoreMaxBlockThreads, store_min_blocks(kFormat))
    compress_norm_rope_store_kernel(StoreKernelArgs a) {
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t group =
      int64_t(blockIdx.x) * (blockDim.x / kLaneGroup) + threadIdx.x / kLaneGroup;
  store_row<kFormat, KvT, true, false, kRowGroups>(a, group / kRowGroups, lane, nullptr,
                                                   int(group % kRowGroups));
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
