// compress_partials on the GPU (docs/contract.md 8): one rank's online-softmax partials of every
// window of the batch's plan, and the plan_w rows it holds.
//
// cp_partials_kernel<TS, TI, kHd, kCr>: kCpBlock = 128 threads. The first pool_blocks() blocks
// pool: kHd / 4 threads per window (hd 128: 4 windows per block, hd 512: 1), each owning kVec = 4
// channels of every window row, folded in chunks of 8 rows (one rescale per chunk, as
// compress_forward folds them: include/dsv4/cp_math.h decides which rows this rank folds). The
// blocks after them copy the persisted rows, a 32-lane group per plan_w record. The batch's
// windows are as many as a plain compress_forward pools, and a window's rows are read by the
// one rank that holds them: the kernel's traffic is the rank's share of compress_forward's.
#pragma once

#include "../compress/window_rows.cuh"
#include "../cp_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace cp {

constexpr int kCpBlock = 128;                          // threads per block (both roles)
constexpr int kCpChunk = 8;                            // window rows per softmax rescale
constexpr int kCpPersistRecords = kCpBlock / kLaneGroup;  // plan_w records per block

// Blocks of each role (the launch and the kernel agree through these).
DSV4_HD int64_t pool_blocks(int64_t windows, int hd) {
  const int64_t per_block = kCpBlock / (hd / compress::kVec);
  return (windows + per_block - 1) / per_block;
}
DSV4_HD int64_t persist_blocks(int64_t records) {
  return (records + kCpPersistRecords - 1) / kCpPersistRecords;
}

// U window rows of one thread, unpacked to fp32: row u from the state at ps[u] (fs[u]), from
// the input at pi[u] (fi[u]), else kv 0 and score kAbsentScore; scores sc_off elements after
// the kv values. Unlike compress_forward's windows (compress/window_rows.cuh: load_rows), a
// rank's input rows are not consecutive, so each row has its own pointer in both sources.
template <typename TS, typename TI, int U, int V>
DSV4_DEVICE void load_rank_rows(const bool (&fs)[U], const bool (&fi)[U],
                                const TS* const (&ps)[U], const TI* const (&pi)[U],
                                int64_t sc_off, float (&kv)[U][V], float (&z)[U][V]) {
  if constexpr (std::is_same<TS, TI>::value) {
    bool on[U];
    const TS* q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      on[u] = fs[u] || fi[u];
      q[u] = fi[u] ? pi[u] : ps[u];
    }
    compress::load_rows_from<false>(on, q, sc_off, kv, z);
  } else {
    bool any_s = false;
#pragma unroll
    for (int u = 0; u < U; ++u) any_s = any_s || fs[u];
    compress::load_rows_from<false>(fi, pi, sc_off, kv, z);
    if (any_s) compress::load_rows_from<true>(fs, ps, sc_off, kv, z);
  }
}

