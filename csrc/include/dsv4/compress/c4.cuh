// cr = 4 pooling kernel (docs/contract.md 1.2, 3.4): offline prefill and offline decode.
//
// c4_kernel<TS, TI, kDecode, kHd>: kC4Block = 128 threads; one record per kHd / 4 threads
// (hd 128: 4 records per block, hd 512: 1), each thread owning kVec = 4 channels of every one
// of the 8 window rows, which it loads at once (window_rows.cuh) and folds in registers: a
// window is small enough that no partial states or merge are needed. Decode: a block per group
// of records, the step's input row copied into the state first. Prefill: the grid is
// strided_unit_groups(...) blocks, each taking its groups of records in turn, so that a padded
// plan's invalid tail costs no launch of its own.
#pragma once

#include "params.cuh"
#include "window_rows.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// Prefill (kDecode false): plan = CompressPlan rows, pool each window into out[e].
// Decode (kDecode true): plan = DecodePlan rows; copy input row e into write_loc, then pool
// the window from the state, which then holds the just-written row (the thread that writes
// channels c..c+3 of that row is the one that reads them back: program order, no barrier).
// kHd (128 / 512) is a template parameter so that every row offset is a constant.
// c4_record_group pools one block's group of kC4Block / (kHd / kVec) records; prefill: `recs`
// holds the group's plan records (global memory, or shared for a block of several turns).
// `sink(i, v)` takes a record's pooled channels (out elements i..i+3; zeros for a window with
// nothing to pool): OutStore (vec.cuh) writes them to p.out; the fused kernels also keep them.
template <typename TS, typename TI, bool kDecode, int kHd, typename Sink>
DSV4_DEVICE void c4_record_group(const Params& p, int64_t group, const CompressPlan* recs,
                                 const Sink& sink) {
  constexpr int V = kVec;
  constexpr int kLanes = kHd / V;  // threads of one event: 32 (hd 128) / 128 (hd 512)
  constexpr int64_t kRow = 4 * int64_t(kHd);  // state rows (and input row width)
  const int t = int(threadIdx.x);
  const int64_t e = group * (kC4Block / kLanes) + t / kLanes;
  const int c = (t % kLanes) * V;
  const bool active = e < p.num_records;
  using RawIn = typename RawVec<TI, V>::type;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);

  // Decode: quarters 0..3 of input row e at c..c+3, loaded together with the plan record
  // (their address does not depend on it): a step that closes no window then costs one
  // memory round trip, not two.
  RawIn cpr[4];
  if constexpr (kDecode) {
    const bool has_row = active && e < p.num_in_rows;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      cpr[q] = load_raw_if<TI, V, false>(has_row, in + e * p.in_row_stride + q * kHd + c,
                                         RawIn{});
  }

  WindowDesc d{0, -1, -1, 0, 0, 0};
  if (active) {
    if constexpr (kDecode) {
      const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e];
      d = offline_decode_window(rec, 4);
      const int64_t wl = rec.write_loc;
      if (wl >= 0 && wl < p.num_state_rows && e < p.num_in_rows) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float v[V];
          unpack(cpr[q], v);
          store_vec(st + wl * kRow + q * kHd + c, v);
        }
      }
      // The window loads below are asm statements the compiler could otherwise hoist above
      // these stores.
      compiler_fence();
      if (p.early_trigger) pdl_trigger();
    } else {
      d = offline_prefill_window(recs[t / kLanes], 4);
    }
  }
  const WindowRows w = kDecode ? resolve_state_rows(d, 4, p.num_state_rows)
                               : resolve_rows(d, 4, p.num_state_rows, p.num_in_rows);
  if (window_empty(w, 4)) {
    // Nothing to pool: zeros, without the ape loads and the fold. Decode: a step that closes
    // no window (three in four); prefill: an invalid record (the tail of a padded plan).
    pdl_trigger();
    if (active) {
      const float zero[V] = {};
      sink(e * kHd + c, zero);
    }
    return;
  }

  // Row r: input row in_base + r, or slot r & 3 of page0 (r < 4) / page1 (r >= 4). Both
  // sources hold row r at the same constant offset r * kRow + kv_offset from their base (the
  // page1 base is taken one page early; the input base steps by the input's row stride less
  // kRow), so a row's source is a select of two bases.
  const int64_t in_step = p.in_row_stride - kRow;
  const TI* in_b = in + (int64_t(w.in_base) * p.in_row_stride + c);
  const TS* st_b0 = st + (int64_t(w.page0_ok ? w.page0 : 0) * (4 * kRow) + c);
  const TS* st_b1 = st + ((int64_t(w.page1_ok ? w.page1 : 1) - 1) * (4 * kRow) + c);
  bool fs[8], fi[8];
  const TS* sb[8];
  const TI* ib[8];
  int64_t off[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    fs[r] = row_from_state(w, 4, r);
    fi[r] = !kDecode && row_from_input(w, r);  // decode windows are all state rows
    sb[r] = r < 4 ? st_b0 : st_b1;
    ib[r] = in_b + r * in_step;
    off[r] = r * kRow + kv_offset(4, kHd, r);
  }
  // Scores sit 2 * hd after their kv values in both halves (score_ovl / score, docs/contract.md 1.1).
  float z[8][V], kv[8][V];
  load_rows(fs, fi, sb, ib, off, 2 * kHd, kv, z);
  float a[8][V];
  load_ape_rows<8, V, kHd>(p.ape, p.ape_type, c, a);
  add_ape(a, z);
  pdl_trigger();
  if (!active) return;

  SoftmaxState acc[V];
  fold_window<8, V>(acc, z, kv);
  float res[V];
