// CPU per-row building blocks of the V4.1 stores (contract V4.1 1.4 - 1.8, 3), shared by
// low_ratio_cpu.cpp and the V4.1 layouts of compress_norm_rope_store (store_cpu.cpp): the
// lane-order RMS statistics, the RoPE tail, the fp4 fake quant, and the encoding of 512 values
// into a cache layout at a slot. Built only from the per-value functions of low_ratio_math.h /
// store_math.h, so the bytes equal the GPU kernels'.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "include/dsv4/kv_layout.h"
#include "include/dsv4/low_ratio_math.h"
#include "include/dsv4/store_math.h"

namespace dsv4 {

// rsqrt(mean(x^2) + eps) over hd (128 or 512) values, summed as a one-lane-group GPU kernel
// does (index-K; compress_norm_rope_store's 128-dim rows and V4.1 layouts): per lane over
// (j, k) in the lane layout, then the xor-butterfly tree.
inline float lane_order_rms_inv(const float* x, int hd, float eps) {
  float partial[kLaneGroup];
  for (int l = 0; l < kLaneGroup; ++l) {
    float acc = 0.0f;
    for (int j = 0; j < hd / 128; ++j)
      for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[lane_dim(j, l, k)]);
    partial[l] = acc;
  }
  return rms_inv(lane_tree_sum(partial), hd, eps);
}

inline float abs_max(const float* v, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fabs(v[i]) > amax ? std::fabs(v[i]) : amax;
  return amax;
}

// Rotates the 64 dims from `first` by the freqs row f (cos, sin pairs); bf16_round: round each
// rotated value to bf16 (the rounding boundary of contract V4.1 1.5).
inline void rope_tail(float* v, int first, const float* f, bool bf16_round) {
  for (int i = 0; i < kRopeDim / 2; ++i) {
    float& re = v[first + 2 * i];
    float& im = v[first + 2 * i + 1];
    rope_pair(re, im, f[2 * i], f[2 * i + 1]);
    if (bf16_round) {
      re = round_to_bf16(re);
      im = round_to_bf16(im);
    }
  }
}

// The fp4 fake quant of a rotated 512-dim row, in place (contract V4.1 1.6).
inline void fake_quant_row(float* v) {
  for (int b = 0; b < kLowRatioHeadDim; b += kFakeQuantBlock) {
    const TileDivisor s = tile_divisor(fake_quant_scale(abs_max(v + b, kFakeQuantBlock)));
    for (int d = b; d < b + kFakeQuantBlock; ++d) v[d] = fake_quant_value(v[d], s);
  }
}

// The 512 values v in the row encoding of `layout` (contract V4.1 3.2 - 3.4): data and scale
// bytes of one token (V4: scale byte 7 untouched).
inline void encode_layout_row(const float* v, int layout, uint8_t* data, uint8_t* scales) {
  switch (layout_encoding(layout)) {
    case kLayoutV4:
      for (int g = 0; g < kDsMlaNopeDim / kDsMlaGroup; ++g) {
        const float* x = v + g * kDsMlaGroup;
        const uint8_t e = ds_mla_exponent(abs_max(x, kDsMlaGroup));
        const float inv = ue8m0_inv_scale(e);
        for (int d = 0; d < kDsMlaGroup; ++d) data[g * kDsMlaGroup + d] = ds_mla_code(x[d], inv);
        scales[g] = e;
      }
      for (int d = kDsMlaNopeDim; d < kLowRatioHeadDim; ++d) {
        const uint16_t h = f32_to_bf16(v[d]);
        data[2 * d - kDsMlaNopeDim] = uint8_t(h);
        data[2 * d - kDsMlaNopeDim + 1] = uint8_t(h >> 8);
      }
      break;
    case kLayoutV41: {
      const int tile = layout_tile(kLayoutV41);
      for (int g = 0; g < kLowRatioHeadDim / tile; ++g) {
        const float* x = v + g * tile;
        const uint8_t e = v41_exponent(abs_max(x, tile));
        const float inv = ue8m0_inv_scale(e);
        for (int d = 0; d < tile; ++d) data[g * tile + d] = v41_code(x[d], inv);
        scales[g] = e;
      }
      break;
    }
    case kLayoutV41Fp4: {
      const int tile = layout_tile(kLayoutV41Fp4);
      for (int g = 0; g < kLowRatioHeadDim / tile; ++g) {
        const float* x = v + g * tile;
        const uint8_t b = v41_fp4_scale_byte(abs_max(x, tile));
        const TileDivisor s = tile_divisor(e4m3_value(b));
        for (int d = 0; d < tile; d += 2)  // dim 2k in the low nibble of byte k
          data[(g * tile + d) / 2] =
              uint8_t(v41_fp4_code(x[d], s) | (v41_fp4_code(x[d + 1], s) << 4));
        scales[g] = b;
      }
      break;
    }
    default:  // kLayoutUniformFp8
      for (int d = 0; d < kLowRatioHeadDim; ++d) data[d] = uniform_fp8_code(v[d]);
      break;
  }
}

