// CUDA/HIP planners: the backend of plan_ops.h around the kernels of include/dsv4/plan/ (math
// in plan_math.h, shared with the CPU).
//
// Prefill with host lengths: validate and scan on the host (counts stay on the host), one
// emission kernel; the per-request offsets go in its parameters (batch < 64, CUDA) or are
// copied to the device once (pinned, non-blocking).
// Prefill with device lengths: one kernel whose blocks each scan the lengths (<= 1023
// requests), else a one-block scan kernel + the emission kernel; no host sync (CUDA-graph
// capturable); counts stay on the device.
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "cuda_glue.h"
#include "include/dsv4/plan/block_sizes.h"
#include "include/dsv4/plan/decode_kernel.cuh"
#include "include/dsv4/plan/prefill_emit_kernel.cuh"
#include "include/dsv4/plan/prefill_fused_kernel.cuh"
#include "include/dsv4/plan/prefill_scan_kernel.cuh"
#include "plan/plan_ops.h"

namespace dsv4 {
namespace {

void check_on_gpu(const char* op, const at::Tensor& req_pool_indices) {
  DSV4_CHECK(req_pool_indices.is_cuda(), op, "req_pool_indices",
             "must be on a CUDA device (the plan device) when other inputs are, got ",
             req_pool_indices.device());
}

int64_t blocks_for(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The decode planner instance of an addressing mode (a compile-time parameter of the kernel).
using DecodeKernel = void (*)(PlanParams, const int64_t*, const int64_t*, int32_t, DecodePlan*);
DecodeKernel decode_kernel_for(Addressing a) {
  switch (a) {
    case Addressing::kSwaPaged:
      return plan_decode_kernel<kPlanBlock, Addressing::kSwaPaged>;
    case Addressing::kReqRing:
      return plan_decode_kernel<kPlanBlock, Addressing::kReqRing>;
    case Addressing::kLegacy:
      return plan_decode_kernel<kPlanBlock, Addressing::kLegacy>;
    default:
      return plan_decode_kernel<kPlanBlock, Addressing::kOnline>;
  }
}

at::Tensor decode_cuda(const char* op, const PlanParams& p, const at::Tensor& req_pool_indices,
                       const at::Tensor& seq_lens) {
  check_on_gpu(op, req_pool_indices);
  check_device(seq_lens, req_pool_indices.device(), op, "seq_lens");
  c10::cuda::OptionalCUDAGuard guard(req_pool_indices.device());
  const at::Tensor rpi = req_pool_indices.contiguous();
  const at::Tensor sl = seq_lens.contiguous();
  const int64_t B = rpi.size(0);
  DSV4_CHECK(B <= kMaxInt32, op, "req_pool_indices", "batch size must be < 2^31, got ", B);
  at::Tensor plan = at::empty({B, int64_t(sizeof(DecodePlan))}, rpi.options().dtype(at::kByte));
  const LaunchEnv env = launch_env(rpi);
  launch_kernel(decode_kernel_for(p.addressing), dim3(unsigned(blocks_for(B, kPlanBlock))),
                dim3(kPlanBlock), 0, env.stream, env.pdl, p, rpi.data_ptr<int64_t>(),
                sl.data_ptr<int64_t>(), int32_t(B),
                reinterpret_cast<DecodePlan*>(plan.data_ptr<uint8_t>()));
  DSV4_CHECK_LAUNCH();
  return plan;
}

plan::PrefillPlans prefill_cuda(
    const char* op, const PlanParams& p, const at::Tensor& req_pool_indices,
    const at::Tensor& seq_lens, const at::Tensor& extend_lens, int64_t num_q_tokens,
    bool host_lengths) {
  c10::cuda::OptionalCUDAGuard guard(req_pool_indices.device());
  const at::Tensor rpi = req_pool_indices.contiguous();
  const int64_t B = rpi.size(0);
  const at::Device dev = rpi.device();
  const LaunchEnv env = launch_env(rpi);
  plan::PrefillOutputs o = plan::prefill_outputs(p, num_q_tokens, dev);
  const std::vector<int64_t> offs_shape = {B + 1, int64_t(sizeof(ReqOffsets) / sizeof(int32_t))};
  InlineOffsets inl{};
  const ReqOffsets* offs = nullptr;  // nullptr: the kernel reads `inl`
  at::Tensor offs_dev, counts = at::empty({2}, seq_lens.options().dtype(at::kInt));
#if defined(DSV4_HIP)
  const bool inline_offsets = false;  // HIP has no __grid_constant__: use the device buffer
#else
  const bool inline_offsets = host_lengths && B + 1 <= kInlineOffsets;
#endif
  if (inline_offsets) {
    plan::host_request_offsets(op, p, seq_lens, extend_lens, num_q_tokens, inl.r);
    counts.data_ptr<int32_t>()[0] = inl.r[B].c;
    counts.data_ptr<int32_t>()[1] = inl.r[B].w;
  } else if (host_lengths) {
    at::Tensor offs_host =
        at::empty(offs_shape, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
    ReqOffsets* h = reinterpret_cast<ReqOffsets*>(offs_host.data_ptr<int32_t>());
    plan::host_request_offsets(op, p, seq_lens, extend_lens, num_q_tokens, h);
    counts.data_ptr<int32_t>()[0] = h[B].c;
    counts.data_ptr<int32_t>()[1] = h[B].w;
    offs_dev = at::empty(offs_shape, rpi.options().dtype(at::kInt));
    offs_dev.copy_(offs_host, /*non_blocking=*/true);
    offs = reinterpret_cast<const ReqOffsets*>(offs_dev.data_ptr<int32_t>());
  } else {
    // Lengths on the device: one fused kernel for small batches, else a scan, then the emit.
    const at::Tensor sl = seq_lens.contiguous();
    const at::Tensor el = extend_lens.contiguous();
    if (B <= kFusedBatch) {
      // At least one block, even without plan rows: block 0 writes the counts.
      launch_kernel(plan_prefill_fused_kernel<kPlanBlock>,
                    dim3(unsigned(std::max<int64_t>(1, blocks_for(num_q_tokens, kPlanBlock)))),
                    dim3(kPlanBlock), 0, env.stream, env.pdl, p, rpi.data_ptr<int64_t>(),
                    sl.data_ptr<int64_t>(), el.data_ptr<int64_t>(), int32_t(B), num_q_tokens,
                    counts.data_ptr<int32_t>(), o.plan_c.data_ptr<uint8_t>(),
                    o.plan_w.data_ptr<uint8_t>());
      DSV4_CHECK_LAUNCH();
      return {o.plan_c, o.plan_w, counts};
    }
    offs_dev = at::empty(offs_shape, rpi.options().dtype(at::kInt));
    int64_t threads = ((B + 63) / 64) * 64;
    threads = threads < 64 ? 64 : (threads > kPlanScanBlock ? kPlanScanBlock : threads);
    launch_kernel(plan_prefill_scan_kernel<kPlanScanBlock>, dim3(1), dim3(unsigned(threads)), 0,
                  env.stream, env.pdl, p, sl.data_ptr<int64_t>(), el.data_ptr<int64_t>(),
                  int32_t(B), num_q_tokens,
                  reinterpret_cast<ReqOffsets*>(offs_dev.data_ptr<int32_t>()),
                  counts.data_ptr<int32_t>());
    DSV4_CHECK_LAUNCH();
    offs = reinterpret_cast<const ReqOffsets*>(offs_dev.data_ptr<int32_t>());
  }
  launch_kernel(plan_prefill_emit_kernel<kPlanBlock>,
                dim3(unsigned(blocks_for(num_q_tokens, kPlanBlock))), dim3(kPlanBlock), 0,
                env.stream, env.pdl, p, rpi.data_ptr<int64_t>(), offs, inl, int32_t(B),
                int32_t(num_q_tokens), o.plan_c.data_ptr<uint8_t>(), o.plan_w.data_ptr<uint8_t>());
  DSV4_CHECK_LAUNCH();
  return {o.plan_c, o.plan_w, counts};
}

struct CudaPlanner {
  static void check_plan_device(const char* op, const at::Tensor& req_pool_indices) {
    check_on_gpu(op, req_pool_indices);
  }
  static at::Tensor decode(const char* op, const PlanParams& p,
                           const at::Tensor& req_pool_indices, const at::Tensor& seq_lens) {
    return decode_cuda(op, p, req_pool_indices, seq_lens);
  }
  static plan::PrefillPlans prefill(const char* op, const PlanParams& p,
                                    const at::Tensor& req_pool_indices,
                                    const at::Tensor& seq_lens, const at::Tensor& extend_lens,
                                    int64_t num_q_tokens, bool host_lengths) {
    return prefill_cuda(op, p, req_pool_indices, seq_lens, extend_lens, num_q_tokens,
                        host_lengths);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { plan::register_planner_ops<CudaPlanner>(m); }

}  // namespace dsv4
