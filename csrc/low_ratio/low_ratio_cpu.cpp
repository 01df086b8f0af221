// The V4.1 ratio-1 / ratio-2 ops, CPU backend (contract V4.1 1 - 3): rows over
// at::parallel_for, each with the per-row code of low_ratio_rows_cpu.h (the GPU kernels' lane
// order and per-value math, so both backends write the same bits).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "low_ratio/low_ratio_checks.h"
#include "low_ratio/low_ratio_rows_cpu.h"

namespace dsv4 {
namespace {

constexpr int64_t kRowGrain = 16;

inline int64_t load_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}

inline LayoutCacheRef layout_cache(const at::Tensor& kvcache, const LowRatioGeometry& g) {
  LayoutCacheRef c;
  c.base = static_cast<uint8_t*>(kvcache.data_ptr());
  c.layout = g.layout;
  c.num_pages = g.num_pages;
  c.page_bytes = g.page_bytes;
  c.page_size = g.page_size;
  c.log2_page_size = g.log2_page_size;
  c.dcp = g.dcp;
  return c;
}

// The freqs row of RoPE position p, or null when p is outside the table.
inline const float* freqs_row(const float* freqs, int64_t max_pos, int64_t p) {
  return p >= 0 && p < max_pos ? freqs + p * kRopeDim : nullptr;
}

// ---- ratio 2: pooling, latent and store of one odd row ---------------------------------------

struct C2Rows {
  const float* kv_score;
  float* state;
  const void* norm_weight;
  const float* freqs;
  const void* positions;
  const void* req;
  const void* raw_out_loc;
  uint16_t* latent;
  LayoutCacheRef cache;
  LowRatioGeometry g;
  float eps;

