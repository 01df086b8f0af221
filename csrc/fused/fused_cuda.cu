// compress_and_store on CUDA / HIP (contract 11): the checks of both halves (fused_checks.h),
// then
//  * c4 and online cr 128 decode (every store format and V4.1 layout): one launch of a fused
//    kernel (include/dsv4/fused/), compress_forward's pooling of a block's records followed
//    by compress_norm_rope_store's store of them;
//  * offline prefill: two launches (launch_fused_prefill);
//  * otherwise (c128 offline decode, online prefill):
//    compress_forward's launches and then compress_norm_rope_store's, the store a programmatic
//    dependent launch (docs/design/fused.md).
// Both run the pair's device code on the pair's arguments: the pair's bytes. The pooled rows
// live in `out` or in a scratch of kv_score_input's dtype from the caching allocator. No host
// sync, no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "compress/compress_launch.h"
#include "cuda_glue.h"
#include "fused/fused_checks.h"
#include "include/dsv4/fused/kernel_set.cuh"
#include "include/dsv4/fused/spread_store.cuh"
#include "store/store_launch.h"

namespace dsv4 {
namespace {

fused::KernelSet fused_kernels(bool st_bf16, bool in_bf16) {
  if (!st_bf16 && !in_bf16) return fused::kernel_set<float, float>();
  if (!st_bf16) return fused::kernel_set<float, uint16_t>();
  if (!in_bf16) return fused::kernel_set<uint16_t, float>();
  return fused::kernel_set<uint16_t, uint16_t>();
}

// The one-launch decode (c4, online cr 128) when it applies; false: the caller launches the
// pair's kernels.
bool launch_fused_decode(const FusedShape& f, bool out_given,
                         const at::Tensor& kv_score_buffer, const at::Tensor& kv_score_input,
                         const at::Tensor& ape, const at::Tensor& plan, const at::Tensor& rows,
                         const at::Tensor& norm_weight, const at::Tensor& freqs,
                         const at::Tensor& out_loc, const at::Tensor& kvcache,
                         int64_t compress_ratio, double eps, const LaunchEnv& env) {
  const compress::CallShape& cs = f.cs;
  if (!cs.decode || !(cs.cr == 4 || cs.online)) return false;
  const int format = store_kernel_format(f.g);
  compress::Params p = compress::pass_params(
      compress::make_params(cs, kv_score_buffer, kv_score_input, ape, rows), plan, true);
  if (!out_given && fused::stores_from_registers(format)) p.out = nullptr;  // rows not kept
  const StoreKernelArgs a = store_kernel_args(f.g, rows, plan, norm_weight, freqs, out_loc,
                                              kvcache, true, compress_ratio, eps);
  const fused::KernelSet k = fused_kernels(kv_score_buffer.scalar_type() == at::kBFloat16,
                                           kv_score_input.scalar_type() == at::kBFloat16);
  const int64_t n = p.num_records;
  const int to = rows.scalar_type() == at::kBFloat16 ? 1 : 0;
  if (cs.online) {
    const int64_t per_block = compress::online_decode_per_block(cs.hd);
    launch_kernel(k.online_decode[to][format], dim3(unsigned((n + per_block - 1) / per_block)),
                  dim3(compress::kBlock), 0, env.stream, env.pdl, p, a);
  } else {
    const int64_t per_block = compress::kC4Block / (cs.hd / compress::kVec);
    launch_kernel(k.c4_decode[to][format], dim3(unsigned((n + per_block - 1) / per_block)),
                  dim3(compress::kC4Block), 0, env.stream, env.pdl, p, a);
  }
  DSV4_CHECK_LAUNCH();
  return true;
}

// The offline prefill in two launches when it applies; false: the caller launches the pair's
// kernels (online prefill). cr 4: the pooling-and-store kernel, then compress_forward's row
// writes; cr 128: compress_forward's pooling, then the row writes and the store in one grid.
bool launch_fused_prefill(const FusedShape& f, bool out_given,
                          const at::Tensor& kv_score_buffer, const at::Tensor& kv_score_input,
                          const at::Tensor& ape, const at::Tensor& plan,
                          const std::optional<at::Tensor>& plan_w,
                          const at::Tensor& rows, const at::Tensor& norm_weight,
                          const at::Tensor& freqs, const at::Tensor& out_loc,
                          const at::Tensor& kvcache, int64_t compress_ratio, double eps,
                          const LaunchEnv& env) {
  const compress::CallShape& cs = f.cs;
  if (cs.decode || cs.online) return false;  // plan_w is there (check_compress_forward)
  const int format = store_kernel_format(f.g);
  const compress::Params base =
      compress::make_params(cs, kv_score_buffer, kv_score_input, ape, rows);
  const StoreKernelArgs a = store_kernel_args(f.g, rows, plan, norm_weight, freqs, out_loc,
                                              kvcache, false, compress_ratio, eps);
  const fused::KernelSet k = fused_kernels(kv_score_buffer.scalar_type() == at::kBFloat16,
                                           kv_score_input.scalar_type() == at::kBFloat16);
  const int to = rows.scalar_type() == at::kBFloat16 ? 1 : 0;
  if (cs.cr == 4) {
    compress::Params p = compress::pass_params(base, plan, true);
    if (!out_given && fused::stores_from_registers(format)) p.out = nullptr;
    launch_kernel(k.c4_prefill[to][format],
                  dim3(unsigned(compress::c4_prefill_blocks(p.num_records, cs.hd, env.sms))),
                  dim3(compress::kC4Block), 0, env.stream, env.pdl, p, a);
    DSV4_CHECK_LAUNCH();
    compress::launch_compress_row_writes(cs, kv_score_buffer, kv_score_input, ape, plan, *plan_w,
                                         rows, env);
    return true;
  }
  compress::launch_compress_pooling(cs, kv_score_buffer, kv_score_input, ape, plan, plan_w, rows,
                                    env);
  const compress::Params pw = compress::row_write_params(base, plan, *plan_w);
  const int64_t store_blocks = fused::write_store_blocks(a.n_rows, env.sms);
  const int64_t blocks = store_blocks + compress::lane_group_blocks(pw.num_records);
  launch_kernel(k.write_rows_store[to][format], dim3(unsigned(blocks)), dim3(compress::kBlock), 0,
                env.stream, env.pdl, pw, a, int(store_blocks));
  DSV4_CHECK_LAUNCH();
  return true;
}

void compress_and_store_cuda(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                             const at::Tensor& ape, const at::Tensor& plan,
                             const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& norm_weight, const at::Tensor& freqs,
                             const at::Tensor& out_loc, at::Tensor kvcache,
                             const std::optional<at::Tensor>& out, int64_t head_dim,
                             int64_t compress_ratio, bool is_online, double eps,
                             int64_t page_size, c10::string_view store_format,
                             c10::string_view layout, int64_t dcp_world_size, int64_t dcp_rank,
                             int64_t dcp_interleave) {
  DSV4_CHECK(kv_score_buffer.is_cuda(), kFusedOp, "kv_score_buffer",
             "must be a CUDA tensor for the CUDA kernel, got ", kv_score_buffer.device());
  const c10::cuda::OptionalCUDAGuard guard(kv_score_buffer.device());
  const at::Tensor rows = fused_rows(kv_score_input, plan, out, head_dim);
  const FusedShape f = check_fused_args(
      kv_score_buffer, kv_score_input, ape, plan, plan_w, norm_weight, freqs, out_loc, kvcache,
      rows, out.has_value(), head_dim, compress_ratio, is_online, eps, page_size, store_format,
      layout, {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  compress::check_gpu_alignment(kv_score_buffer, kv_score_input, ape, plan, plan_w, rows,
                                kFusedOp);
  const LaunchEnv env = launch_env(kv_score_buffer);
  if (launch_fused_decode(f, out.has_value(), kv_score_buffer, kv_score_input, ape, plan, rows,
                          norm_weight, freqs, out_loc, kvcache, compress_ratio, eps, env))
    return;
  if (launch_fused_prefill(f, out.has_value(), kv_score_buffer, kv_score_input, ape, plan, plan_w,
                           rows, norm_weight, freqs, out_loc, kvcache, compress_ratio, eps, env))
    return;
  compress::launch_compress_forward(f.cs, kv_score_buffer, kv_score_input, ape, plan, plan_w,
                                    rows, env);
  launch_compress_norm_rope_store(f.g, rows, plan, norm_weight, freqs, out_loc, kvcache,
                                  !plan_w.has_value(), compress_ratio, eps, env);
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_and_store", &dsv4::compress_and_store_cuda);
}
