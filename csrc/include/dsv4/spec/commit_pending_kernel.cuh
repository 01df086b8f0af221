// online_c128_mtp_commit_pending on the GPU (docs/contract.md 10.4): a block per batch entry
// copies the bank of its accepted prefix into the main slot, 16 bytes a thread (a state row
// is 3 * head_dim elements, a multiple of 16 bytes for either dtype).
#pragma once

#include "../spec_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace spec {

constexpr int kCommitBlock = 128;

__global__ void __launch_bounds__(kCommitBlock) commit_pending_kernel(const CommitPendingParams p) {
  pdl_wait();
  const CommitMove m = commit_move(p, blockIdx.x);
  if (m.src >= 0) {
    const int64_t words = p.row_bytes / 16;
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.state) +
                                                      m.src * p.row_bytes);
    uint4* dst = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.state) + m.dst * p.row_bytes);
    for (int64_t i = threadIdx.x; i < words; i += kCommitBlock) dst[i] = src[i];
  }
  pdl_trigger();
}

}  // namespace spec
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