// The partial (m | s | k) of window k over this rank's rows, channels c..c+3.
template <typename TS, typename TI, int kHd, int kCr>
DSV4_DEVICE void pool_partial(const PartialsParams& p, int64_t k, int c) {
  constexpr int V = compress::kVec;
  constexpr int kWin = kCr == 4 ? 8 : 128;
  constexpr int64_t kRow = kCr == 4 ? 4 * int64_t(kHd) : 2 * int64_t(kHd);
  constexpr int64_t kScOff = kCr == 4 ? 2 * int64_t(kHd) : int64_t(kHd);  // score after kv
  const TS* st = static_cast<const TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const CompressPlan rec = reinterpret_cast<const CompressPlan*>(p.plan_c)[k];
  const WindowRows w = compress::resolve_rows(compress::offline_prefill_window(rec, kCr), kCr,
                                              p.num_state_rows, p.num_batch_rows);
  const bool read_state = p.read_state != 0;
  const auto source = [&](int r) {
    return rank_row_source(w, kCr, r, p.input_rows, p.num_local_rows, read_state);
  };
  // A window this rank holds no row of (most windows, with more ranks) costs the input_rows
  // reads only; the threads of a window agree on every row's source (no divergence).
  bool holds = false;
  for (int r = 0; r < kWin && !holds; ++r) holds = rank_holds(source(r));
  SoftmaxState acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = holds ? compress::softmax_empty() : no_rows();
#pragma unroll 1
  for (int r0 = 0; r0 < (holds ? kWin : 0); r0 += kCpChunk) {
    bool fs[kCpChunk], fi[kCpChunk], fold[kCpChunk];
    const TS* ps[kCpChunk];
    const TI* pi[kCpChunk];
    bool any = false;
#pragma unroll
    for (int u = 0; u < kCpChunk; ++u) {
      const int r = r0 + u;
      const RowSource s = source(r);
      fs[u] = s.kind == compress::kFromState;
      fi[u] = s.kind == compress::kFromInput;
      fold[u] = s.kind != kElsewhere;
      any = any || fold[u];
      const int64_t at = compress::kv_offset(kCr, kHd, r) + c;
      ps[u] = st + (fs[u] ? s.index : 0) * kRow + at;
      pi[u] = in + (fi[u] ? s.index : 0) * kRow + at;
    }
    if (!any) continue;  // rows of other ranks only: folding them is the identity
    float kv[kCpChunk][V], z[kCpChunk][V], a[kCpChunk][V];
    load_rank_rows<TS, TI, kCpChunk, V>(fs, fi, ps, pi, kScOff, kv, z);
    compress::load_ape_rows<kCpChunk, V, kHd>(p.ape, p.ape_type, int64_t(r0) * kHd + c, a);
    compress::add_ape(a, z);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float zj[kCpChunk], kj[kCpChunk];
#pragma unroll
      for (int u = 0; u < kCpChunk; ++u) {
        zj[u] = z[u][j];
        kj[u] = kv[u][j];
      }
      compress::softmax_fold<kCpChunk>(acc[j], zj, kj, fold);
    }
  }
  float m[V], s[V], a[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    m[j] = acc[j].m;
    s[j] = acc[j].s;
    a[j] = acc[j].a;
  }
  const int64_t n = p.num_windows;
  compress::store_vec(p.partials + k * kHd + c, m);
  compress::store_vec(p.partials + (n + k) * kHd + c, s);
  compress::store_vec(p.partials + (2 * n + k) * kHd + c, a);
}

// plan_w record k: its row's bits if this rank holds it, else zeros (kRow elements of TI).
template <typename TI, int64_t kRow>
DSV4_DEVICE void copy_persist_row(const PartialsParams& p, int64_t k, int lane) {
  using R = typename compress::RawVec<TI, 4>::type;  // 16 bytes (fp32) / 8 bytes (bf16)
  constexpr int64_t kVecs = kRow / 4;
  const WritePlan rec = reinterpret_cast<const WritePlan*>(p.plan_w)[k];
  const int64_t local = persist_source(rec, p);
  R* dst = reinterpret_cast<R*>(static_cast<TI*>(p.persist) + k * kRow);
  const R* src = reinterpret_cast<const R*>(static_cast<const TI*>(p.input) +
                                            (local >= 0 ? local : 0) * kRow);
  const R zero = compress::splat_raw<TI, 4>(0u);
  for (int64_t i = lane; i < kVecs; i += kLaneGroup) dst[i] = local >= 0 ? src[i] : zero;
}

template <typename TS, typename TI, int kHd, int kCr>
__global__ void __launch_bounds__(kCpBlock) cp_partials_kernel(const PartialsParams p) {
  constexpr int kLanes = kHd / compress::kVec;
  static_assert(kCpBlock % kLanes == 0, "windows tile a block");
  pdl_wait();
  const int64_t pooling = pool_blocks(p.num_windows, kHd);
  const int t = int(threadIdx.x);
  if (int64_t(blockIdx.x) < pooling) {
    const int64_t k = int64_t(blockIdx.x) * (kCpBlock / kLanes) + t / kLanes;
    if (k < p.num_windows) pool_partial<TS, TI, kHd, kCr>(p, k, (t % kLanes) * compress::kVec);
    return;
  }
  const int64_t k = (int64_t(blockIdx.x) - pooling) * kCpPersistRecords + t / kLaneGroup;
  if (k < p.num_persist)
    copy_persist_row<TI, kCr == 4 ? 4 * int64_t(kHd) : 2 * int64_t(kHd)>(p, k, t % kLaneGroup);
}

}  // namespace cp
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
