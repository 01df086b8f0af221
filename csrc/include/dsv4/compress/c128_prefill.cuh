// cr = 128 pooling of record lists (docs/contract.md 3.4, 3.5): offline prefill windows
// (kModePrefill) and online segments (kModeOnline: the closing chunks into out, then the open
// segments' states with p.online_store). Torch-free.
//
// c128_prefill_kernel<TS, TI, kMode, kHd>: c128_record_blocks(records, kHd, ...) blocks of
// kC128Block = 512 threads, channel slices minor (the kHd / 64 slices of a record run side by
// side and read its rows whole, which keeps DRAM pages and TLB entries shared). A block takes
// Params::records_per_block records strided by the grid (c128_records_per_block) where there
// are many, as in a padded CUDA-graph plan: it reads their plan records at once, writes the
// zeros of the invalid ones together and pools the valid ones in turn (c128_pool.cuh), with one
// buffer of partial states and a barrier between records (a second buffer, as in decode, made
// prefill blocks slower).
#pragma once

#include "c128_pool.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

template <typename TS, typename TI, int kMode, int kHd>
__global__ void DSV4_COMPRESS_BOUNDS(kC128Block, DSV4_C128_MIN_BLOCKS)
    c128_prefill_kernel(const Params p) {
  static_assert(kMode == kModePrefill || kMode == kModeOnline, "prefill windows or segments");
  alignas(16) __shared__ C128Parts parts;
  pdl_wait();
  constexpr int kSlices = kHd / kC128Ch;
  const int64_t e0 = blockIdx.x / kSlices;
  const int c0 = int(blockIdx.x % kSlices) * kC128Ch;  // the block's channels c0 .. c0 + 63

  // Records e0 + k * stride, k < nrec.
  const int nrec = p.records_per_block > 1 ? p.records_per_block : 1;
  const int64_t stride = int64_t(gridDim.x) / kSlices;
  __shared__ CompressPlan recs[kC128MaxRecords];
  __shared__ int16_t order[kC128MaxRecords];
  __shared__ int n_pool, n_zero;
  int to_pool = 1;
  const CompressPlan* src = reinterpret_cast<const CompressPlan*>(p.plan) + e0;  // record k
  if (nrec > 1) {
    src = recs;
    c128_sort_records<kMode>(p, e0, stride, nrec, recs, order, n_pool, n_zero);
    to_pool = n_pool;
    c128_write_zero_rows<kHd>(p, e0, stride, nrec, order, n_zero, c0);
  }
  for (int i = 0; i < to_pool; ++i) {
    const int k = nrec > 1 ? order[i] : 0;
    if (i > 0) __syncthreads();  // every thread has read parts[] of the record before
    if constexpr (kMode == kModePrefill) {
      c128_pool<TS, TI, kMode, kHd>(
          p, parts, e0 + k * stride, c0,
          resolve_rows(offline_prefill_window(src[k], 128), 128, p.num_state_rows,
                       p.num_in_rows),
          OnlineSegment{}, -1);
    } else {
      const OnlineSegment seg = online_segment(src[k]);
      c128_pool<TS, TI, kMode, kHd>(p, parts, e0 + k * stride, c0,
                                    resolve_rows(seg.win, 128, p.num_state_rows, p.num_in_rows),
                                    seg, -1);
    }
  }
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
