// compress_norm_rope_store, CPU backend: the same per-value math as the GPU kernel
// (store_math.h), one token at a time over at::parallel_for. The sum of squares follows the
// GPU's reduction order (store_math.h), so CPU and GPU caches agree bit for bit.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "low_ratio/low_ratio_rows_cpu.h"
#include "store/store_checks.h"
#include "store/store_cpu.h"

namespace dsv4 {
namespace {

inline float load_f32(const void* p, bool bf16, int64_t i) {
  return bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

inline void put_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}

struct CpuStoreArgs {
  const void* kv;
  bool kv_bf16;
  const uint8_t* plan;
  const void* norm_weight;
  bool w_bf16;
  const float* freqs;
  const void* out_loc;
  bool loc64;
  uint8_t* cache;
  float eps;
  bool is_decode;
  int compress_ratio;
  LayoutCacheRef layout_cache;  // the V4.1 layouts of fp8_ds_mla
};

// Whether plan row t stores a token, and its out_loc index and rope position.
bool row_target(const StoreGeometry& g, const CpuStoreArgs& a, int64_t t, int64_t* loc_index,
                int64_t* pos) {
  const uint8_t* rec = a.plan + t * 16;
  uint32_t seq_len, word1;
  std::memcpy(&seq_len, rec, 4);
  std::memcpy(&word1, rec + 4, 4);
  return store_row_target(seq_len, int32_t(word1), a.is_decode, a.compress_ratio, t,
                          g.num_out_loc, g.max_pos, loc_index, pos);
}

// Normalise, rotate, (Hadamard) and store token t. Returns without writing for inactive rows.
void store_token(const StoreGeometry& g, const CpuStoreArgs& a, int64_t t) {
  int64_t loc_index = 0, pos = 0;
  if (!row_target(g, a, t, &loc_index, &pos)) return;
  const int64_t loc = a.loc64 ? static_cast<const int64_t*>(a.out_loc)[loc_index]
                              : int64_t(static_cast<const int32_t*>(a.out_loc)[loc_index]);
  const CacheSlot slot = store_slot_of(loc, g.dcp, g.log2_page_size, g.num_pages);
  if (slot.page < 0) return;

  const int hd = g.head_dim;
  float x[512], y[512];
  for (int d = 0; d < hd; ++d) x[d] = load_f32(a.kv, a.kv_bf16, t * hd + d);

  // RMSNorm with the GPU's order (row_sumsq): the 512-dim V4.0 stores sum in the reference
  // engine's block order, hd 128 and the V4.1 layouts in the lane order.
  const float inv = g.layout == kLayoutV4 && hd == 512 ? rms_inv(block_order_sumsq(x), hd, a.eps)
                                                       : lane_order_rms_inv(x, hd, a.eps);
  if (g.layout != kLayoutV4) {
    // V4.1 layouts (contract V4.1 4.2): the weight, the normed value and the rotated values
    // rounded to kv's dtype, then the layout's encoding of all 512 dims (no fake quant).
    for (int d = 0; d < hd; ++d) {
      float w = load_f32(a.norm_weight, a.w_bf16, d);
      if (a.kv_bf16) w = round_to_bf16(w);
      y[d] = norm_value(x[d], inv, w);
      if (a.kv_bf16) y[d] = round_to_bf16(y[d]);
    }
    rope_tail(y, hd - kRopeDim, a.freqs + pos * kRopeDim, a.kv_bf16);
    a.layout_cache.store_at(slot, y);
    return;
  }
  for (int d = 0; d < hd; ++d) y[d] = norm_value(x[d], inv, load_f32(a.norm_weight, a.w_bf16, d));

  rope_tail(y, hd - kRopeDim, a.freqs + pos * kRopeDim, false);

  if (hd == 128) {  // Walsh-Hadamard, stages in bit order 0..6, then the 1/sqrt(128) scale
    for (int bit = 1; bit < 128; bit <<= 1)
      for (int i = 0; i < 128; ++i)
        if ((i & bit) == 0) hadamard_pair(y[i], y[i | bit]);
    for (int i = 0; i < 128; ++i) y[i] *= kHadamardScale;
  }

  uint8_t* base = a.cache + slot.page * g.page_bytes;
  uint8_t* data = base + store_data_offset(g.format, slot.off);
  uint8_t* scales = base + store_scale_offset(g.format, g.page_size, slot.off);

  switch (g.format) {
    case kStoreFp8DsMla:
      for (int d = 0; d < hd; ++d) y[d] = round_to_bf16(y[d]);
      encode_layout_row(y, kLayoutV4, data, scales);
      break;
    case kStoreBf16:
      for (int d = 0; d < hd; ++d) put_u16(data + 2 * d, f32_to_bf16(y[d]));
      break;
    case kStoreFp8Indexer: {
      const float scale = fp8_indexer_scale(abs_max(y, hd));
      for (int d = 0; d < hd; ++d) data[d] = fp8_indexer_code(y[d], scale);
      const uint32_t bits = f32_bits(scale);
      for (int i = 0; i < 4; ++i) scales[i] = uint8_t(bits >> (8 * i));
      break;
    }
    default: {  // kStoreFp4Indexer
      for (int grp = 0; grp < hd / kFp4Group; ++grp) {
        const uint8_t e = fp4_exponent(abs_max(y + grp * kFp4Group, kFp4Group));
        const float s = ue8m0_inv_scale(e);
        for (int d = grp * kFp4Group; d < (grp + 1) * kFp4Group; d += 2)
          data[d / 2] = uint8_t(fp4_code(y[d], s) | (fp4_code(y[d + 1], s) << 4));
        scales[grp] = e;
      }
      break;
    }
  }
}

}  // namespace

void compress_norm_rope_store_cpu(const at::Tensor& kv, const at::Tensor& plan,
                                  const at::Tensor& norm_weight, const at::Tensor& freqs,
                                  const at::Tensor& out_loc, at::Tensor& kvcache, bool is_decode,
                                  int64_t compress_ratio, double eps, int64_t page_size,
                                  c10::string_view store_format, c10::string_view layout,
                                  int64_t dcp_world_size, int64_t dcp_rank,
                                  int64_t dcp_interleave) {
  const StoreGeometry g = check_store_args(kv, plan, norm_weight, freqs, out_loc, kvcache,
                                           compress_ratio, page_size, store_format, layout,
                                           {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  check_store_eps(eps);
  if (g.n_rows == 0 || g.num_pages == 0) return;
  CpuStoreArgs a;
  a.kv = kv.data_ptr();
  a.kv_bf16 = kv.scalar_type() == at::kBFloat16;
  a.plan = plan.data_ptr<uint8_t>();
  a.norm_weight = norm_weight.data_ptr();
  a.w_bf16 = norm_weight.scalar_type() == at::kBFloat16;
  a.freqs = freqs.data_ptr<float>();
  a.out_loc = out_loc.data_ptr();
  a.loc64 = out_loc.scalar_type() == at::kLong;
  a.cache = static_cast<uint8_t*>(kvcache.data_ptr());
  a.eps = float(eps);
  a.is_decode = is_decode;
  a.compress_ratio = int(compress_ratio);
  a.layout_cache.base = static_cast<uint8_t*>(kvcache.data_ptr());
  a.layout_cache.layout = g.layout;
  a.layout_cache.num_pages = g.num_pages;
  a.layout_cache.page_bytes = g.page_bytes;
  a.layout_cache.page_size = g.page_size;
  a.layout_cache.log2_page_size = g.log2_page_size;
  // A padded (CUDA-graph) prefill plan ends in rows that store nothing. The threads split the
  // rows up to the last one that stores, so that each gets its share of the real work (static
  // chunks of all num_q rows left the valid quarter of a cr 4 plan to a quarter of them).
  int64_t rows = g.n_rows;
  for (int64_t li = 0, pi = 0; rows > 0 && !row_target(g, a, rows - 1, &li, &pi);) --rows;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) store_token(g, a, t);
  });
}

}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("compress_norm_rope_store", &dsv4::compress_norm_rope_store_cpu);
}
