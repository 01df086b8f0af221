// compress_forward on CUDA / HIP: argument checks (shared with the CPU glue), device guard,
// current stream, PDL-aware launches of the kernels in include/dsv4/compress/ (one header per
// kernel; their instances are compiled in csrc/compress/instantiations/ and reached through
// kernel_set, see include/dsv4/compress/kernel_set.cuh).
// No host sync, no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "compress/compress_checks.h"
#include "compress/compress_launch.h"
#include "cuda_glue.h"
#include "include/dsv4/compress/kernel_set.cuh"

namespace dsv4 {
namespace compress {
namespace {

inline dim3 grid_1d(int64_t blocks) { return dim3(static_cast<unsigned>(blocks)); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every pass of one call (kHd: the pooling kernels' compile-time head_dim).
template <typename TS, typename TI, int kHd>
void launch_all(const CallShape& cs, const Params& base, const at::Tensor& plan,
                const std::optional<at::Tensor>& plan_w, const LaunchEnv& env) {
  const Params p = pass_params(base, plan, true);
  const KernelSet k = kernel_set<TS, TI, kHd>();
  const auto launch = [&](Kernel kernel, int64_t blocks, int threads, const Params& args) {
    launch_kernel(kernel, grid_1d(blocks), dim3(threads), 0, env.stream, env.pdl, args);
    DSV4_CHECK_LAUNCH();
  };
  // c128 prefill / online: records per block (c128_records_per_block) set the grid.
  const auto launch_c128_records = [&](Kernel kernel, Params args) {
    args.records_per_block = c128_records_per_block(args.num_records, kHd, env.sms);
    launch(kernel, c128_record_blocks(args.num_records, kHd, args.records_per_block), kC128Block,
           args);
  };
  if (cs.online && cs.decode) {
    launch(kernel_set<TS, TI, 512>().online_decode, ceil_div(p.num_records, kBlock / (kHd / kVec)),
           kBlock, p);
    return;
  }
  if (cs.online) {
    // Closed chunks (plan_c, output rows), then the open segments' states (plan_w).
    Params pw = pass_params(base, *plan_w, false);
    pw.online_store = 1;
    launch_c128_records(k.c128_online, p);
    launch_c128_records(k.c128_online, pw);
    return;
  }
  if (cs.cr == 4) {
    const int64_t groups = ceil_div(p.num_records, kC4Block / (kHd / kVec));
    if (cs.decode) {
      // One wave of resident blocks: the next kernel may launch as soon as the row copies are
      // out, its blocks take slots this grid leaves free. With more blocks they would take
      // slots of this grid's later blocks, which measured slower (docs/design/c4_pooling.md).
      Params pd = p;
      pd.early_trigger = groups <= int64_t(DSV4_C4_MIN_BLOCKS) * env.sms ? 1 : 0;
      launch(k.c4_decode, groups, kC4Block, pd);
    } else {  // resident blocks: DSV4_C4_MIN_BLOCKS per SM
      launch(k.c4_prefill,
             strided_unit_groups(groups, 1, DSV4_C4_MIN_BLOCKS * env.sms, kC4MaxTurns), kC4Block,
             p);
    }
  } else if (cs.decode) {
    Params pd = p;
    const int64_t groups = c128_decode_groups(p.num_records, kHd, env.sms);
    pd.records_per_block = c128_decode_records_per_block(p.num_records, groups);
    launch(k.c128_decode, c128_decode_blocks(p.num_records, kHd, groups), kC128Block, pd);
  } else {
    launch_c128_records(k.c128_prefill, p);
  }
  if (!cs.decode) {
    // Writes strictly after every compress read of this call (stream order / PDL wait).
    Params pw = pass_params(base, *plan_w, false);
    pw.after_pool = p.num_records > 0 ? 1 : 0;  // the pooling kernel was launched just before
    const int64_t blocks = std::min<int64_t>(ceil_div(pw.num_records, kWriteGroups), 2048);
    launch(cs.cr == 4 ? k.write_c4_rows : k.write_c128_rows, blocks, kBlock, pw);
  }
}

template <typename TS, typename TI>
void launch_all(const CallShape& cs, const Params& base, const at::Tensor& plan,
                const std::optional<at::Tensor>& plan_w, const LaunchEnv& env) {
  if (cs.hd == 512)
    launch_all<TS, TI, 512>(cs, base, plan, plan_w, env);
  else
    launch_all<TS, TI, 128>(cs, base, plan, plan_w, env);
}

}  // namespace

void launch_compress_forward(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env) {
  const Params base = make_params(cs, kv_score_buffer, kv_score_input, ape, out);
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  if (!st_bf16 && !in_bf16)
    launch_all<float, float>(cs, base, plan, plan_w, env);
  else if (!st_bf16 && in_bf16)
    launch_all<float, uint16_t>(cs, base, plan, plan_w, env);
  else if (st_bf16 && !in_bf16)
    launch_all<uint16_t, float>(cs, base, plan, plan_w, env);
  else
    launch_all<uint16_t, uint16_t>(cs, base, plan, plan_w, env);
}

namespace {

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
  launch_compress_forward(cs, kv_score_buffer, kv_score_input, ape, plan, plan_w, out,
                          launch_env(kv_score_buffer));
}

}  // namespace
}  // namespace compress
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_forward", &dsv4::compress::compress_forward_cuda);
}
