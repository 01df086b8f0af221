// The store step of the fused hd 512 decode kernels for the V4.0 formats (fp8_ds_mla, bf16),
// shared by CUDA and HIP: the 128 pooling threads of a row store it from their registers, with
// no rows-buffer round trip and no idle warps (docs/design/fused.md).
//
// Thread u (0..127) holds dims 4u..4u+3 of the row: lane u % 32 of chunk u / 32 in store_row's
// lane layout (store/store_kernel.cuh), so every per-value operation is store_row's. The sum of
// squares keeps row_sumsq's order: each 16-lane half forms its warp sum with the same shuffle
// tree, the 8 warp sums meet in shared memory and every thread adds them in row_sumsq's final
// order. Max reductions are exact. The bytes are therefore compress_norm_rope_store's.
//
// spread_target (before the pooling, so that its loads share the pooling's round trips) and
// store_spread_row (after it; a block barrier, reached by every thread of the block).
#pragma once

#include "../compress/vec.cuh"
#include "../store/store_kernel.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

constexpr int kSpreadThreads = 128;  // threads of one row: 512 dims, 4 a thread
constexpr int kSpreadWarpSums = 8;   // row_sumsq's warp sums: 64 dims each

DSV4_HD constexpr bool store_format_spreads(int format) {
  return format == kStoreFp8DsMla || format == kStoreBf16;
}
// Whether the fused kernels store a row of this format from its pooling threads' registers
// (the spread rows, and hd 128 rows by their pooling lane groups): the rows buffer is then
// written only for a caller's `out` (Params::out null otherwise).
DSV4_HD constexpr bool stores_from_registers(int format) {
  return store_format_spreads(format) || store_kernel_head_dim(format) == 4 * kLaneGroup;
}

// Row t's destination (out_loc entry as loaded), the rope pair of thread u (its last 16
// threads) and its norm weights, as raw bits; stores false: the row writes nothing.
struct SpreadTarget {
  bool stores;
  uint2 loc_bits;
  float f[4];
  uint32_t w_bits[4];
};

DSV4_DEVICE SpreadTarget spread_target(const StoreKernelArgs& a, int64_t t, int u) {
  using namespace store_detail;
  SpreadTarget s{false, make_uint2(0xffffffffu, 0xffffffffu), {1.0f, 0.0f, 1.0f, 0.0f},
                 {0u, 0u, 0u, 0u}};
  if (t >= a.n_rows) return s;
  const uint2 head = plan_head(a, t);
  int64_t loc_index = 0, pos = 0;
  if (!store_row_target(head.x, int32_t(head.y), a.is_decode, a.compress_ratio, t, a.num_out_loc,
                        a.max_pos, &loc_index, &pos))
    return s;
  s.stores = true;
  if (a.loc64) s.loc_bits = static_cast<const uint2*>(a.out_loc)[loc_index];
  else s.loc_bits.x = static_cast<const uint32_t*>(a.out_loc)[loc_index];
  constexpr int kRopeFirst = kSpreadThreads - kRopeDim / 4;  // threads of dims 448..511
  if (u >= kRopeFirst) load4(a.freqs + pos * kRopeDim + 4 * (u - kRopeFirst), a.vec_in, s.f);
  if (a.w_bf16)
    load_bits(static_cast<const uint16_t*>(a.norm_weight) + 4 * u, a.vec_in, s.w_bits);
  else
    load_bits(static_cast<const float*>(a.norm_weight) + 4 * u, a.vec_in, s.w_bits);
  return s;
}

// v as the pair's rows buffer of type TO holds it (bf16: RNE and back).
template <typename TO>
DSV4_DEVICE void as_rows_buffer(const float (&v)[4], float (&x)[4]) {
  if constexpr (std::is_same<TO, float>::value) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = v[k];
  } else {
    compress::unpack(compress::pack(v, static_cast<const uint16_t*>(nullptr)), x);
  }
}

// Thread u's dims of row x (every thread of the block calls it: the barrier); warp_sums: 8
// floats of shared memory for this row.
template <int kFormat>
DSV4_DEVICE void store_spread_row(const StoreKernelArgs& a, const SpreadTarget& s,
                                  const float (&x)[4], int u, float* warp_sums) {
  using namespace store_detail;
  static_assert(store_format_spreads(kFormat), "a 512-dim V4.0 format");
  const int lane = u % kLaneGroup;
  // row_sumsq: the pair leaves, the lane-mask 8..1 trees, then the two pairs of the lane.
  float p0 = pair_sumsq(x[0], x[1]), p1 = pair_sumsq(x[2], x[3]);
#pragma unroll
  for (int m = kLaneGroup / 4; m > 0; m >>= 1) {
    p0 += shfl_xor(p0, m);
    p1 += shfl_xor(p1, m);
  }
  if (lane % (kLaneGroup / 2) == 0) warp_sums[u / (kLaneGroup / 2)] = p0 + p1;
  __syncthreads();
  if (!s.stores) return;
  float ws[kSpreadWarpSums];
#pragma unroll
  for (int i = 0; i < kSpreadWarpSums; ++i) ws[i] = warp_sums[i];
  const float sumsq = ((ws[0] + ws[4]) + (ws[2] + ws[6])) + ((ws[1] + ws[5]) + (ws[3] + ws[7]));
  const float inv = rms_inv(sumsq, kSpreadThreads * 4, a.eps);

  float w[4], y[4];
  bits_to_f32(s.w_bits, a.w_bf16, w);
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = norm_value(x[k], inv, w[k]);
  const bool rope = u >= kSpreadThreads - kRopeDim / 4;
  if (rope) {
    rope_pair(y[0], y[1], s.f[0], s.f[1]);
    rope_pair(y[2], y[3], s.f[2], s.f[3]);
  }
  const int64_t loc = a.loc64 ? int64_t((uint64_t(s.loc_bits.y) << 32) | s.loc_bits.x)
                              : int64_t(int32_t(s.loc_bits.x));
  const CacheSlot slot = store_slot_of(loc, a.dcp, a.log2_page_size, a.num_pages);
  if (slot.page < 0) return;  // negative, another rank's or past the cache: writes nothing
  uint8_t* page_base = a.cache + slot.page * a.page_bytes;
  uint8_t* data = page_base + store_data_offset(kFormat, slot.off);
  const int dim = 4 * u;
  if constexpr (kFormat == kStoreFp8DsMla) {
    // store_row's fp8_ds_mla block for one chunk's lane: a 64-dim group is 16 threads.
    round_to_bf16_pair(y[0], y[1]);
    round_to_bf16_pair(y[2], y[3]);
    const uint32_t ex = ds_mla_exponent(subgroup_max<kDsMlaGroup / 4>(abs_max4(y)));
    if (rope) {
      store_u64(data + 2 * dim - kDsMlaNopeDim, bf16x2_bits(y[0], y[1]), bf16x2_bits(y[2], y[3]),
                a.vec_out);
    } else {
      store_u32(data + dim, e4m3x4_mul(y, ue8m0_inv_scale(uint8_t(ex))), a.vec_out);
      if (lane % (kDsMlaGroup / 4) == 0)  // scale bytes 0..6 (byte 7 is left untouched)
        page_base[store_scale_offset(kFormat, a.page_size, slot.off) + dim / kDsMlaGroup] =
            uint8_t(ex);
    }
  } else {
    store_u64(data + 2 * dim, bf16x2_bits(y[0], y[1]), bf16x2_bits(y[2], y[3]), a.vec_out);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
