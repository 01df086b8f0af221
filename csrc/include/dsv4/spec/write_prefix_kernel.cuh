// online_c128_mtp_write_prefix_states on the GPU (docs/contract.md 10.2): kStageVec = 2
// channels a thread, kHd / 2 threads a request (hd 512: two blocks of kStageBlock; hd 128: half
// a block), grid ceil(batch * kHd / 2 / kStageBlock). A thread loads its start state and the
// input and ape vectors of up to kStageBurst verify tokens at once, then folds the tokens one at
// a time (spec_math.h stage_fold: the online decode fold), storing each staged state as it goes.
// head_dim is a template parameter and ape's dtype a uniform branch outside the token loop, so
// the loop holds the fold and the addressing of its loads and stores, nothing else.
#pragma once

#include "../compress/vec.cuh"
#include "../spec_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace spec {

constexpr int kStageBlock = 128;
constexpr int kStageBurst = 8;
constexpr int kStageVec = 2;

// Blocks of a call (kHd / kStageVec threads a request).
inline int64_t stage_blocks(int64_t batch, int hd) {
  return (batch * (hd / kStageVec) + kStageBlock - 1) / kStageBlock;
}

// ape as it sits in memory (kApe: compress::ApeType) and unpacked to fp32.
template <int kApe>
using ApeRaw = typename compress::RawVec<typename std::conditional<kApe == compress::kApeF32,
                                                                   float, uint16_t>::type,
                                         kStageVec>::type;
template <int kApe>
DSV4_DEVICE void unpack_ape(const ApeRaw<kApe> r, float (&a)[kStageVec]) {
  if constexpr (kApe == compress::kApeF32)
    compress::unpack(r, a);
  else
    compress::unpack<kApe == compress::kApeF16>(r, a);
}

// Entry e's channels c, c + 1: every verify token folded and staged.
template <typename TS, typename TI, int kHd, int kApe>
DSV4_DEVICE void stage_thread(const WritePrefixParams& p, const StageEntry& e, int64_t b, int c) {
  constexpr int V = kStageVec, kB = kStageBurst;
  constexpr int64_t kStRow = 3 * int64_t(kHd);
  using RS = typename compress::RawVec<TS, V>::type;
  using RI = typename compress::RawVec<TI, V>::type;
  using TA = typename std::conditional<kApe == compress::kApeF32, float, uint16_t>::type;
  TS* st = static_cast<TS*>(p.state);
  const TA* ape = static_cast<const TA*>(p.ape) + c;
  const int64_t rs = p.in_row_stride;
  const TI* x = static_cast<const TI*>(p.input) + b * p.verify * rs + c;

  // The committed state (chunk offset 0: none), loaded with the first tokens' inputs.
  const bool from_state = e.q0 != 0;
  const TS* r0 = st + e.slot * kStRow + c;
  const RS m0 = compress::load_raw_if<TS, V, false>(from_state, r0, RS{});
  const RS s0 = compress::load_raw_if<TS, V, false>(from_state, r0 + kHd, RS{});
  const RS k0 = compress::load_raw_if<TS, V, false>(from_state, r0 + 2 * kHd, RS{});
  bool first = true;
  compress::SoftmaxState s[V];
  int64_t slot = e.slot;  // bank slot of the state after the token before
  TS* w = st + slot * kStRow + c;
  const int64_t w_step = p.slot_stride * kStRow;
  for (int64_t step0 = 0; step0 < p.verify; step0 += kB) {
    const int64_t left = p.verify - step0;
    const int n = left < kB ? int(left) : kB;
    RI rk[kB], rz[kB];
    ApeRaw<kApe> ra[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const bool on = u < n;
      rk[u] = compress::load_raw_if<TI, V>(on, x + u * rs, RI{});
      rz[u] = compress::load_raw_if<TI, V>(on, x + u * rs + kHd, RI{});
      ra[u] = compress::load_raw_if<TA, V, false>(
          on, ape + int64_t(stage_q(e, step0 + u)) * kHd, ApeRaw<kApe>{});
    }
    if (first) {
      float m[V], S[V], K[V];
      compress::unpack(m0, m);
      compress::unpack(s0, S);
      compress::unpack(k0, K);
#pragma unroll
      for (int j = 0; j < V; ++j)
        s[j] = from_state ? compress::from_online(m[j], S[j], K[j]) : compress::softmax_empty();
      first = false;
    }
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      if (u >= n) break;
      float kv[V], z[V], a[V], m[V], S[V], K[V];
      compress::unpack(rk[u], kv);
      compress::unpack(rz[u], z);
      unpack_ape<kApe>(ra[u], a);
      const int32_t q = stage_q(e, step0 + u);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        compress::OnlineRow o;
        stage_fold<TS>(s[j], q, kv[j], z[j] + a[j], o);
        m[j] = o.m;
        S[j] = o.S;
        K[j] = o.K;
      }
      slot += p.slot_stride;
      w += w_step;
      if (stages_at(p, q, slot)) {
        compress::store_vec(w, m);
        compress::store_vec(w + kHd, S);
        compress::store_vec(w + 2 * kHd, K);
      }
    }
    x += kB * rs;
  }
}

template <typename TS, typename TI, int kHd>
__global__ void __launch_bounds__(kStageBlock) write_prefix_kernel(const WritePrefixParams p) {
  pdl_wait();
  pdl_trigger();  // the next kernel may become resident while this one's loads are out
  constexpr int kLanes = kHd / kStageVec;
  const int64_t t = int64_t(blockIdx.x) * kStageBlock + threadIdx.x;
  const int64_t b = t / kLanes;
  const int c = int(t % kLanes) * kStageVec;
  if (b < p.batch) {
    const StageEntry e = stage_entry(p, b);
    if (e.active) {
      if (p.ape_type == compress::kApeF32)
        stage_thread<TS, TI, kHd, compress::kApeF32>(p, e, b, c);
      else if (p.ape_type == compress::kApeBF16)
        stage_thread<TS, TI, kHd, compress::kApeBF16>(p, e, b, c);
      else
        stage_thread<TS, TI, kHd, compress::kApeF16>(p, e, b, c);
    }
  }
}

}  // namespace spec
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
