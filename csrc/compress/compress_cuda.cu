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

// The instance of a call: state type, input type, head_dim (the pooling kernels' compile-time
// head_dim).
template <typename TS, typename TI, int kHd>
struct Instance {};

// Every launch of one call but the offline prefill's plan_w row writes.
template <typename TS, typename TI, int kHd>
void launch_pooling(Instance<TS, TI, kHd>, const CallShape& cs, const Params& base,
                    const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                    const LaunchEnv& env) {
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
    if (cs.decode) {
      // One wave of resident blocks: the next kernel may launch as soon as the row copies are
      // out, its blocks take slots this grid leaves free. With more blocks they would take
      // slots of this grid's later blocks, which measured slower (docs/design/c4_pooling.md).
      const int64_t groups = ceil_div(p.num_records, kC4Block / (kHd / kVec));
      Params pd = p;
      pd.early_trigger = groups <= int64_t(DSV4_C4_MIN_BLOCKS) * env.sms ? 1 : 0;
      launch(k.c4_decode, groups, kC4Block, pd);
    } else {
      launch(k.c4_prefill, c4_prefill_blocks(p.num_records, kHd, env.sms), kC4Block, p);
    }
  } else if (cs.decode) {
    Params pd = p;
    const int64_t groups = c128_decode_groups(p.num_records, kHd, env.sms);
    pd.records_per_block = c128_decode_records_per_block(p.num_records, groups);
    launch(k.c128_decode, c128_decode_blocks(p.num_records, kHd, groups), kC128Block, pd);
  } else {
    launch_c128_records(k.c128_prefill, p);
  }
}

// The offline prefill's plan_w row writes, strictly after every compress read of this call
// (stream order / PDL wait).
template <typename TS, typename TI, int kHd>
void launch_row_writes(Instance<TS, TI, kHd>, const CallShape& cs, const Params& base,
                       const at::Tensor& plan, const at::Tensor& plan_w, const LaunchEnv& env) {
  const KernelSet k = kernel_set<TS, TI, kHd>();
  const Params pw = row_write_params(base, plan, plan_w);
  launch_kernel(cs.cr == 4 ? k.write_c4_rows : k.write_c128_rows,
                grid_1d(lane_group_blocks(pw.num_records)), dim3(kBlock), 0, env.stream, env.pdl,
                pw);
  DSV4_CHECK_LAUNCH();
}

// f(Instance<TS, TI, kHd>{}) for the call's dtypes and head_dim.
template <typename F>
void dispatch(const CallShape& cs, const at::Tensor& kv_score_buffer,
              const at::Tensor& kv_score_input, const F& f) {
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  const auto by_hd = [&](auto ts, auto ti) {
    using TS = decltype(ts);
    using TI = decltype(ti);
    if (cs.hd == 512)
      f(Instance<TS, TI, 512>{});
    else
      f(Instance<TS, TI, 128>{});
  };
  if (!st_bf16 && !in_bf16)
    by_hd(float{}, float{});
  else if (!st_bf16 && in_bf16)
    by_hd(float{}, uint16_t{});
  else if (st_bf16 && !in_bf16)
    by_hd(uint16_t{}, float{});
  else
    by_hd(uint16_t{}, uint16_t{});
}

}  // namespace

void launch_compress_pooling(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env) {
  const Params base = make_params(cs, kv_score_buffer, kv_score_input, ape, out);
  dispatch(cs, kv_score_buffer, kv_score_input,
           [&](auto instance) { launch_pooling(instance, cs, base, plan, plan_w, env); });
}

void launch_compress_row_writes(const CallShape& cs, const at::Tensor& kv_score_buffer,
                                const at::Tensor& kv_score_input, const at::Tensor& ape,
                                const at::Tensor& plan, const at::Tensor& plan_w,
                                const at::Tensor& out, const LaunchEnv& env) {
  const Params base = make_params(cs, kv_score_buffer, kv_score_input, ape, out);
  dispatch(cs, kv_score_buffer, kv_score_input,
           [&](auto instance) { launch_row_writes(instance, cs, base, plan, plan_w, env); });
}

void launch_compress_forward(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env) {
  launch_compress_pooling(cs, kv_score_buffer, kv_score_input, ape, plan, plan_w, out, env);
  if (!cs.decode && !cs.online)
    launch_compress_row_writes(cs, kv_score_buffer, kv_score_input, ape, plan, *plan_w, out, env);
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