#pragma unroll
  for (int j = 0; j < V; ++j) res[j] = softmax_value_fast(acc[j]);
  sink(e * kHd + c, res);
}

// Prefill: the block takes record groups blockIdx.x + j * gridDim.x in turn (strided_unit_groups,
// at most kC4MaxTurns), their plan records read at once into `recs` (shared memory) where there
// are several, so that a turn of invalid records costs no memory round trip. Returns the number
// of turns; turn j's records are src + j * kGroup.
template <int kGroup>
DSV4_DEVICE int c4_prefill_turns(const Params& p, CompressPlan* recs, const CompressPlan*& src) {
  const int64_t groups = (p.num_records + kGroup - 1) / kGroup;
  src = reinterpret_cast<const CompressPlan*>(p.plan);
  if (int64_t(gridDim.x) >= groups) {
    src += int64_t(blockIdx.x) * kGroup;
    return 1;
  }
  const int turns = int((groups - blockIdx.x + gridDim.x - 1) / gridDim.x);
  for (int k = int(threadIdx.x); k < turns * kGroup; k += kC4Block) {
    const int64_t e = (blockIdx.x + int64_t(k / kGroup) * gridDim.x) * kGroup + k % kGroup;
    if (e < p.num_records) recs[k] = src[e];
  }
  __syncthreads();
  src = recs;
  return turns;
}

template <typename TS, typename TI, bool kDecode, int kHd>
__global__ void DSV4_COMPRESS_BOUNDS(kC4Block, DSV4_C4_MIN_BLOCKS) c4_kernel(const Params p) {
  constexpr int kGroup = kC4Block / (kHd / kVec);  // records of one block at a time
  static_assert(kC4Block % (kHd / kVec) == 0, "events tile a block");
  pdl_wait();
  if constexpr (kDecode) {
    c4_record_group<TS, TI, true, kHd>(p, blockIdx.x, nullptr, OutStore{p});
  } else {
    __shared__ CompressPlan recs[kC4MaxTurns * kGroup];
    const CompressPlan* src = nullptr;
    const int turns = c4_prefill_turns<kGroup>(p, recs, src);
    for (int j = 0; j < turns; ++j)
      c4_record_group<TS, TI, false, kHd>(p, blockIdx.x + int64_t(j) * gridDim.x, src + j * kGroup,
                                        OutStore{p});
  }
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