  int64_t pos(int64_t t) const { return load_index(positions, g.pos64, t); }
  int64_t rid(int64_t t) const { return load_index(req, g.req64, t); }
  int64_t raw(int64_t t) const { return load_index(raw_out_loc, g.loc64, t); }
  const float* row(int64_t t) const { return kv_score + t * kPairRowWidth; }
  // The pair-state ring row of (rid, p), or null outside state.
  float* ring_row(int64_t rid, int64_t p) const {
    if (rid < 0) return nullptr;
    const int64_t slot = rid * g.ring_size + ((p % g.ring_size) + g.ring_size) % g.ring_size;
    return slot < g.state_rows ? state + slot * kPairRowWidth : nullptr;
  }
  void park(int64_t t) const {
    float* dst = ring_row(rid(t), pos(t));
    if (dst != nullptr) std::memcpy(dst, row(t), kPairRowWidth * sizeof(float));
  }
  // Odd row t pooled with `partner` (kv | score): its latent, then the cache at raw >> 1 with
  // RoPE at pos - 1 (contract V4.1 1.2 - 1.7).
  void close_pair(int64_t t, const float* partner) const {
    const float* odd = row(t);
    float x[kLowRatioHeadDim];
    for (int c = 0; c < kLowRatioHeadDim; ++c)
      x[c] = round_to_bf16(pair_pool(partner[c], partner[kLowRatioHeadDim + c], odd[c],
                                     odd[kLowRatioHeadDim + c]));
    uint16_t* lat = latent + t * kLowRatioHeadDim;
    latent_row(x, norm_weight, g.w_bf16, eps, lat);
    const int64_t loc = raw(t) >> 1;
    const float* f = freqs_row(freqs, g.max_pos, pos(t) - 1);
    if (loc > 0 && f != nullptr) store_latent_row(cache, loc, lat, f);
  }
};

C2Rows c2_rows(const LowRatioGeometry& g, const at::Tensor& kv_score, at::Tensor& state,
               const at::Tensor& norm_weight, double eps, const at::Tensor& freqs,
               const at::Tensor& positions, const at::Tensor& req, const at::Tensor& raw_out_loc,
               at::Tensor& kvcache, at::Tensor& latent) {
  C2Rows r;
  r.kv_score = kv_score.data_ptr<float>();
  r.state = state.data_ptr<float>();
  r.norm_weight = norm_weight.data_ptr();
  r.freqs = freqs.data_ptr<float>();
  r.positions = positions.data_ptr();
  r.req = req.data_ptr();
  r.raw_out_loc = raw_out_loc.data_ptr();
  r.latent = reinterpret_cast<uint16_t*>(latent.data_ptr());
  r.cache = layout_cache(kvcache, g);
  r.g = g;
  r.eps = float(eps);
  return r;
}

// One index key (bf16 [128]) into slot `off` of its index-K page (contract V4.1 1.8): RMSNorm
// rounded to bf16, RoPE of dims 64..127 by f rounded to bf16, then per 32 dims the stage-1
// fake quant and the stage-2 packer (codes at off * 64, exponents at 64 * ps + off * 4).
void index_k_row(const uint16_t* k, const void* w, bool w_bf16, float eps, const float* f,
                 uint8_t* page, int64_t off, int64_t page_size) {
  float y[kIndexKDim];
  for (int d = 0; d < kIndexKDim; ++d) y[d] = bf16_to_f32(k[d]);
  const float inv = lane_order_rms_inv(y, kIndexKDim, eps);
  for (int d = 0; d < kIndexKDim; ++d)
    y[d] = round_to_bf16(norm_value(y[d], inv, weight_at(w, w_bf16, d)));
  rope_tail(y, kIndexKDim - kRopeDim, f, true);
  uint8_t* codes = page + off * kIndexKDataBytes;
  uint8_t* exps = page + page_size * kIndexKDataBytes + off * kIndexKScaleBytes;
  for (int b = 0; b < kIndexKDim / kIndexKBlock; ++b) {
    float* q = y + b * kIndexKBlock;
    const float sc = index_k_stage1_scale(abs_max(q, kIndexKBlock));
    for (int d = 0; d < kIndexKBlock; ++d) q[d] = index_k_stage1_value(q[d], sc);
    const uint8_t e = index_k_exponent(abs_max(q, kIndexKBlock));
    const float inv_e = ue8m0_inv_scale(e);
    for (int d = 0; d < kIndexKBlock; d += 2)
      codes[(b * kIndexKBlock + d) / 2] =
          uint8_t(index_k_code(q[d], inv_e) | (index_k_code(q[d + 1], inv_e) << 4));
    exps[b] = e;
  }
}

void c1_norm_rope_store_cpu(const at::Tensor& kv, const at::Tensor& norm_weight, double eps,
                            const at::Tensor& freqs, const at::Tensor& positions,
                            const at::Tensor& out_loc, at::Tensor& kvcache, int64_t page_size,
                            c10::string_view layout, at::Tensor& latent,
                            int64_t dcp_world_size, int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_c1_args(kv, norm_weight, eps, freqs, positions, out_loc, kvcache, page_size, layout,
                    latent, {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  const auto* x_rows = reinterpret_cast<const uint16_t*>(kv.data_ptr());
  const void* w = norm_weight.data_ptr();
  const float* fr = freqs.data_ptr<float>();
  const void* pos = positions.data_ptr();
  const void* loc = out_loc.data_ptr();
  auto* lat = reinterpret_cast<uint16_t*>(latent.data_ptr());
  const LayoutCacheRef cache = layout_cache(kvcache, g);
  at::parallel_for(0, g.n_rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float x[kLowRatioHeadDim];
      for (int d = 0; d < kLowRatioHeadDim; ++d)
        x[d] = bf16_to_f32(x_rows[t * kLowRatioHeadDim + d]);
      uint16_t* row = lat + t * kLowRatioHeadDim;
      latent_row(x, w, g.w_bf16, float(eps), row);  // every row, padded ones too
      const int64_t l = load_index(loc, g.loc64, t);
      const float* f = freqs_row(fr, g.max_pos, load_index(pos, g.pos64, t));
      if (l > 0 && f != nullptr) store_latent_row(cache, l, row, f);
    }
  });
}

void c2_norm_rope_store_cpu(const at::Tensor& kv_score, at::Tensor& state,
                            const at::Tensor& norm_weight, double eps, const at::Tensor& freqs,
                            const at::Tensor& positions, const at::Tensor& req,
                            const at::Tensor& raw_out_loc, at::Tensor& kvcache,
                            int64_t page_size, int64_t ring_size, int64_t draft_len,
                            c10::string_view layout, at::Tensor& latent,
                            int64_t dcp_world_size, int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g = check_c2_args(
      kC2Op, kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, kvcache,
      page_size, ring_size, draft_len, layout, latent,
      {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  const C2Rows r = c2_rows(g, kv_score, state, norm_weight, eps, freqs, positions, req,
                           raw_out_loc, kvcache, latent);
  // Rows are independent: with ring > draft_len no park of a block lands on the slot its
  // head reads (contract V4.1 2.5), and different requests own different ring rows.
  at::parallel_for(0, g.n_rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (r.raw(t) <= 0) continue;  // padded
      const int64_t p = r.pos(t);
      if ((p & 1) == 0) {
        r.park(t);
        continue;
      }
      const bool in_block = g.draft_len > 1 && t % g.draft_len != 0;
      const float* partner = in_block ? r.row(t - 1) : r.ring_row(r.rid(t), p - 1);
      if (partner != nullptr) r.close_pair(t, partner);
    }
  });
}

void c2_prefill_norm_rope_store_cpu(const at::Tensor& kv_score, at::Tensor& state,
                                    const at::Tensor& norm_weight, double eps,
                                    const at::Tensor& freqs, const at::Tensor& positions,
                                    const at::Tensor& req, const at::Tensor& raw_out_loc,
                                    const at::Tensor& extend_start_loc,
                                    const at::Tensor& extend_seq_lens, at::Tensor& kvcache,
                                    int64_t page_size, int64_t ring_size,
                                    c10::string_view layout, at::Tensor& latent,
                                    int64_t dcp_world_size, int64_t dcp_rank,
                                    int64_t dcp_interleave) {
  const LowRatioGeometry g = check_c2_prefill_args(
      kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, extend_start_loc,
      extend_seq_lens, kvcache, page_size, ring_size, layout, latent,
      {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  const C2Rows r = c2_rows(g, kv_score, state, norm_weight, eps, freqs, positions, req,
                           raw_out_loc, kvcache, latent);
  const int32_t* starts = extend_start_loc.data_ptr<int32_t>();
  const int32_t* lens = extend_seq_lens.data_ptr<int32_t>();
  // Request i's rows [begin, end), clipped to the input.
  auto range = [&](int64_t i, int64_t* begin, int64_t* end) {
    const int64_t s = starts[i], n = lens[i];
    *begin = s < 0 ? 0 : s > g.n_rows ? g.n_rows : s;
    const int64_t e = n > 0 ? s + n : s;
    *end = e < *begin ? *begin : e > g.n_rows ? g.n_rows : e;
  };
  // Pass 1, pooling: an odd live row pairs with the previous row when it is the same
  // request's live position pos - 1, else with the ring.
  at::parallel_for(0, g.num_reqs, 1, [&](int64_t rb, int64_t re) {
    for (int64_t i = rb; i < re; ++i) {
      int64_t begin, end;
      range(i, &begin, &end);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t p = r.pos(t);
        if (r.raw(t) == 0 || (p & 1) == 0) continue;
        const int64_t rid = r.rid(t);
        const bool in_batch = t > begin && r.rid(t - 1) == rid && r.pos(t - 1) == p - 1 &&
                              r.raw(t - 1) != 0;
        const float* partner = in_batch ? r.row(t - 1) : r.ring_row(rid, p - 1);
        if (partner != nullptr) r.close_pair(t, partner);
      }
    }
  });
  // Pass 2, strictly after every pass-1 read: each request parks its last min(len, ring)
  // rows (padded ones among them skipped) for a later step's first partner (contract V4.1 2.6).
  at::parallel_for(0, g.num_reqs, 1, [&](int64_t rb, int64_t re) {
    for (int64_t i = rb; i < re; ++i) {
      int64_t begin, end;
      range(i, &begin, &end);
      const int64_t first = end - begin > g.ring_size ? end - g.ring_size : begin;
      for (int64_t t = first; t < end; ++t)
        if (r.raw(t) != 0) r.park(t);
    }
  });
}

void low_ratio_index_k_store_cpu(const at::Tensor& k, const at::Tensor& norm_weight, double eps,
                                 const at::Tensor& freqs, const at::Tensor& positions,
                                 const at::Tensor& loc, at::Tensor& cache, int64_t page_size,
                                 int64_t ratio, int64_t dcp_world_size, int64_t dcp_rank,
                                 int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_index_k_args(k, norm_weight, eps, freqs, positions, loc, cache, page_size, ratio,
                         {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  const auto* k_rows = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const void* w = norm_weight.data_ptr();
  const float* fr = freqs.data_ptr<float>();
  const void* pos = positions.data_ptr();
  const void* locs = loc.data_ptr();
  uint8_t* base = cache.data_ptr<uint8_t>();
  at::parallel_for(0, g.n_rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t l = load_index(locs, g.loc64, t);
      if (l <= 0) continue;
      const CacheSlot slot = store_slot_of(l, g.dcp, g.log2_page_size, g.num_pages);
      const float* f =
          freqs_row(fr, g.max_pos, group_position(load_index(pos, g.pos64, t), g.ratio));
      if (slot.page < 0 || f == nullptr) continue;
      index_k_row(k_rows + t * kIndexKDim, w, g.w_bf16, float(eps), f,
                  base + slot.page * g.page_bytes, slot.off, g.page_size);
    }
  });
}

void kv_store_cpu(const at::Tensor& x, const at::Tensor& loc,
                  const std::optional<at::Tensor>& freqs_rows, at::Tensor& kvcache,
                  int64_t page_size, c10::string_view layout, int64_t dcp_world_size,
                  int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_kv_store_args(x, loc, freqs_rows, kvcache, page_size, layout,
                          {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  const void* xs = x.data_ptr();
  const void* locs = loc.data_ptr();
  const float* fr = g.has_freqs_rows ? freqs_rows->data_ptr<float>() : nullptr;
  const LayoutCacheRef cache = layout_cache(kvcache, g);
  at::parallel_for(0, g.n_rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const CacheSlot slot =
          store_slot_of(load_index(locs, g.loc64, t), g.dcp, g.log2_page_size, g.num_pages);
      if (slot.page < 0) continue;
      float v[kLowRatioHeadDim];
      for (int d = 0; d < kLowRatioHeadDim; ++d)
        v[d] = g.x_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(xs)[t * kLowRatioHeadDim + d])
                        : static_cast<const float*>(xs)[t * kLowRatioHeadDim + d];
      // The rotated values are rounded to x's dtype (fp32: no rounding).
      if (fr != nullptr) rope_tail(v, kLowRatioHeadDim - kRopeDim, fr + t * kRopeDim, g.x_bf16);
      cache.store_at(slot, v);
    }
  });
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("c1_norm_rope_store", &dsv4::c1_norm_rope_store_cpu);
  m.impl("c2_norm_rope_store", &dsv4::c2_norm_rope_store_cpu);
  m.impl("c2_prefill_norm_rope_store", &dsv4::c2_prefill_norm_rope_store_cpu);
  m.impl("low_ratio_index_k_store", &dsv4::low_ratio_index_k_store_cpu);
  m.impl("kv_store", &dsv4::kv_store_cpu);
}
