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
  int64_t slot = e.slot;
  for (int64_t step0 = 0; step0 < p.verify; step0 += kStageBurst) {
    float kv[kStageBurst], z[kStageBurst];
#pragma unroll
    for (int u = 0; u < kStageBurst; ++u)
      if (step0 + u < p.verify) stage_input<TI>(p, e, b, step0 + u, c, kv[u], z[u]);
#pragma unroll
    for (int u = 0; u < kStageBurst; ++u) {
      if (step0 + u >= p.verify) break;
      const int32_t q = stage_q(e, step0 + u);
      compress::OnlineRow o;
      stage_fold<TS>(s, q, kv[u], z[u], o);
      slot += p.slot_stride;
      if (!stages_at(p, q, slot)) continue;
      TS* w = static_cast<TS*>(p.state) + slot * 3 * p.hd;
      store_from_f32(w, c, o.m);
      store_from_f32(w, p.hd + c, o.S);
      store_from_f32(w, 2 * p.hd + c, o.K);
    }
  }
  pdl_trigger();
}

}  // namespace spec
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
