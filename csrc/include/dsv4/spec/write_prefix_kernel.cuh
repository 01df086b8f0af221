// online_c128_mtp_write_prefix_states on the GPU (docs/contract.md 10.2): a thread per channel,
// kStageBlock channels a block, grid (batch, head_dim / kStageBlock). A thread issues the loads
// of up to kStageBurst verify tokens before it folds them one at a time (spec_math.h, the
// online decode fold), so the state after each token is the row online decode stores.
#pragma once

#include "../spec_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace spec {

constexpr int kStageBlock = 128;
constexpr int kStageBurst = 8;

template <typename TS, typename TI>
__global__ void __launch_bounds__(kStageBlock) write_prefix_kernel(const WritePrefixParams p) {
  pdl_wait();
  const int64_t b = blockIdx.x;
  const int c = int(blockIdx.y) * kStageBlock + int(threadIdx.x);
  const StageEntry e = stage_entry(p, b);
  if (!e.active || c >= p.hd) return;
  compress::SoftmaxState s = stage_start<TS>(p, e, c);
  for (int64_t step0 = 0; step0 < p.verify; step0 += kStageBurst) {
    float kv[kStageBurst], z[kStageBurst];
#pragma unroll
    for (int u = 0; u < kStageBurst; ++u)
      if (step0 + u < p.verify) stage_input<TI>(p, e, b, step0 + u, c, kv[u], z[u]);
#pragma unroll
    for (int u = 0; u < kStageBurst; ++u)
      if (step0 + u < p.verify) stage_step<TS>(p, e, step0 + u, c, kv[u], z[u], s);
  }
  pdl_trigger();
}

}  // namespace spec
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
