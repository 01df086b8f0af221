// GPU planner kernels (CUDA and HIP from the same source). The per-item math is plan_math.h,
// shared with the CPU planner; these kernels only map threads onto it.
//
//   plan_decode_kernel<kBlock, kAddr> one thread per batch entry -> DecodePlan
//   plan_prefill_scan_kernel<kMax>    one block: per-request offsets + counts from device
//                                     lengths (no host sync; CUDA-graph capturable)
//   plan_prefill_emit_kernel<kBlock>  one thread per plan row: records of ragged token t and
//                                     the invalid padding of row t
//   plan_prefill_fused_kernel<kBlock> both at once for device lengths of <= 1023 requests
//
// Explicit instantiations used by the glue: DSV4_PLAN_INSTANTIATE_KERNELS() below.
#pragma once

#include "plan_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

constexpr int kPlanBlock = 256;       // decode / emit kernels (a multiple of 64)
constexpr int kPlanScanBlock = 1024;  // the scan kernel's largest block (a multiple of 64)

// kAddr: p.addressing as a compile-time constant, so that a thread runs only its addressing's
// code and reads only its parameters (a generic kernel branched on the mode and on p.online).
template <int kBlock, Addressing kAddr>
__global__ void __launch_bounds__(kBlock)
    plan_decode_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                       const int64_t* __restrict__ seq_lens, int32_t batch,
                       DecodePlan* __restrict__ out) {
  pdl_wait();
  pdl_trigger();
  const int64_t b = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (b >= batch) return;
  // Both reads go out together (load_now: not sunk below decode_record's seq_len check).
  const int64_t rid = load_now(req_pool_indices + b), seq_len = load_now(seq_lens + b);
  p.addressing = kAddr;
  p.online = kAddr == Addressing::kOnline;
  out[b] = decode_record(p, rid, seq_len);
}

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
// memory), by the threads of one block (kMax: the largest block size): the same result as
// build_request_offsets() (plan_math.h). Each thread owns a contiguous chunk of requests; two
// block scans (ragged offsets, then the record counts packed as c + (w << 32), both <= 65536).
// counts, if not null, gets the totals.
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

template <int kMax>
__global__ void __launch_bounds__(kMax)
    plan_prefill_scan_kernel(PlanParams p, const int64_t* __restrict__ seq_lens,
                             const int64_t* __restrict__ extend_lens, int32_t batch,
                             int64_t num_q_tokens, ReqOffsets* __restrict__ offs,
                             int32_t* __restrict__ counts) {
  __shared__ int64_t sh[kMax];
  pdl_wait();
  pdl_trigger();
  scan_request_offsets<kMax>(p, seq_lens, extend_lens, batch, num_q_tokens, offs, sh, counts);
}

// Device-lengths prefill of a batch of at most kFusedBatch requests in one kernel: every
// block scans the lengths into shared memory itself (a few KiB of reads), then emits its rows;
// block 0 writes the counts. Saves the scan kernel and the round trip of the offsets.
constexpr int kFusedBatch = 1023;

template <int kBlock>
__global__ void __launch_bounds__(kBlock)
    plan_prefill_fused_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                              const int64_t* __restrict__ seq_lens,
                              const int64_t* __restrict__ extend_lens, int32_t batch,
                              int64_t num_q_tokens, int32_t* __restrict__ counts,
                              uint8_t* __restrict__ plan_c, uint8_t* __restrict__ plan_w) {
  __shared__ ReqOffsets offs[kFusedBatch + 1];
  __shared__ int64_t sh[kBlock];
  pdl_wait();
  pdl_trigger();
  scan_request_offsets<kBlock>(p, seq_lens, extend_lens, batch, num_q_tokens, offs, sh,
                               blockIdx.x == 0 ? counts : nullptr);
  __syncthreads();
  const int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= num_q_tokens) return;
  plan_prefill_row(p, req_pool_indices, offs, batch, t, plan_c, plan_w);
}

// Host-lengths prefill of a small batch: the per-request offsets travel inside the emission
// kernel's parameters (CUDA: a __grid_constant__ parameter, read in place), which saves the
// pinned staging buffer, the device buffer and the host-to-device copy.
constexpr int kInlineOffsets = 64;  // batch + 1 entries, 1 KiB of parameters
struct InlineOffsets {
  ReqOffsets r[kInlineOffsets];
};

#if defined(DSV4_HIP)
#define DSV4_GRID_CONSTANT
#else
#define DSV4_GRID_CONSTANT __grid_constant__
#endif

// offs: the device offsets, or nullptr to read `inl` (CUDA only; see plan_cuda.cu).
template <int kBlock>
__global__ void __launch_bounds__(kBlock)
    plan_prefill_emit_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                             const ReqOffsets* __restrict__ offs,
                             const DSV4_GRID_CONSTANT InlineOffsets inl, int32_t batch,
                             int32_t num_rows, uint8_t* __restrict__ plan_c,
                             uint8_t* __restrict__ plan_w) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= num_rows) return;
  plan_prefill_row(p, req_pool_indices, offs != nullptr ? offs : inl.r, batch, t, plan_c, plan_w);
}

}  // namespace dsv4

// The kernel instantiations the glue launches (a HIP compile check can expand this macro at
// namespace scope of a translation unit that includes this header).
#define DSV4_PLAN_DECODE_INSTANCE(ADDR)                                                        \
  template __global__ void dsv4::plan_decode_kernel<dsv4::kPlanBlock, dsv4::Addressing::ADDR>( \
      dsv4::PlanParams, const int64_t*, const int64_t*, int32_t, dsv4::DecodePlan*);
#define DSV4_PLAN_INSTANTIATE_KERNELS()                                                        \
  DSV4_PLAN_DECODE_INSTANCE(kSwaPaged)                                                         \
  DSV4_PLAN_DECODE_INSTANCE(kReqRing)                                                          \
  DSV4_PLAN_DECODE_INSTANCE(kLegacy)                                                           \
  DSV4_PLAN_DECODE_INSTANCE(kOnline)                                                           \
  template __global__ void dsv4::plan_prefill_scan_kernel<dsv4::kPlanScanBlock>(               \
      dsv4::PlanParams, const int64_t*, const int64_t*, int32_t, int64_t, dsv4::ReqOffsets*,   \
      int32_t*);                                                                               \
  template __global__ void dsv4::plan_prefill_fused_kernel<dsv4::kPlanBlock>(                  \
      dsv4::PlanParams, const int64_t*, const int64_t*, const int64_t*, int32_t, int64_t,      \
      int32_t*, uint8_t*, uint8_t*);                                                           \
  template __global__ void dsv4::plan_prefill_emit_kernel<dsv4::kPlanBlock>(                   \
      dsv4::PlanParams, const int64_t*, const dsv4::ReqOffsets*,                               \
      const DSV4_GRID_CONSTANT dsv4::InlineOffsets,                                           \
      int32_t, int32_t, uint8_t*, uint8_t*);

#endif  // DSV4_GPU_COMPILER
