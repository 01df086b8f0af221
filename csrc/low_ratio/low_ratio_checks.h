// Argument checks of the V4.1 ratio-1 / ratio-2 ops (c1_norm_rope_store, c2_norm_rope_store,
// c2_prefill_norm_rope_store, low_ratio_index_k_store, kv_store), shared by the CPU and the
// CUDA/HIP glue (contract V4.1 4.4): each validates every tensor and scalar and returns the
// geometry both kernels need. Data-dependent checks (rows outside state, kvcache or freqs) are
// the debug mode's (dsv4_ops/validate.py); the kernels skip such rows.
#pragma once

#include <limits>
#include <string>

#include "include/dsv4/kv_layout.h"
#include "include/dsv4/low_ratio_math.h"
#include "op_checks.h"

namespace dsv4 {

constexpr const char* kC1Op = "c1_norm_rope_store";
constexpr const char* kC2Op = "c2_norm_rope_store";
constexpr const char* kC2PrefillOp = "c2_prefill_norm_rope_store";
constexpr const char* kIndexKOp = "low_ratio_index_k_store";
constexpr const char* kKvStoreOp = "kv_store";
constexpr int64_t kMaxLowRatioPageSize = int64_t(1) << 30;
constexpr int64_t kMaxRingSize = int64_t(1) << 30;

// Everything a V4.1 kernel needs besides the data pointers.
struct LowRatioGeometry {
  int layout = kLayoutV4;
  int64_t n_rows = 0;          // input rows (tokens)
  int64_t num_pages = 0;       // kvcache (index-K: cache) pages
  int64_t page_bytes = 0;      // actual page stride (>= the layout's page bytes)
  int64_t page_size = 0;
  int log2_page_size = 0;
  int64_t max_pos = 0;         // rows of freqs
  int64_t state_rows = 0;      // c2: rows of the pair-state ring buffer
  int64_t ring_size = 0;       // c2
  int64_t draft_len = 1;       // c2 decode / verify
  int64_t num_reqs = 0;        // c2 prefill: entries of extend_start_loc / extend_seq_lens
  int ratio = 1;               // index-K: 1 or 2
  bool pos64 = false;          // positions int64 (else int32)
  bool loc64 = false;          // out_loc / raw_out_loc / loc int64 (else int32)
  bool req64 = false;          // req int64 (else int32)
  bool w_bf16 = true;          // norm_weight bf16 (else fp32)
  bool x_bf16 = true;          // kv_store: x bf16 (else fp32)
  bool has_freqs_rows = false; // kv_store: in-kernel RoPE by freqs_rows
  Dcp dcp;                     // the cache entries this rank stores (contract 9)
};

// A layout name of dsv4_ops.KVLayout -> its KvLayout enumerator.
inline int parse_kv_layout(c10::string_view s, const char* op) {
  const std::string f(s.data(), s.size());
  if (f == "v4") return kLayoutV4;
  if (f == "v41") return kLayoutV41;
  if (f == "v41_fp4") return kLayoutV41Fp4;
  if (f == "uniform_fp8") return kLayoutUniformFp8;
  if (f == "v41_new") return kLayoutV41New;
  if (f == "v41_fp4_new") return kLayoutV41Fp4New;
  DSV4_CHECK(false, op, "layout",
             "must be one of v4, v41, v41_fp4, uniform_fp8, v41_new, v41_fp4_new, got '", f, "'");
  return -1;
}

inline const char* kv_layout_name(int layout) {
  switch (layout) {
    case kLayoutV4: return "v4";
    case kLayoutV41: return "v41";
    case kLayoutV41Fp4: return "v41_fp4";
    case kLayoutUniformFp8: return "uniform_fp8";
    case kLayoutV41New: return "v41_new";
    default: return "v41_fp4_new";
  }
}

// page_size: a power of two in [1, 2^30]; sets page_size and log2_page_size.
inline void check_low_ratio_page_size(int64_t page_size, const char* op, LowRatioGeometry& g) {
  DSV4_CHECK(page_size >= 1 && page_size <= kMaxLowRatioPageSize &&
                 (page_size & (page_size - 1)) == 0,
             op, "page_size", "must be a power of two in [1, 2^30], got ", page_size);
  g.page_size = page_size;
  g.log2_page_size = 0;
  while ((int64_t(1) << g.log2_page_size) < page_size) ++g.log2_page_size;
}

// A paged cache whose pages hold `need` bytes for page_size and fewer than `need_2x` for
// 2 * page_size (a page may be padded, but not by a whole doubling: page_size would then not
// be the cache's). Sets num_pages and page_bytes (the actual stride).
inline void check_paged_cache(const at::Tensor& cache, const char* op, const char* arg,
                              int64_t need, int64_t need_2x, const std::string& what,
                              LowRatioGeometry& g) {
  DSV4_CHECK(cache.dim() >= 1, op, arg, "must have a page dimension, got a scalar");
  check_contiguous(cache, op, arg);
  g.num_pages = cache.size(0);
  g.page_bytes = 0;
  if (g.num_pages == 0) return;
  g.page_bytes = cache.numel() / g.num_pages;
  DSV4_CHECK(g.page_bytes >= need, op, arg, "pages hold ", g.page_bytes, " bytes but ", what,
             " with page_size ", g.page_size, " needs ", need, " (shape ", cache.sizes(), ")");
  DSV4_CHECK(g.page_bytes < need_2x, op, "page_size", g.page_size,
             " does not match ", arg, ": its pages of ", g.page_bytes, " bytes hold ", need_2x,
             " bytes or more, a page_size of at least ", 2 * g.page_size, " of ", what);
}

// kvcache of `layout`: uint8 or float8_e4m3fn pages of at least layout_page_bytes.
inline void check_layout_cache(const at::Tensor& kvcache, int layout, const char* op,
                               LowRatioGeometry& g) {
  check_dtype(kvcache, op, "kvcache", {at::kByte, at::kFloat8_e4m3fn});
  check_paged_cache(kvcache, op, "kvcache", layout_page_bytes(layout, g.page_size),
                    layout_page_bytes(layout, 2 * g.page_size),
                    std::string("layout ") + kv_layout_name(layout), g);
}

inline void check_cache_device(const at::Tensor& cache, const char* arg, const char* op,
                               at::DeviceType device_type) {
  DSV4_CHECK(cache.device().type() == device_type, op, arg, "must be a ",
             c10::DeviceTypeName(device_type), " tensor for this kernel, got ", cache.device());
}

// A [n_rows, width] row tensor of one of `dtypes`, contiguous.
inline void check_rows(const at::Tensor& t, const char* op, const char* arg, int64_t n_rows,
                       int64_t width, std::initializer_list<at::ScalarType> dtypes) {
  check_dtype(t, op, arg, dtypes);
  check_dim(t, op, arg, 2);
  DSV4_CHECK(t.size(1) == width && (n_rows < 0 || t.size(0) == n_rows), op, arg, "must be [",
             n_rows < 0 ? std::string("*") : std::to_string(n_rows), ", ", width,
             "], got shape ", t.sizes());
  check_contiguous(t, op, arg);
}

// A [n_rows] index vector of one of `dtypes`, contiguous; returns whether it is int64.
inline bool check_index_vector(const at::Tensor& t, const char* op, const char* arg,
                               int64_t n_rows, std::initializer_list<at::ScalarType> dtypes) {
  check_dtype(t, op, arg, dtypes);
  check_dim(t, op, arg, 1);
  DSV4_CHECK(t.size(0) == n_rows, op, arg, "must have one entry per row (", n_rows,
             "), got shape ", t.sizes());
  check_contiguous(t, op, arg);
  return t.scalar_type() == at::kLong;
}

inline void check_norm_weight(const at::Tensor& w, int64_t dim, const char* op,
                              LowRatioGeometry& g) {
  check_dtype(w, op, "norm_weight", {at::kBFloat16, at::kFloat});
  check_dim(w, op, "norm_weight", 1);
  DSV4_CHECK(w.size(0) == dim, op, "norm_weight", "must have ", dim, " elements, got shape ",
             w.sizes());
  check_contiguous(w, op, "norm_weight");
  check_no_grad(w, op, "norm_weight");
  g.w_bf16 = w.scalar_type() == at::kBFloat16;
}

inline void check_freqs(const at::Tensor& freqs, const char* op, LowRatioGeometry& g) {
  check_dtype(freqs, op, "freqs", {at::kFloat});
  check_dim(freqs, op, "freqs", 2);
  DSV4_CHECK(freqs.size(1) == kRopeDim, op, "freqs",
             "must be [max_pos, 64] (cos, sin pairs), got shape ", freqs.sizes());
  check_contiguous(freqs, op, "freqs");
  check_no_grad(freqs, op, "freqs");
  g.max_pos = freqs.size(0);
}

inline void check_latent(const at::Tensor& latent, const char* op, int64_t n_rows) {
  check_rows(latent, op, "latent", n_rows, kLowRatioHeadDim, {at::kBFloat16});
}

// eps of the RMSNorm: finite and >= 0.
inline void check_low_ratio_eps(double eps, const char* op) {
  DSV4_CHECK(eps >= 0.0 && eps <= std::numeric_limits<double>::max(), op, "eps",
             "must be finite and >= 0, got ", eps);
}

// The rows of a norm + RoPE op with one destination each (c1: kv / out_loc, index-K: k /
// loc): bf16 [N, dim] rows, the norm weight [dim], the freqs table, positions and slots [N].
inline void check_norm_rope_rows(const at::Tensor& rows, const char* rows_arg, int64_t dim,
                                 const at::Tensor& norm_weight, const at::Tensor& freqs,
                                 const at::Tensor& positions, const at::Tensor& loc,
                                 const char* loc_arg, const char* op, LowRatioGeometry& g) {
  const at::Device dev = rows.device();
  check_device(norm_weight, dev, op, "norm_weight");
  check_device(freqs, dev, op, "freqs");
  check_device(positions, dev, op, "positions");
  check_device(loc, dev, op, loc_arg);
  check_rows(rows, op, rows_arg, -1, dim, {at::kBFloat16});
  check_no_grad(rows, op, rows_arg);
  g.n_rows = rows.size(0);
  check_norm_weight(norm_weight, dim, op, g);
  check_freqs(freqs, op, g);
  g.pos64 = check_index_vector(positions, op, "positions", g.n_rows, {at::kInt, at::kLong});
  g.loc64 = check_index_vector(loc, op, loc_arg, g.n_rows, {at::kInt, at::kLong});
}

// c1_norm_rope_store.
inline LowRatioGeometry check_c1_args(const at::Tensor& kv, const at::Tensor& norm_weight,
                                      double eps, const at::Tensor& freqs,
                                      const at::Tensor& positions, const at::Tensor& out_loc,
                                      const at::Tensor& kvcache, int64_t page_size,
                                      c10::string_view layout, const at::Tensor& latent,
                                      const Dcp& dcp, at::DeviceType device_type) {
  const char* op = kC1Op;
  LowRatioGeometry g;
  g.dcp = check_dcp(dcp, op);
  g.layout = parse_kv_layout(layout, op);
  check_low_ratio_page_size(page_size, op, g);
  check_low_ratio_eps(eps, op);
  check_cache_device(kvcache, "kvcache", op, device_type);
  check_device(kv, kvcache.device(), op, "kv");
  check_device(latent, kvcache.device(), op, "latent");
  check_norm_rope_rows(kv, "kv", kLowRatioHeadDim, norm_weight, freqs, positions, out_loc,
                       "out_loc", op, g);
  check_layout_cache(kvcache, g.layout, op, g);
  check_latent(latent, op, g.n_rows);
  check_no_overlap(latent, "latent", kv, "kv", op);
  check_no_overlap(latent, "latent", kvcache, "kvcache", op);
  return g;
}

// c2_norm_rope_store (decode: draft_len 1; verify: draft_len > 1) and the shared part of
// c2_prefill_norm_rope_store (draft_len 1).
inline LowRatioGeometry check_c2_args(const char* op, const at::Tensor& kv_score,
                                      const at::Tensor& state, const at::Tensor& norm_weight,
                                      double eps, const at::Tensor& freqs,
                                      const at::Tensor& positions, const at::Tensor& req,
                                      const at::Tensor& raw_out_loc, const at::Tensor& kvcache,
                                      int64_t page_size, int64_t ring_size, int64_t draft_len,
                                      c10::string_view layout, const at::Tensor& latent,
                                      const Dcp& dcp, at::DeviceType device_type) {
  LowRatioGeometry g;
  g.dcp = check_dcp(dcp, op);
  g.layout = parse_kv_layout(layout, op);
  check_low_ratio_page_size(page_size, op, g);
  check_low_ratio_eps(eps, op);
  DSV4_CHECK(ring_size >= 1 && ring_size <= kMaxRingSize && (ring_size & (ring_size - 1)) == 0,
             op, "ring_size",
             "(the pair-state ring) must be a power of two in [1, 2^30], got ", ring_size);
  g.ring_size = ring_size;
  DSV4_CHECK(draft_len >= 1, op, "draft_len", "must be >= 1, got ", draft_len);
  g.draft_len = draft_len;
  check_cache_device(kvcache, "kvcache", op, device_type);
  const at::Device dev = kvcache.device();
  check_device(kv_score, dev, op, "kv_score");
  check_device(state, dev, op, "state");
  check_device(norm_weight, dev, op, "norm_weight");
  check_device(freqs, dev, op, "freqs");
  check_device(positions, dev, op, "positions");
  check_device(req, dev, op, "req");
  check_device(raw_out_loc, dev, op, "raw_out_loc");
  check_device(latent, dev, op, "latent");

  check_rows(kv_score, op, "kv_score", -1, kPairRowWidth, {at::kFloat});
  check_no_grad(kv_score, op, "kv_score");
  g.n_rows = kv_score.size(0);
  if (draft_len > 1) {
    DSV4_CHECK(g.n_rows % draft_len == 0, op, "kv_score", "rows (", g.n_rows,
               ") must be a multiple of the draft length (draft_len=", draft_len,
               "): verify takes blocks of draft_len consecutive positions per request");
    DSV4_CHECK(ring_size > draft_len, op, "ring_size", "the pair-state ring (ring_size=",
               ring_size, ") must be wider than the draft length (draft_len=", draft_len, ")");
  }
  check_rows(state, op, "state", -1, kPairRowWidth, {at::kFloat});
  g.state_rows = state.size(0);
  check_norm_weight(norm_weight, kLowRatioHeadDim, op, g);
  check_freqs(freqs, op, g);
  g.pos64 = check_index_vector(positions, op, "positions", g.n_rows, {at::kInt, at::kLong});
  g.req64 = check_index_vector(req, op, "req", g.n_rows, {at::kLong, at::kInt});
  g.loc64 = check_index_vector(raw_out_loc, op, "raw_out_loc", g.n_rows, {at::kInt, at::kLong});
  check_layout_cache(kvcache, g.layout, op, g);
  check_latent(latent, op, g.n_rows);
  check_no_overlap(state, "state", kv_score, "kv_score", op);
  check_no_overlap(state, "state", kvcache, "kvcache", op);
  check_no_overlap(latent, "latent", kv_score, "kv_score", op);
  check_no_overlap(latent, "latent", state, "state", op);
  check_no_overlap(latent, "latent", kvcache, "kvcache", op);
  return g;
}

// c2_prefill_norm_rope_store: as c2 decode, plus the per-request row ranges (int32 [num_reqs]).
inline LowRatioGeometry check_c2_prefill_args(
    const at::Tensor& kv_score, const at::Tensor& state, const at::Tensor& norm_weight, double eps,
    const at::Tensor& freqs, const at::Tensor& positions, const at::Tensor& req,
    const at::Tensor& raw_out_loc, const at::Tensor& extend_start_loc,
    const at::Tensor& extend_seq_lens, const at::Tensor& kvcache, int64_t page_size,
    int64_t ring_size, c10::string_view layout, const at::Tensor& latent, const Dcp& dcp,
    at::DeviceType device_type) {
  const char* op = kC2PrefillOp;
  LowRatioGeometry g = check_c2_args(op, kv_score, state, norm_weight, eps, freqs, positions,
                                     req, raw_out_loc, kvcache, page_size, ring_size, 1, layout,
                                     latent, dcp, device_type);
  const at::Device dev = kvcache.device();
  check_device(extend_start_loc, dev, op, "extend_start_loc");
  check_device(extend_seq_lens, dev, op, "extend_seq_lens");
  check_dtype(extend_start_loc, op, "extend_start_loc", {at::kInt});
  check_dim(extend_start_loc, op, "extend_start_loc", 1);
  check_contiguous(extend_start_loc, op, "extend_start_loc");
  g.num_reqs = extend_start_loc.size(0);
  check_dtype(extend_seq_lens, op, "extend_seq_lens", {at::kInt});
  check_dim(extend_seq_lens, op, "extend_seq_lens", 1);
  DSV4_CHECK(extend_seq_lens.size(0) == g.num_reqs, op, "extend_seq_lens",
             "must have one entry per request (", g.num_reqs, ", as extend_start_loc), got shape ",
             extend_seq_lens.sizes());
  check_contiguous(extend_seq_lens, op, "extend_seq_lens");
  return g;
}

// low_ratio_index_k_store: the index-K cache is uint8 [P, 68 * page_size] (a page may be padded).
inline LowRatioGeometry check_index_k_args(const at::Tensor& k, const at::Tensor& norm_weight,
                                           double eps, const at::Tensor& freqs,
                                           const at::Tensor& positions, const at::Tensor& loc,
                                           const at::Tensor& cache, int64_t page_size,
                                           int64_t ratio, const Dcp& dcp,
                                           at::DeviceType device_type) {
  const char* op = kIndexKOp;
  LowRatioGeometry g;
  g.dcp = check_dcp(dcp, op);
  DSV4_CHECK(ratio == 1 || ratio == 2, op, "ratio", "must be 1 or 2, got ", ratio);
  g.ratio = int(ratio);
  check_low_ratio_page_size(page_size, op, g);
  check_low_ratio_eps(eps, op);
  check_cache_device(cache, "cache", op, device_type);
  check_device(k, cache.device(), op, "k");
  check_norm_rope_rows(k, "k", kIndexKDim, norm_weight, freqs, positions, loc, "loc", op, g);
  check_dtype(cache, op, "cache", {at::kByte});
  check_paged_cache(cache, op, "cache", index_k_page_bytes(page_size),
                    index_k_page_bytes(2 * page_size), "the index-K cache (68 bytes a slot)", g);
  return g;
}

// kv_store: x bf16 / fp32 [N, 512]; freqs_rows fp32 [N, 64] only for the V41 family.
inline LowRatioGeometry check_kv_store_args(const at::Tensor& x, const at::Tensor& loc,
                                            const std::optional<at::Tensor>& freqs_rows,
                                            const at::Tensor& kvcache, int64_t page_size,
                                            c10::string_view layout, const Dcp& dcp,
                                            at::DeviceType device_type) {
  const char* op = kKvStoreOp;
  LowRatioGeometry g;
  g.dcp = check_dcp(dcp, op);
  g.layout = parse_kv_layout(layout, op);
  check_low_ratio_page_size(page_size, op, g);
  check_cache_device(kvcache, "kvcache", op, device_type);
  const at::Device dev = kvcache.device();
  check_device(x, dev, op, "x");
  check_device(loc, dev, op, "loc");

  check_rows(x, op, "x", -1, kLowRatioHeadDim, {at::kBFloat16, at::kFloat});
  check_no_grad(x, op, "x");
  g.n_rows = x.size(0);
  g.x_bf16 = x.scalar_type() == at::kBFloat16;
  g.loc64 = check_index_vector(loc, op, "loc", g.n_rows, {at::kInt, at::kLong});
  g.has_freqs_rows = freqs_rows.has_value();
  if (g.has_freqs_rows) {
    DSV4_CHECK(g.layout != kLayoutV4 && g.layout != kLayoutUniformFp8, op, "freqs_rows",
               "(in-kernel RoPE) is only for the V41 layouts (v41, v41_fp4, v41_new, "
               "v41_fp4_new), got layout ", kv_layout_name(g.layout));
    check_device(*freqs_rows, dev, op, "freqs_rows");
    check_rows(*freqs_rows, op, "freqs_rows", g.n_rows, kRopeDim, {at::kFloat});
    check_no_grad(*freqs_rows, op, "freqs_rows");
  }
  check_layout_cache(kvcache, g.layout, op, g);
  check_no_overlap(kvcache, "kvcache", x, "x", op);
  return g;
}

}  // namespace dsv4
