// CPU planners: the backend of plan_ops.h around plan_math.h (the same per-item math as the GPU
// planners, so CPU and GPU plans are byte-identical).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "plan/plan_ops.h"

namespace dsv4 {
namespace {

struct CpuPlanner {
  // Every tensor of a CPU-dispatched op is on the host: nothing to check.
  static void check_plan_device(const char*, const at::Tensor&) {}

  static at::Tensor decode(const char* op, const PlanParams& p,
                           const at::Tensor& req_pool_indices, const at::Tensor& seq_lens) {
    check_device(seq_lens, req_pool_indices.device(), op, "seq_lens");
    const at::Tensor rpi = req_pool_indices.contiguous();
    const at::Tensor sl = seq_lens.contiguous();
    const int64_t B = rpi.size(0);
    at::Tensor plan = at::empty({B, int64_t(sizeof(DecodePlan))}, rpi.options().dtype(at::kByte));
    const int64_t* rp = rpi.data_ptr<int64_t>();
    const int64_t* s = sl.data_ptr<int64_t>();
    DecodePlan* out = reinterpret_cast<DecodePlan*>(plan.data_ptr<uint8_t>());
    at::parallel_for(0, B, 4096, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) out[b] = decode_record(p, rp[b], s[b]);
    });
    return plan;
  }

  // The lengths are on the host (host_lengths is always true here).
  static plan::PrefillPlans prefill(const char* op, const PlanParams& p,
                                    const at::Tensor& req_pool_indices,
                                    const at::Tensor& seq_lens, const at::Tensor& extend_lens,
                                    int64_t num_q_tokens, bool /*host_lengths*/) {
    const int64_t B = req_pool_indices.size(0);
    std::vector<ReqOffsets> offs(size_t(B) + 1);
    plan::host_request_offsets(op, p, seq_lens, extend_lens, num_q_tokens, offs.data());
    const at::Tensor rpi = req_pool_indices.contiguous();
    plan::PrefillOutputs o = plan::prefill_outputs(p, num_q_tokens, rpi.device());
    const int64_t* rp = rpi.data_ptr<int64_t>();
    uint8_t* pc = o.plan_c.data_ptr<uint8_t>();
    uint8_t* pw = o.plan_w.data_ptr<uint8_t>();
    const ReqOffsets* of = offs.data();
    at::parallel_for(0, num_q_tokens, 2048, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) plan_prefill_row(p, rp, of, int32_t(B), t, pc, pw);
    });
    at::Tensor counts = at::empty({2}, seq_lens.options().dtype(at::kInt));
    counts.data_ptr<int32_t>()[0] = offs[size_t(B)].c;
    counts.data_ptr<int32_t>()[1] = offs[size_t(B)].w;
    return {o.plan_c, o.plan_w, counts};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(dsv4, CPU, m) { plan::register_planner_ops<CpuPlanner>(m); }

}  // namespace dsv4