// A paged cache of one layout: where global entry g's bytes are on this rank.
struct LayoutCacheRef {
  uint8_t* base = nullptr;
  int layout = kLayoutV4;
  int64_t num_pages = 0;
  int64_t page_bytes = 0;  // actual page stride
  int64_t page_size = 0;
  int log2_page_size = 0;
  Dcp dcp;  // the entries this rank stores (contract 9)

  // Data and scale bytes of a resolved slot; false when it writes nothing (page -1).
  bool at(const CacheSlot& s, uint8_t** data, uint8_t** scales) const {
    if (s.page < 0) return false;
    uint8_t* p = base + s.page * page_bytes;
    *data = p + layout_data_offset(layout, s.off);
    *scales = p + layout_scale_offset(layout, page_size, s.off);
    return true;
  }
  // Encodes v at a resolved slot (store_slot_of; nothing where it writes nothing: negative,
  // another rank's or past the cache).
  void store_at(const CacheSlot& s, const float* v) const {
    uint8_t *data, *scales;
    if (at(s, &data, &scales)) encode_layout_row(v, layout, data, scales);
  }
};

// A ratio-1/2 latent row (bf16 [512]) into the cache at slot loc, RoPE at freqs row f
// (contract V4.1 1.5 - 1.7): rotate and round to bf16, fp4 fake quant for the fp8-style
// layouts, encode.
inline void store_latent_row(const LayoutCacheRef& cache, int64_t loc, const uint16_t* latent,
                             const float* f) {
  const CacheSlot slot = store_slot_of(loc, cache.dcp, cache.log2_page_size, cache.num_pages);
  if (slot.page < 0) return;
  float v[kLowRatioHeadDim];
  for (int d = 0; d < kLowRatioHeadDim; ++d) v[d] = bf16_to_f32(latent[d]);
  rope_tail(v, kLowRatioHeadDim - kRopeDim, f, true);
  if (layout_fake_quantises(cache.layout)) fake_quant_row(v);
  cache.store_at(slot, v);
}

// Element d of a norm weight, bf16 or fp32, as float.
inline float weight_at(const void* w, bool w_bf16, int d) {
  return w_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(w)[d]) : static_cast<const float*>(w)[d];
}

// latent[c] = bf16(norm_value(x[c], inv, w[c])) of 512 values x, the sum in latent_sumsq's
// order (contract V4.1 1.4).
inline void latent_row(const float* x, const void* w, bool w_bf16, float eps, uint16_t* latent) {
  const float inv = rms_inv(latent_sumsq(x), kLowRatioHeadDim, eps);
  for (int d = 0; d < kLowRatioHeadDim; ++d)
    latent[d] = f32_to_bf16(norm_value(x[d], inv, weight_at(w, w_bf16, d)));
}

}  // namespace dsv4
