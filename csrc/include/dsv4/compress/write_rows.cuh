// Offline prefill row writes (docs/contract.md 3.4, plan_w): copy input rows into state
// slots. Torch-free.
//
// write_rows_kernel<TS, TI, kRow>: kBlock = 256 threads, one 32-lane group per WritePlan
// record (grid-stride, lane_group_blocks); launched after the pooling kernel of the same call
// so that every pooling read precedes every write.
#pragma once

#include "params.cuh"
#include "vec.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// Copy input row ragged_id into state slot write_loc for every valid WritePlan record (input
// and state rows have the same width, kRow elements). One 32-lane group per record (grid-
// stride): a group reads its record once and skips an invalid one as a whole, so the planners'
// padding of num_q_tokens mostly-invalid records costs one load per group; a lane holds all
// its kRow / 32 elements of the row at once (one memory round trip per record).
// p.after_pool: this launch directly follows the pooling kernel of the same call, whose every
// block waits for the work before it (pdl_wait) before it lets this kernel start. plan_w and
// the input rows are then complete already and are read before this kernel's own pdl_wait;
// only the state writes wait for the pooling kernel's reads. Without a pooling launch before
// it (no compress record), everything waits.

// The row writes of blocks `block` of `blocks` (write_rows_kernel: its whole grid; the fused
// c128 prefill's second launch: the blocks it gives them).
template <typename TS, typename TI, int kRow>
DSV4_DEVICE void write_rows(const Params& p, int64_t block, int64_t blocks) {
  constexpr int kPerLane = kRow / (kLaneGroup * kVec);
  static_assert(kPerLane * kLaneGroup * kVec == kRow, "row vectors tile the lane group");
  if (!p.after_pool) pdl_wait();
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const auto* plan = reinterpret_cast<const WritePlan*>(p.plan);
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t stride = blocks * kWriteGroups;
  for (int64_t k = block * kWriteGroups + threadIdx.x / kLaneGroup; k < p.num_records;
       k += stride) {
    const WritePlan w = plan[k];
    const int64_t src = int64_t(w.ragged_id), dst = w.write_loc;
    if (!is_valid(w) || src >= p.num_in_rows || dst < 0 || dst >= p.num_state_rows) continue;
    const TI* from = in + src * p.in_row_stride + lane * kVec;
    TS* to = st + dst * kRow + lane * kVec;
    float x[kPerLane][kVec];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) load_vec(from + i * kLaneGroup * kVec, x[i]);
    pdl_wait();  // returns at once after the first time
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) store_vec(to + i * kLaneGroup * kVec, x[i]);
  }
  // Every block waits, also one without a record to copy: so this grid never completes before
  // the pooling kernel, and a kernel that waits for this one also waits for that one.
  pdl_wait();
  pdl_trigger();
}

template <typename TS, typename TI, int kRow>
__global__ void DSV4_COMPRESS_BOUNDS(kBlock, 2) write_rows_kernel(const Params p) {
  write_rows<TS, TI, kRow>(p, blockIdx.x, gridDim.x);
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
