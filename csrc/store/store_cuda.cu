// compress_norm_rope_store, CUDA/HIP glue: checks, device guard, current stream, launch of
// compress_norm_rope_store_kernel<format, kv type> (csrc/include/dsv4/store/store_kernel.cuh;
// fp8_ds_mla into a V4.1 layout: format store_layout_format(layout)).
// No host sync and no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include <cstdlib>

#include "cuda_glue.h"
#include "include/dsv4/store/store_kernel.cuh"
#include "store/store_checks.h"
#include "store/store_launch.h"

namespace dsv4 {
namespace {

// DSV4_OPS_TEST_STALE_PLAN=1 makes every plan guess of the store kernel wrong (load_early in
// portability.h), so that the tests run the path that reloads from the plan read after the
// wait, and the sanitizer sees that the loads of garbage guesses stay inside the buffers.
// Only a test build (DSV4_TEST_HOOKS, see setup.py) has the hook; elsewhere asking for it is
// an error rather than a test that silently runs the ordinary path.
bool stale_plan_requested() {
  static const bool requested = [] {
    const char* e = std::getenv("DSV4_OPS_TEST_STALE_PLAN");
    return e != nullptr && e[0] == '1';
  }();
  return requested;
}

template <int kFormat, typename KvT, int kRowGroups>
void launch_store_groups(const StoreKernelArgs& a, const LaunchEnv& env) {
  // Whole 64-thread multiples (AMD wavefronts), at most kStoreMaxBlockThreads; fewer when
  // the rows would not fill every SM: a decode step's handful of rows then runs on as many
  // SMs (faster than one full block for small decode steps).
  constexpr int kRowThreads = kRowGroups * kLaneGroup;
  const int64_t rows_per_sm = (a.n_rows + env.sms - 1) / env.sms;
  const int threads = int(std::min<int64_t>(kStoreMaxBlockThreads,
                                            (rows_per_sm * kRowThreads + 63) / 64 * 64));
  const int64_t tokens_per_block = threads / kRowThreads;
  const int64_t blocks = (a.n_rows + tokens_per_block - 1) / tokens_per_block;
  DSV4_CHECK(blocks <= int64_t(0x7fffffff), kStoreOp, "kv", "has too many rows (", a.n_rows, ")");
  launch_kernel(compress_norm_rope_store_kernel<kFormat, KvT, kRowGroups>,
                dim3(unsigned(blocks)), dim3(unsigned(kRowThreads * tokens_per_block)), 0,
                env.stream, env.pdl, a);
}
// A V4.1 layout's rows spread over four lane groups up to kStoreSplitRowsPerSm rows an SM (the
// time of a few rows is one row's serial encoding; from there the four groups' repeated loads
// and sums cost more than they save: docs/design/low_ratio.md).
template <int kFormat, typename KvT>
void launch_store(const StoreKernelArgs& a, const LaunchEnv& env) {
  if constexpr (store_format_is_layout(kFormat)) {
    if (a.n_rows <= kStoreSplitRowsPerSm * env.sms)
      return launch_store_groups<kFormat, KvT, low_ratio::kRowChunks>(a, env);
  }
  launch_store_groups<kFormat, KvT, 1>(a, env);
}

template <typename KvT>
void launch_for_format(int format, const StoreKernelArgs& a, const LaunchEnv& env) {
  switch (format) {
    case kStoreFp8DsMla: return launch_store<kStoreFp8DsMla, KvT>(a, env);
    case kStoreBf16: return launch_store<kStoreBf16, KvT>(a, env);
    case kStoreFp8Indexer: return launch_store<kStoreFp8Indexer, KvT>(a, env);
    case kStoreFp4Indexer: return launch_store<kStoreFp4Indexer, KvT>(a, env);
    case store_layout_format(kLayoutV41):
      return launch_store<store_layout_format(kLayoutV41), KvT>(a, env);
    case store_layout_format(kLayoutV41Fp4):
      return launch_store<store_layout_format(kLayoutV41Fp4), KvT>(a, env);
    case store_layout_format(kLayoutUniformFp8):
      return launch_store<store_layout_format(kLayoutUniformFp8), KvT>(a, env);
    case store_layout_format(kLayoutV41New):
      return launch_store<store_layout_format(kLayoutV41New), KvT>(a, env);
    default: return launch_store<store_layout_format(kLayoutV41Fp4New), KvT>(a, env);
  }
}

void compress_norm_rope_store_cuda(const at::Tensor& kv, const at::Tensor& plan,
                                   const at::Tensor& norm_weight, const at::Tensor& freqs,
                                   const at::Tensor& out_loc, at::Tensor& kvcache, bool is_decode,
                                   int64_t compress_ratio, double eps, int64_t page_size,
                                   c10::string_view store_format, c10::string_view layout,
                                   int64_t dcp_world_size, int64_t dcp_rank,
                                   int64_t dcp_interleave) {
  const StoreGeometry g = check_store_args(kv, plan, norm_weight, freqs, out_loc, kvcache,
                                           compress_ratio, page_size, store_format, layout,
                                           {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  check_store_eps(eps);
  if (g.n_rows == 0 || g.num_pages == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(kvcache.device());
  launch_compress_norm_rope_store(g, kv, plan, norm_weight, freqs, out_loc, kvcache, is_decode,
                                  compress_ratio, eps, launch_env(kvcache));
}

}  // namespace

StoreKernelArgs store_kernel_args(const StoreGeometry& g, const at::Tensor& kv,
                                  const at::Tensor& plan, const at::Tensor& norm_weight,
                                  const at::Tensor& freqs, const at::Tensor& out_loc,
                                  const at::Tensor& kvcache, bool is_decode,
                                  int64_t compress_ratio, double eps) {
  StoreKernelArgs a;
  a.kv = kv.data_ptr();
  a.plan = plan.data_ptr<uint8_t>();
  a.norm_weight = norm_weight.data_ptr();
  a.freqs = freqs.data_ptr<float>();
  a.out_loc = out_loc.data_ptr();
  a.cache = static_cast<uint8_t*>(kvcache.data_ptr());  // uint8 or float8_e4m3fn (V4.1 layouts)
  a.n_rows = g.n_rows;
  a.num_out_loc = g.num_out_loc;
  a.max_pos = g.max_pos;
  a.num_pages = g.num_pages;
  a.page_bytes = g.page_bytes;
  a.page_size = g.page_size;
  a.log2_page_size = g.log2_page_size;
  a.dcp = g.dcp;
  a.compress_ratio = int(compress_ratio);
  a.eps = float(eps);
  a.is_decode = is_decode;
  a.w_bf16 = norm_weight.scalar_type() == at::kBFloat16;
  a.loc64 = out_loc.scalar_type() == at::kLong;
  a.vec_in = aligned(a.kv, 16) && aligned(a.norm_weight, 16) && aligned(a.freqs, 16) &&
             aligned(a.plan, 16);
  a.vec_out = aligned(a.cache, 8) && g.page_bytes % 8 == 0;
#if defined(DSV4_TEST_HOOKS)
  a.guess_xor = stale_plan_requested() ? 0x9e3779b9u : 0u;
#else
  DSV4_CHECK(!stale_plan_requested(), kStoreOp, "DSV4_OPS_TEST_STALE_PLAN=1",
             "needs a test build of dsv4_ops (built with DSV4_OPS_TEST_HOOKS=1, see setup.py)");
#endif
  return a;
}

void launch_compress_norm_rope_store(const StoreGeometry& g, const at::Tensor& kv,
                                     const at::Tensor& plan, const at::Tensor& norm_weight,
                                     const at::Tensor& freqs, const at::Tensor& out_loc,
                                     const at::Tensor& kvcache, bool is_decode,
                                     int64_t compress_ratio, double eps, const LaunchEnv& env) {
  if (g.n_rows == 0 || g.num_pages == 0) return;
  const StoreKernelArgs a = store_kernel_args(g, kv, plan, norm_weight, freqs, out_loc, kvcache,
                                              is_decode, compress_ratio, eps);
  const int format = store_kernel_format(g);
  if (kv.scalar_type() == at::kBFloat16)
    launch_for_format<uint16_t>(format, a, env);
  else
    launch_for_format<float>(format, a, env);
  DSV4_CHECK_LAUNCH();
}

}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_norm_rope_store", &dsv4::compress_norm_rope_store_cuda);
}
