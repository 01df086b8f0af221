// compress_forward on CUDA / HIP: argument checks (shared with the CPU glue), device guard,
// current stream, PDL-aware launches of the kernels in include/dsv4/compress_kernels.cuh.
// No host sync, no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "compress/compress_checks.h"
#include "cuda_glue.h"
#include "include/dsv4/compress_kernels.cuh"

namespace dsv4 {
namespace compress {
namespace {

inline unsigned grid_1d(int64_t n) { return static_cast<unsigned>(n); }

// Every pass of one call (kHd: the pooling kernels' compile-time head_dim).
template <typename TS, typename TI, int kHd>
void launch_all(const CallShape& cs, const Params& base, const at::Tensor& plan,
                const std::optional<at::Tensor>& plan_w, gpuStream_t stream, bool pdl) {
  const dim3 block(kBlock);
  const Params p = pass_params(base, plan, true);
  if (cs.online) {
    if (cs.decode) {
      const int64_t per_block = kBlock / (kHd / kVec);
      launch_kernel(online_decode_kernel<TS, TI>, dim3(grid_1d((p.num_records + per_block - 1) / per_block)),
                    block, 0, stream, pdl, p);
      DSV4_CHECK_LAUNCH();
    } else {
      launch_kernel(c128_kernel<TS, TI, kModeOnline, kHd>, dim3(grid_1d(c128_blocks(p.num_records, kHd))),
                    dim3(kC128Block), 0, stream, pdl, p);
      DSV4_CHECK_LAUNCH();
      Params pw = pass_params(base, *plan_w, false);
      pw.online_store = 1;
      launch_kernel(c128_kernel<TS, TI, kModeOnline, kHd>, dim3(grid_1d(c128_blocks(pw.num_records, kHd))),
                    dim3(kC128Block), 0, stream, pdl, pw);
      DSV4_CHECK_LAUNCH();
    }
    return;
  }
  if (cs.cr == 4) {
    const int64_t per_block = kC4Block / (kHd / kVec);
    const dim3 grid(grid_1d((p.num_records + per_block - 1) / per_block));
    if (cs.decode)
      launch_kernel(c4_kernel<TS, TI, true, kHd>, grid, dim3(kC4Block), 0, stream, pdl, p);
    else
      launch_kernel(c4_kernel<TS, TI, false, kHd>, grid, dim3(kC4Block), 0, stream, pdl, p);
  } else {
    const dim3 grid(grid_1d(c128_blocks(p.num_records, kHd)));
    if (cs.decode)
      launch_kernel(c128_kernel<TS, TI, kModeDecode, kHd>, grid, dim3(kC128Block), 0, stream, pdl, p);
    else
      launch_kernel(c128_kernel<TS, TI, kModePrefill, kHd>, grid, dim3(kC128Block), 0, stream, pdl, p);
  }
  DSV4_CHECK_LAUNCH();
  if (!cs.decode) {
    // Writes strictly after every compress read of this call (stream order / PDL wait).
    Params pw = pass_params(base, *plan_w, false);
    pw.after_pool = p.num_records > 0 ? 1 : 0;  // the pooling kernel was launched just before
    const int64_t blocks = std::min<int64_t>((pw.num_records + kWriteGroups - 1) / kWriteGroups, 2048);
    if (cs.cr == 4)
      launch_kernel(write_rows_kernel<TS, TI, 4 * kHd>, dim3(grid_1d(blocks)), block, 0, stream, pdl, pw);
    else
      launch_kernel(write_rows_kernel<TS, TI, 2 * kHd>, dim3(grid_1d(blocks)), block, 0, stream, pdl, pw);
    DSV4_CHECK_LAUNCH();
  }
}

template <typename TS, typename TI>
void launch_all(const CallShape& cs, const Params& base, const at::Tensor& plan,
                const std::optional<at::Tensor>& plan_w, gpuStream_t stream, bool pdl) {
  if (cs.hd == 512)
    launch_all<TS, TI, 512>(cs, base, plan, plan_w, stream, pdl);
  else
    launch_all<TS, TI, 128>(cs, base, plan, plan_w, stream, pdl);
}

void compress_forward_cuda(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                           const at::Tensor& ape, const at::Tensor& plan,
                           const std::optional<at::Tensor>& plan_w, at::Tensor out,
                           int64_t head_dim, int64_t compress_ratio, bool is_online) {
  const CallShape cs = check_compress_forward(kv_score_buffer, kv_score_input, ape, plan, plan_w,
                                              out, head_dim, compress_ratio, is_online);
  DSV4_CHECK(kv_score_buffer.is_cuda(), kOp, "kv_score_buffer",
             "must be a CUDA tensor for the CUDA kernel, got ", kv_score_buffer.device());
  check_gpu_alignment(kv_score_buffer, kv_score_input, ape, plan, plan_w, out);
  const c10::cuda::OptionalCUDAGuard guard(kv_score_buffer.device());
  const Params base = make_params(cs, kv_score_buffer, kv_score_input, ape, out);
  const gpuStream_t stream = current_stream(kv_score_buffer);
  const bool pdl = pdl_enabled(kv_score_buffer);
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  if (!st_bf16 && !in_bf16)
    launch_all<float, float>(cs, base, plan, plan_w, stream, pdl);
  else if (!st_bf16 && in_bf16)
    launch_all<float, uint16_t>(cs, base, plan, plan_w, stream, pdl);
  else if (st_bf16 && !in_bf16)
    launch_all<uint16_t, float>(cs, base, plan, plan_w, stream, pdl);
  else
    launch_all<uint16_t, uint16_t>(cs, base, plan, plan_w, stream, pdl);
}

}  // namespace
}  // namespace compress
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_forward", &dsv4::compress::compress_forward_cuda);
}
