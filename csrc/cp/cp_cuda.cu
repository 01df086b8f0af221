// compress_partials and merge_partials on CUDA / HIP (docs/contract.md 8): argument checks
// (shared with the CPU glue), device guard, current stream, PDL-aware launches of the kernels
// in include/dsv4/cp/. No host sync, no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "cp/cp_checks.h"
#include "cuda_glue.h"
#include "include/dsv4/cp/merge_kernel.cuh"
#include "include/dsv4/cp/partials_kernel.cuh"

namespace dsv4 {
namespace cp {
namespace {

using PartialsKernel = void (*)(const PartialsParams);

template <typename TS, typename TI>
PartialsKernel partials_kernel(int hd, int cr) {
  if (hd == 512)
    return cr == 4 ? cp_partials_kernel<TS, TI, 512, 4> : cp_partials_kernel<TS, TI, 512, 128>;
  return cr == 4 ? cp_partials_kernel<TS, TI, 128, 4> : cp_partials_kernel<TS, TI, 128, 128>;
}

void compress_partials_cuda(const at::Tensor& kv_score_buffer, const at::Tensor& kv_score_input,
                            const at::Tensor& input_rows, const at::Tensor& ape,
                            const at::Tensor& plan_c, const at::Tensor& plan_w,
                            at::Tensor partials, at::Tensor persist_rows, int64_t head_dim,
                            int64_t compress_ratio, bool read_state) {
  const PartialsParams p =
      check_compress_partials(kv_score_buffer, kv_score_input, input_rows, ape, plan_c, plan_w,
                              partials, persist_rows, head_dim, compress_ratio, read_state);
  DSV4_CHECK(kv_score_buffer.is_cuda(), kPartialsOp, "kv_score_buffer",
             "must be a CUDA tensor for the CUDA kernel, got ", kv_score_buffer.device());
  // 16-byte (fp32) / 8-byte (bf16, fp16) vector accesses.
  const std::pair<const at::Tensor*, const char*> vectors[] = {
      {&kv_score_buffer, "kv_score_buffer"}, {&kv_score_input, "kv_score_input"}, {&ape, "ape"},
      {&partials, "partials"}, {&persist_rows, "persist_rows"}};
  for (const auto& v : vectors) compress::check_vector_aligned(*v.first, v.second, kPartialsOp);
  DSV4_CHECK(aligned(plan_c.data_ptr(), 16), kPartialsOp, "plan_c",
             "must start on a 16-byte boundary");
  DSV4_CHECK(aligned(plan_w.data_ptr(), 8), kPartialsOp, "plan_w",
             "must start on an 8-byte boundary");
  const c10::cuda::OptionalCUDAGuard guard(kv_score_buffer.device());
  const LaunchEnv env = launch_env(kv_score_buffer);
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  const PartialsKernel kernel =
      !st_bf16 ? (!in_bf16 ? partials_kernel<float, float>(p.hd, p.cr)
                           : partials_kernel<float, uint16_t>(p.hd, p.cr))
               : (!in_bf16 ? partials_kernel<uint16_t, float>(p.hd, p.cr)
                           : partials_kernel<uint16_t, uint16_t>(p.hd, p.cr));
  const int64_t blocks = pool_blocks(p.num_windows, p.hd) + persist_blocks(p.num_persist);
  launch_kernel(kernel, dim3(unsigned(blocks)), dim3(kCpBlock), 0, env.stream, env.pdl, p);
  DSV4_CHECK_LAUNCH();
}

void merge_partials_cuda(const at::Tensor& partials, const std::optional<at::Tensor>& max_m,
                         at::Tensor out) {
  const MergeParams p = check_merge_partials(partials, max_m, out);
  DSV4_CHECK(partials.is_cuda(), kMergeOp, "partials",
             "must be a CUDA tensor for the CUDA kernel, got ", partials.device());
  const c10::cuda::OptionalCUDAGuard guard(partials.device());
  const LaunchEnv env = launch_env(partials);
  launch_kernel(cp_merge_kernel, dim3(unsigned(merge_blocks(p.num_elems, env.sms))),
                dim3(kMergeBlock), 0, env.stream, env.pdl, p);
  DSV4_CHECK_LAUNCH();
}

}  // namespace
}  // namespace cp
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_partials", &dsv4::cp::compress_partials_cuda);
  m.impl("merge_partials", &dsv4::cp::merge_partials_cuda);
}
