// The V4.1 ratio-1 / ratio-2 ops, CUDA/HIP glue (contract V4.1 1 - 3): checks, device guard,
// current stream, launch of the kernels of csrc/include/dsv4/low_ratio/. No host sync and no
// allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "cuda_glue.h"
#include "include/dsv4/low_ratio/c1_kernel.cuh"
#include "include/dsv4/low_ratio/c2_kernel.cuh"
#include "include/dsv4/low_ratio/c2_prefill_kernel.cuh"
#include "include/dsv4/low_ratio/index_k_kernel.cuh"
#include "include/dsv4/low_ratio/kv_store_kernel.cuh"
#include "low_ratio/low_ratio_checks.h"

namespace dsv4 {
namespace {

uint8_t* cache_bytes(at::Tensor& cache) { return static_cast<uint8_t*>(cache.data_ptr()); }

// Rows from which a 512-dim row kernel runs one lane group a row (row_encode.cuh's kChunks = 4)
// instead of four (kChunks = 1). Tuning knobs (A/B builds): a row count (0: always, a huge
// value: never), or -1: one wave of four-group rows (row_chunks).
#ifndef DSV4_LR_WIDE_ROWS_MIN
#define DSV4_LR_WIDE_ROWS_MIN -1  // c1, kv_store
#endif
// c2 decode / verify, the c2 prefill's two passes: never. At 103 registers a thread the
// one-group ratio-2 kernels hold few more rows an SM, and measured slower at every size.
#ifndef DSV4_LR_WIDE_PAIR_ROWS_MIN
#define DSV4_LR_WIDE_PAIR_ROWS_MIN (int64_t(1) << 62)
#endif

// The chunks a thread of a 512-dim row holds in a launch of n_rows rows (`rows_min` one of the
// knobs above): 1 while the rows' four groups fit on the SMs at once, where one row's latency
// is the launch's; 4 from there, where the loads an SM holds in flight are (4x a thread's).
int row_chunks(int64_t n_rows, int64_t rows_min, const LaunchEnv& env) {
  const int64_t wave = env.sms * std::max<int64_t>(1, env.sm_threads / low_ratio::row_threads(1));
  return n_rows >= (rows_min < 0 ? wave : rows_min) ? low_ratio::kRowChunks : 1;
}

// Rows a block of `rows` rows of row_threads threads each: whole 64-thread multiples (AMD
// wavefronts), at most kBlockThreadsMax threads.
int64_t block_rows(int64_t rows, int row_threads) {
  return std::min<int64_t>(low_ratio::kBlockThreadsMax, (rows * row_threads + 63) / 64 * 64) /
         row_threads;
}

// row_threads threads per row (low_ratio::row_threads(chunks) for the 512-dim rows, one lane
// group for index-K's 128); fewer rows a block when the rows would not fill every SM (as
// compress_norm_rope_store's launch), so that a decode step's handful of rows runs on as many
// SMs. `chunks`: the kernel instance (1 or 4) for the 512-dim rows.
struct RowLaunch {
  dim3 grid;
  dim3 block;
  int chunks;
};
RowLaunch row_launch(int64_t n_rows, int row_threads, const LaunchEnv& env, const char* op,
                     const char* arg) {
  const int64_t rows_per_block = block_rows((n_rows + env.sms - 1) / env.sms, row_threads);
  const int64_t blocks = (n_rows + rows_per_block - 1) / rows_per_block;
  DSV4_CHECK(blocks <= int64_t(0x7fffffff), op, arg, "has too many rows (", n_rows, ")");
  return {dim3(unsigned(blocks)), dim3(unsigned(rows_per_block * row_threads)), 1};
}
// The launch of n_rows 512-dim rows in row_chunks' mapping.
RowLaunch latent_row_launch(int64_t n_rows, int64_t rows_min, const LaunchEnv& env,
                            const char* op, const char* arg) {
  const int chunks = row_chunks(n_rows, rows_min, env);
  RowLaunch l = row_launch(n_rows, low_ratio::row_threads(chunks), env, op, arg);
  l.chunks = chunks;
  return l;
}

// The latent / cache half of the c1 and c2 kernels' arguments.
low_ratio::LatentOutputs latent_outputs(const LowRatioGeometry& g, const at::Tensor& norm_weight,
                                        double eps, const at::Tensor& freqs, at::Tensor& kvcache,
                                        at::Tensor& latent) {
  low_ratio::LatentOutputs o;
  o.norm_weight = norm_weight.data_ptr();
  o.freqs = freqs.data_ptr<float>();
  o.cache = cache_bytes(kvcache);
  o.latent = static_cast<uint16_t*>(latent.data_ptr());
  o.max_pos = g.max_pos;
  o.num_pages = g.num_pages;
  o.page_bytes = g.page_bytes;
  o.rows = layout_row_addressing(g.layout, g.page_size);
  o.log2_page_size = g.log2_page_size;
  o.dcp = g.dcp;
  o.eps = float(eps);
  o.w_bf16 = g.w_bf16;
  o.vec_w = aligned(o.norm_weight, 16);
  o.vec_freqs = aligned(o.freqs, 16);
  o.vec_out = aligned(o.cache, 8) && g.page_bytes % 8 == 0;
  o.vec_latent = aligned(o.latent, 8);
  return o;
}

// The ratio-2 inputs and the pair-state ring of the c2 kernels.
low_ratio::PairInputs pair_inputs(const LowRatioGeometry& g, const at::Tensor& kv_score,
                                  at::Tensor& state, const at::Tensor& positions,
                                  const at::Tensor& req, const at::Tensor& raw_out_loc) {
  low_ratio::PairInputs in;
  in.kv_score = kv_score.data_ptr<float>();
  in.state = state.data_ptr<float>();
  in.positions = positions.data_ptr();
  in.req = req.data_ptr();
  in.raw_out_loc = raw_out_loc.data_ptr();
  in.n_rows = g.n_rows;
  in.state_rows = g.state_rows;
  in.ring = g.ring_size;
  in.pos64 = g.pos64;
  in.req64 = g.req64;
  in.loc64 = g.loc64;
  in.vec_in = aligned(in.kv_score, 16);
  in.vec_state = aligned(in.state, 16);
  return in;
}

// Kernels<layout_encoding(layout), l.chunks>::launch(l, ...): the interleaved layouts run their
// block-split twin's instance (the row addressing comes from the run-time layout).
template <template <int, int> class Kernels, int kChunks, typename... Args>
void launch_encoding(int layout, const RowLaunch& l, Args&&... args) {
  switch (layout_encoding(layout)) {
    case kLayoutV4: return Kernels<kLayoutV4, kChunks>::launch(l, args...);
    case kLayoutV41: return Kernels<kLayoutV41, kChunks>::launch(l, args...);
    case kLayoutV41Fp4: return Kernels<kLayoutV41Fp4, kChunks>::launch(l, args...);
    default: return Kernels<kLayoutUniformFp8, kChunks>::launch(l, args...);
  }
}
template <template <int, int> class Kernels, typename... Args>
void launch_for_encoding(int layout, const RowLaunch& l, Args&&... args) {
  if (l.chunks == low_ratio::kRowChunks)
    launch_encoding<Kernels, low_ratio::kRowChunks>(layout, l, args...);
  else
    launch_encoding<Kernels, 1>(layout, l, args...);
}

template <int kEncoding, int kChunks>
struct C1Kernels {
  static void launch(const RowLaunch& l, const LaunchEnv& env, const C1KernelArgs& a) {
    launch_kernel(c1_norm_rope_store_kernel<kEncoding, kChunks>, l.grid, l.block, 0, env.stream,
                  env.pdl, a);
  }
};
// The one-chunk (few-row) launches of arguments in the common form run its instance.
template <int kEncoding, int kChunks>
struct C2Kernels {
  static void launch(const RowLaunch& l, const LaunchEnv& env, const C2KernelArgs& a) {
    if constexpr (kChunks == 1) {
      if (c2_common_form(a))
        return launch_kernel(c2_norm_rope_store_kernel<kEncoding, 1, true>, l.grid, l.block, 0,
                             env.stream, env.pdl, a);
    }
    launch_kernel(c2_norm_rope_store_kernel<kEncoding, kChunks, false>, l.grid, l.block, 0,
                  env.stream, env.pdl, a);
  }
};
template <int kEncoding, int kChunks>
struct C2PoolKernels {
  static void launch(const RowLaunch& l, const LaunchEnv& env, const C2PrefillKernelArgs& a) {
    launch_kernel(c2_prefill_pool_kernel<kEncoding, kChunks>, l.grid, l.block, 0, env.stream,
                  env.pdl, a);
  }
};
template <int kEncoding, int kChunks>
struct KvStoreKernels {
  template <typename XT>
  static void launch_x(const RowLaunch& l, const LaunchEnv& env, const KvStoreKernelArgs& a) {
    if constexpr (kChunks == 1) {
      if (kv_store_common_form(a))
        return launch_kernel(kv_store_kernel<kEncoding, XT, 1, true>, l.grid, l.block, 0,
                             env.stream, env.pdl, a);
    }
    launch_kernel(kv_store_kernel<kEncoding, XT, kChunks, false>, l.grid, l.block, 0, env.stream,
                  env.pdl, a);
  }
  static void launch(const RowLaunch& l, const LaunchEnv& env, const KvStoreKernelArgs& a,
                     bool x_bf16) {
    if (x_bf16) launch_x<uint16_t>(l, env, a);
    else launch_x<float>(l, env, a);
  }
};

void c1_norm_rope_store_cuda(const at::Tensor& kv, const at::Tensor& norm_weight, double eps,
                             const at::Tensor& freqs, const at::Tensor& positions,
                             const at::Tensor& out_loc, at::Tensor& kvcache, int64_t page_size,
                             c10::string_view layout, at::Tensor& latent,
                             int64_t dcp_world_size, int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_c1_args(kv, norm_weight, eps, freqs, positions, out_loc, kvcache, page_size, layout,
                    latent, {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  if (g.n_rows == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(kvcache.device());
  C1KernelArgs a;
  a.out = latent_outputs(g, norm_weight, eps, freqs, kvcache, latent);
  a.kv = static_cast<const uint16_t*>(kv.data_ptr());
  a.positions = positions.data_ptr();
  a.out_loc = out_loc.data_ptr();
  a.n_rows = g.n_rows;
  a.pos64 = g.pos64;
  a.loc64 = g.loc64;
  a.vec_kv = aligned(a.kv, 8);
  const LaunchEnv env = launch_env(kvcache);
  launch_for_encoding<C1Kernels>(
      g.layout, latent_row_launch(g.n_rows, DSV4_LR_WIDE_ROWS_MIN, env, kC1Op, "kv"), env, a);
  DSV4_CHECK_LAUNCH();
}

void c2_norm_rope_store_cuda(const at::Tensor& kv_score, at::Tensor& state,
                             const at::Tensor& norm_weight, double eps, const at::Tensor& freqs,
                             const at::Tensor& positions, const at::Tensor& req,
                             const at::Tensor& raw_out_loc, at::Tensor& kvcache,
                             int64_t page_size, int64_t ring_size, int64_t draft_len,
                             c10::string_view layout, at::Tensor& latent,
                             int64_t dcp_world_size, int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g = check_c2_args(
      kC2Op, kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, kvcache,
      page_size, ring_size, draft_len, layout, latent,
      {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  if (g.n_rows == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(kvcache.device());
  C2KernelArgs a;
  a.out = latent_outputs(g, norm_weight, eps, freqs, kvcache, latent);
  a.in = pair_inputs(g, kv_score, state, positions, req, raw_out_loc);
  a.draft_len = make_divisor(g.draft_len);
  const LaunchEnv env = launch_env(kvcache);
  launch_for_encoding<C2Kernels>(
      g.layout, latent_row_launch(g.n_rows, DSV4_LR_WIDE_PAIR_ROWS_MIN, env, kC2Op, "kv_score"),
      env, a);
  DSV4_CHECK_LAUNCH();
}

void c2_prefill_norm_rope_store_cuda(const at::Tensor& kv_score, at::Tensor& state,
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
      {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  if (g.n_rows == 0 || g.num_reqs == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(kvcache.device());
  C2PrefillKernelArgs a;
  a.out = latent_outputs(g, norm_weight, eps, freqs, kvcache, latent);
  a.in = pair_inputs(g, kv_score, state, positions, req, raw_out_loc);
  a.extend_start = extend_start_loc.data_ptr<int32_t>();
  a.extend_lens = extend_seq_lens.data_ptr<int32_t>();
  a.num_reqs = g.num_reqs;
  const LaunchEnv env = launch_env(kvcache);
  // Pass 1 over every row, kPoolSlotRows a row slot (its mapping by the rows); pass 2 after it,
  // over each request's last min(len, ring) rows (at most min(ring, n_rows)).
  constexpr int64_t kSlotRows = low_ratio::kPoolSlotRows;
  const int pool_chunks = row_chunks(g.n_rows, DSV4_LR_WIDE_PAIR_ROWS_MIN, env);
  RowLaunch pool = row_launch((g.n_rows + kSlotRows - 1) / kSlotRows,
                              low_ratio::row_threads(pool_chunks), env, kC2PrefillOp, "kv_score");
  pool.chunks = pool_chunks;
  launch_for_encoding<C2PoolKernels>(g.layout, pool, env, a);
  // Pass 2's mapping by the rows it may park (at most n_rows).
  const int64_t parked = std::min<int64_t>(g.ring_size, g.n_rows);
  const int park_chunks = row_chunks(
      std::min<int64_t>(g.n_rows, parked * std::min<int64_t>(g.num_reqs, g.n_rows)),
      DSV4_LR_WIDE_PAIR_ROWS_MIN, env);
  const int park_threads = low_ratio::row_threads(park_chunks);
  const int64_t park_rows = block_rows(parked, park_threads);
  a.park_blocks = (parked + park_rows - 1) / park_rows;
  DSV4_CHECK(a.park_blocks * g.num_reqs <= int64_t(0x7fffffff), kC2PrefillOp, "extend_seq_lens",
             "has too many requests (", g.num_reqs, ") for ring_size ", g.ring_size);
  const dim3 park_grid(unsigned(a.park_blocks * g.num_reqs));
  const dim3 park_block(unsigned(park_rows * park_threads));
  if (park_chunks == low_ratio::kRowChunks)
    launch_kernel(c2_prefill_park_kernel<low_ratio::kRowChunks>, park_grid, park_block, 0,
                  env.stream, env.pdl, a);
  else
    launch_kernel(c2_prefill_park_kernel<1>, park_grid, park_block, 0, env.stream, env.pdl, a);
  DSV4_CHECK_LAUNCH();
}

void low_ratio_index_k_store_cuda(const at::Tensor& k, const at::Tensor& norm_weight, double eps,
                                  const at::Tensor& freqs, const at::Tensor& positions,
                                  const at::Tensor& loc, at::Tensor& cache, int64_t page_size,
                                  int64_t ratio, int64_t dcp_world_size, int64_t dcp_rank,
                                  int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_index_k_args(k, norm_weight, eps, freqs, positions, loc, cache, page_size, ratio,
                         {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  if (g.n_rows == 0 || g.num_pages == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(cache.device());
  IndexKKernelArgs a;
  a.k = static_cast<const uint16_t*>(k.data_ptr());
  a.norm_weight = norm_weight.data_ptr();
  a.freqs = freqs.data_ptr<float>();
  a.positions = positions.data_ptr();
  a.loc = loc.data_ptr();
  a.cache = cache_bytes(cache);
  a.n_rows = g.n_rows;
  a.max_pos = g.max_pos;
  a.num_pages = g.num_pages;
  a.page_bytes = g.page_bytes;
  a.page_size = g.page_size;
  a.log2_page_size = g.log2_page_size;
  a.dcp = g.dcp;
  a.ratio = g.ratio;
  a.eps = float(eps);
  a.w_bf16 = g.w_bf16;
  a.pos64 = g.pos64;
  a.loc64 = g.loc64;
  a.vec_in = aligned(a.k, 8) && aligned(a.norm_weight, 16) && aligned(a.freqs, 16);
  a.vec_out = aligned(a.cache, 2) && g.page_bytes % 2 == 0;
  const LaunchEnv env = launch_env(cache);
  const RowLaunch l = row_launch(g.n_rows, kLaneGroup, env, kIndexKOp, "k");
  if (g.ratio == 1)
    launch_kernel(low_ratio_index_k_store_kernel<1>, l.grid, l.block, 0, env.stream, env.pdl, a);
  else
    launch_kernel(low_ratio_index_k_store_kernel<2>, l.grid, l.block, 0, env.stream, env.pdl, a);
  DSV4_CHECK_LAUNCH();
}

void kv_store_cuda(const at::Tensor& x, const at::Tensor& loc,
                   const std::optional<at::Tensor>& freqs_rows, at::Tensor& kvcache,
                   int64_t page_size, c10::string_view layout, int64_t dcp_world_size,
                   int64_t dcp_rank, int64_t dcp_interleave) {
  const LowRatioGeometry g =
      check_kv_store_args(x, loc, freqs_rows, kvcache, page_size, layout,
                          {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  if (g.n_rows == 0 || g.num_pages == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(kvcache.device());
  KvStoreKernelArgs a;
  a.x = x.data_ptr();
  a.loc = loc.data_ptr();
  a.freqs_rows = g.has_freqs_rows ? freqs_rows->data_ptr<float>() : nullptr;
  a.cache = cache_bytes(kvcache);
  a.n_rows = g.n_rows;
  a.num_pages = g.num_pages;
  a.page_bytes = g.page_bytes;
  a.rows = layout_row_addressing(g.layout, g.page_size);
  a.log2_page_size = g.log2_page_size;
  a.dcp = g.dcp;
  a.loc64 = g.loc64;
  a.vec_in = aligned(a.x, 16) && (a.freqs_rows == nullptr || aligned(a.freqs_rows, 16));
  a.vec_out = aligned(a.cache, 8) && g.page_bytes % 8 == 0;
  const LaunchEnv env = launch_env(kvcache);
  launch_for_encoding<KvStoreKernels>(
      g.layout, latent_row_launch(g.n_rows, DSV4_LR_WIDE_ROWS_MIN, env, kKvStoreOp, "x"), env, a,
      g.x_bf16);
  DSV4_CHECK_LAUNCH();
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("c1_norm_rope_store", &dsv4::c1_norm_rope_store_cuda);
  m.impl("c2_norm_rope_store", &dsv4::c2_norm_rope_store_cuda);
  m.impl("c2_prefill_norm_rope_store", &dsv4::c2_prefill_norm_rope_store_cuda);
  m.impl("low_ratio_index_k_store", &dsv4::low_ratio_index_k_store_cuda);
  m.impl("kv_store", &dsv4::kv_store_cuda);
}
