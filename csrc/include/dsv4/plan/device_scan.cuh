// The per-request offsets of a prefill batch computed on the GPU from device lengths, by the
// threads of one block: the same ReqOffsets as build_request_offsets() (plan_math.h, the host
// scan), so that host and device lengths give the same plans. Shared by the scan kernel and
// the fused kernel; no host sync, so CUDA-graph capturable.
#pragma once

#include "../plan_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

// Exclusive prefix sum over the block (blockDim.x <= kMax threads); `total` gets the sum of
// all values. `sh` holds kMax entries; it is free again when this returns.
template <int kMax>
DSV4_DEVICE int64_t block_exclusive_scan(int64_t v, int64_t* sh, int64_t& total) {
  const int tid = threadIdx.x;
  const int n = blockDim.x;
  sh[tid] = v;
  __syncthreads();
  for (int off = 1; off < n; off <<= 1) {
    const int64_t add = tid >= off ? sh[tid - off] : 0;
    __syncthreads();
    sh[tid] += add;
    __syncthreads();
  }
  const int64_t inclusive = sh[tid];
  total = sh[n - 1];
  __syncthreads();
  return inclusive - v;
}

// Per-request offsets of a device-lengths batch into offs[0 .. batch] (global or shared
// memory), by the threads of one block (kMax: the largest block size). Each thread owns a
// contiguous chunk of requests; two block scans (ragged offsets, then the record counts packed
// as c + (w << 32), both <= 65536). counts, if not null, gets the totals.
template <int kMax>
DSV4_DEVICE void scan_request_offsets(const PlanParams& p, const int64_t* __restrict__ seq_lens,
                                      const int64_t* __restrict__ extend_lens, int32_t batch,
                                      int64_t num_q_tokens, ReqOffsets* offs, int64_t* sh,
                                      int32_t* counts) {
  const int nthreads = blockDim.x;
  const int32_t chunk = (batch + nthreads - 1) / nthreads;
  const int32_t begin = min(batch, int32_t(threadIdx.x) * chunk);
  const int32_t end = min(batch, begin + chunk);

  int64_t local_tokens = 0;
  for (int32_t i = begin; i < end; ++i) {
    int64_t sl = seq_lens[i], el = extend_lens[i];
    sanitize_lengths(sl, el);
    local_tokens += el;
  }
  int64_t all_tokens = 0;
  int64_t tokens = block_exclusive_scan<kMax>(local_tokens, sh, all_tokens);

  int64_t local_packed = 0;
  for (int32_t i = begin; i < end; ++i) {
    int64_t sl = seq_lens[i], el = extend_lens[i];
    sanitize_lengths(sl, el);
    const int64_t tok = min64(tokens, num_q_tokens);
    tokens += el;
    const RecordCounts n = request_counts(p, sl, min64(tokens, num_q_tokens) - tok);
    offs[i] = ReqOffsets{int32_t(tok), int32_t(n.c), int32_t(n.w), int32_t(sl)};
    local_packed += n.c + (n.w << 32);
  }
  int64_t all_packed = 0;
  const int64_t base = block_exclusive_scan<kMax>(local_packed, sh, all_packed);

  int64_t c = base & 0xffffffffll, w = base >> 32;
  for (int32_t i = begin; i < end; ++i) {
    ReqOffsets r = offs[i];  // written by this thread above
    const int32_t nc = r.c, nw = r.w;
    r.c = int32_t(c);
    r.w = int32_t(w);
    offs[i] = r;
    c += nc;
    w += nw;
  }
  if (threadIdx.x == 0) {
    const int32_t total_c = int32_t(all_packed & 0xffffffffll);
    const int32_t total_w = int32_t(all_packed >> 32);
    offs[batch] = ReqOffsets{int32_t(min64(all_tokens, num_q_tokens)), total_c, total_w, 0};
    if (counts != nullptr) {
      counts[0] = total_c;
      counts[1] = total_w;
    }
  }
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
