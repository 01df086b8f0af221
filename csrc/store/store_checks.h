// Argument checks of compress_norm_rope_store, shared by the CPU and the CUDA/HIP glue:
// one function validates every tensor and returns the geometry both kernels need.
#pragma once

#include <limits>
#include <string>

#include "include/dsv4/store_math.h"
#include "low_ratio/low_ratio_checks.h"
#include "op_checks.h"

namespace dsv4 {

constexpr const char* kStoreOp = "compress_norm_rope_store";
constexpr int64_t kMaxStorePageSize = int64_t(1) << 30;

struct StoreGeometry {
  int format = 0;
  int head_dim = 0;
  int64_t n_rows = 0;
  int64_t num_out_loc = 0;
  int64_t max_pos = 0;
  int64_t num_pages = 0;
  int64_t page_bytes = 0;  // actual page stride of kvcache (>= the format's page bytes)
  int64_t page_size = 0;
  int log2_page_size = 0;
  int layout = kLayoutV4;  // KvLayout of an fp8_ds_mla store (contract V4.1 4.2)
  Dcp dcp;                 // the entries this rank stores (contract 9)
};

inline int parse_store_format(c10::string_view s, const char* op = kStoreOp) {
  const std::string f(s.data(), s.size());
  if (f == "fp8_ds_mla") return kStoreFp8DsMla;
  if (f == "bf16") return kStoreBf16;
  if (f == "fp8_indexer") return kStoreFp8Indexer;
  if (f == "fp4_indexer") return kStoreFp4Indexer;
  DSV4_CHECK(false, op, "store_format",
             "must be one of fp8_ds_mla, bf16, fp8_indexer, fp4_indexer, got '", f, "'");
  return -1;
}

// The largest power-of-two page size whose pages of `format` fit in `page_bytes` (0: none).
inline int64_t cache_page_size(int format, int64_t page_bytes) {
  int64_t ps = 0;
  for (int64_t p = 1; p <= kMaxStorePageSize && store_page_bytes(format, p) <= page_bytes; p *= 2)
    ps = p;
  return ps;
}

// Checks every argument; `device_type` is the backend whose kernel runs (kCPU or kCUDA):
// kvcache must live there and every other tensor on kvcache's device. `op` names the op in
// the errors (compress_and_store checks its store arguments here too).
inline StoreGeometry check_store_args(const at::Tensor& kv, const at::Tensor& plan,
                                      const at::Tensor& norm_weight, const at::Tensor& freqs,
                                      const at::Tensor& out_loc, const at::Tensor& kvcache,
                                      int64_t compress_ratio, int64_t page_size,
                                      c10::string_view store_format, c10::string_view layout,
                                      const Dcp& dcp, at::DeviceType device_type,
                                      const char* op = kStoreOp) {
  StoreGeometry g;
  g.dcp = check_dcp(dcp, op);
  g.format = parse_store_format(store_format, op);
  g.head_dim = store_head_dim(g.format);
  g.layout = parse_kv_layout(layout, op);
  DSV4_CHECK(g.layout == kLayoutV4 || g.format == kStoreFp8DsMla, op, "layout",
             kv_layout_name(g.layout), " needs store_format fp8_ds_mla (head_dim 512), got ",
             std::string(store_format.data(), store_format.size()));
  check_ratio(compress_ratio, op);
  DSV4_CHECK(page_size >= 1 && page_size <= kMaxStorePageSize &&
                 (page_size & (page_size - 1)) == 0,
             op, "page_size", "must be a power of two in [1, 2^30], got ", page_size);
  g.page_size = page_size;
  while ((int64_t(1) << g.log2_page_size) < page_size) ++g.log2_page_size;

  // Devices: the cache decides, everything else must sit next to it.
  DSV4_CHECK(kvcache.device().type() == device_type, op, "kvcache", "must be a ",
             c10::DeviceTypeName(device_type), " tensor for this kernel, got ", kvcache.device());
  const at::Device dev = kvcache.device();
  check_device(kv, dev, op, "kv");
  check_device(plan, dev, op, "plan");
  check_device(norm_weight, dev, op, "norm_weight");
  check_device(freqs, dev, op, "freqs");
  check_device(out_loc, dev, op, "out_loc");

  check_dtype(kv, op, "kv", {at::kFloat, at::kBFloat16});
  check_dim(kv, op, "kv", 2);
  DSV4_CHECK(kv.size(1) == g.head_dim, op, "kv", "must have ", g.head_dim,
             " columns (head_dim) for store_format ",
             std::string(store_format.data(), store_format.size()), ", got shape ", kv.sizes());
  check_contiguous(kv, op, "kv");
  g.n_rows = kv.size(0);

  check_plan_tensor(plan, op, "plan", 16);
  DSV4_CHECK(plan.size(0) == g.n_rows, op, "plan", "must have one record per kv row (",
             g.n_rows, "), got ", plan.size(0));

  check_dtype(norm_weight, op, "norm_weight", {at::kFloat, at::kBFloat16});
  check_dim(norm_weight, op, "norm_weight", 1);
  DSV4_CHECK(norm_weight.size(0) == g.head_dim, op, "norm_weight", "must have ", g.head_dim,
             " elements, got shape ", norm_weight.sizes());
  check_contiguous(norm_weight, op, "norm_weight");

  check_dtype(freqs, op, "freqs", {at::kFloat});
  check_dim(freqs, op, "freqs", 2);
  DSV4_CHECK(freqs.size(1) == kRopeDim, op, "freqs",
             "must be [max_pos, 64] (cos, sin pairs), got shape ", freqs.sizes());
  check_contiguous(freqs, op, "freqs");
  g.max_pos = freqs.size(0);

  check_dtype(out_loc, op, "out_loc", {at::kInt, at::kLong});
  check_dim(out_loc, op, "out_loc", 1);
  check_contiguous(out_loc, op, "out_loc");
  g.num_out_loc = out_loc.size(0);

  if (g.layout != kLayoutV4) {
    // The V4.1 layouts: pages of layout_page_bytes (contract V4.1 3.1).
    LowRatioGeometry lg;
    lg.page_size = page_size;
    check_layout_cache(kvcache, g.layout, op, lg);
    g.num_pages = lg.num_pages;
    g.page_bytes = lg.page_bytes;
  } else {
    check_dtype(kvcache, op, "kvcache", {at::kByte});
    DSV4_CHECK(kvcache.dim() >= 1, op, "kvcache", "must have a page dimension, got a scalar");
    check_contiguous(kvcache, op, "kvcache");
    g.num_pages = kvcache.size(0);
  }
  if (g.layout == kLayoutV4 && g.num_pages > 0) {
    g.page_bytes = kvcache.numel() / g.num_pages;
    const int64_t need = store_page_bytes(g.format, page_size);
    DSV4_CHECK(g.page_bytes >= need, op, "kvcache", "pages hold ", g.page_bytes,
               " bytes but store_format ", std::string(store_format.data(), store_format.size()),
               " with page_size ", page_size, " needs ", need, " (shape ", kvcache.sizes(), ")");
    // A page may be padded, but not by a whole doubling: then page_size is not the cache's
    // (every token would land at the offsets of a smaller page).
    DSV4_CHECK(g.page_bytes < store_page_bytes(g.format, 2 * page_size), op, "page_size",
               page_size, " does not match kvcache: its pages of ", g.page_bytes,
               " bytes hold page_size ", cache_page_size(g.format, g.page_bytes),
               " of store_format ", std::string(store_format.data(), store_format.size()),
               " (page_size ", page_size, " needs ", need, " bytes)");
  }
  check_no_grad(kv, op, "kv");
  check_no_grad(norm_weight, op, "norm_weight");
  check_no_grad(freqs, op, "freqs");
  return g;
}

// norm_eps of the RMSNorm: finite and >= 0.
inline void check_store_eps(double eps, const char* op = kStoreOp) {
  DSV4_CHECK(eps >= 0.0 && eps <= std::numeric_limits<double>::max(), op, "eps",
             "(norm_eps) must be finite and >= 0, got ", eps);
}

}  // namespace dsv4
