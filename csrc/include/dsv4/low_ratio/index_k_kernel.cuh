// low_ratio_index_k_store GPU kernel (docs/contract.md, "V4.1" 1.8), shared by CUDA and HIP: the
// low-ratio indexer keys. One 32-lane group per 128-dim row (lane l holds dims 4l .. 4l+3),
// several rows per block; rows with loc <= 0 write nothing.
//   y = bf16(norm), dims 64..127 (lanes 16..31) rotated at group_position(pos, ratio) and
//   rounded to bf16; stage 1 fake quant and stage 2 codes per 32 dims (8 lanes); 64 code bytes
//   at page * 68ps + off * 64, 4 exponent bytes at page * 68ps + 64ps + off * 4.
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct IndexKKernelArgs {
  const uint16_t* k;        // [n_rows, 128] bf16 bits
  const void* norm_weight;  // [128] bf16 bits (w_bf16) or fp32
  const float* freqs;       // [max_pos, 64] (cos, sin) pairs
  const void* positions;    // [n_rows] int32 (pos64 false) or int64
  const void* loc;          // [n_rows] int32 (loc64 false) or int64
  uint8_t* cache;           // num_pages pages of page_bytes (>= 68 * page_size)
  int64_t n_rows;
  int64_t max_pos;
  int64_t num_pages;
  int64_t page_bytes;
  int64_t page_size;
  Dcp dcp;  // the cache entries this rank stores (contract 9)
  int log2_page_size;
  int ratio;
  float eps;
  bool w_bf16;
  bool pos64;
  bool loc64;
  bool vec_in;   // k, norm_weight and freqs 16-byte aligned
  bool vec_out;  // cache and page_bytes 2-byte aligned
};

template <int kRatio>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    low_ratio_index_k_store_kernel(IndexKKernelArgs a) {
  using namespace low_ratio;
  using namespace store_detail;
  constexpr int kLanes = kIndexKBlock / 4;  // lanes per scale
  int lane;
  const int64_t t = group_row(&lane);
  pdl_wait();
  pdl_trigger();
  if (t >= a.n_rows) return;
  const int64_t loc = load_index(a.loc, a.loc64, t);
  const int64_t p = group_position(load_index(a.positions, a.pos64, t), kRatio);
  if (loc <= 0 || p < 0 || p >= a.max_pos) return;
  const CacheSlot slot = store_slot_of(loc, a.dcp, a.log2_page_size, a.num_pages);
  if (slot.page < 0) return;
  const int64_t off = slot.off;

  uint32_t xb[4], wb[4];
  float x[4], w[4], f[4];
  load_bits(a.k + t * kIndexKDim + 4 * lane, a.vec_in, xb);
  if (a.w_bf16) load_bits(static_cast<const uint16_t*>(a.norm_weight) + 4 * lane, a.vec_in, wb);
  else load_bits(static_cast<const float*>(a.norm_weight) + 4 * lane, a.vec_in, wb);
  load_rope_pairs(a.freqs + p * kRopeDim, lane, rope_lane(lane), a.vec_in, f);
  bits_to_f32(xb, true, x);
  bits_to_f32(wb, a.w_bf16, w);

  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[k]);
  const float inv = rms_inv(group_sum(acc), kIndexKDim, a.eps);
  float y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = round_to_bf16(norm_value(x[k], inv, w[k]));
  if (rope_lane(lane)) {  // dims 64..127: pairs 2(l - 16), +1 of the group position's row
    rope_pair(y[0], y[1], f[0], f[1]);
    rope_pair(y[2], y[3], f[2], f[3]);
#pragma unroll
    for (int k = 0; k < 4; ++k) y[k] = round_to_bf16(y[k]);
  }
  // Stage 1: fake quant; stage 2: exponent and codes of the stage-1 values.
  const float sc = index_k_stage1_scale(subgroup_max<kLanes>(abs_max4(y)));
  float q[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) q[k] = index_k_stage1_value(y[k], sc);
  const uint8_t e = index_k_exponent(subgroup_max<kLanes>(abs_max4(q)));
  const float s = ue8m0_inv_scale(e);
  const uint32_t b0 = uint32_t(index_k_code(q[0], s)) | (uint32_t(index_k_code(q[1], s)) << 4);
  const uint32_t b1 = uint32_t(index_k_code(q[2], s)) | (uint32_t(index_k_code(q[3], s)) << 4);
  uint8_t* base = a.cache + slot.page * a.page_bytes;
  store_u16(base + off * kIndexKDataBytes + 2 * lane, b0 | (b1 << 8), a.vec_out);
  if (lane % kLanes == 0)
    base[a.page_size * kIndexKDataBytes + off * kIndexKScaleBytes + lane / kLanes] = e;
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
