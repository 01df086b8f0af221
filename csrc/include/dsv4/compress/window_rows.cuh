// A pooling thread's window rows and ape rows, loaded and folded (the GPU kernels of cr = 4 and
// cr = 128, docs/contract.md 1.2). Torch-free.
//
// What makes the pooling kernels fast is that each thread issues ALL its window loads back to
// back before it uses any: a window is resolved once (resolve_rows), each row's source is a
// couple of compares, and the loads are predicated (an absent row loads nothing and reads as kv
// 0, score kAbsentScore, see softmax_of) at offsets that are compile-time constants (head_dim
// is a template parameter). Branchy per-row loads, or a register budget that makes the
// compiler consume each row before loading the next, serialise one memory round trip per row;
// scripts/check_load_batching.py checks the machine code for it. At a block's few resident
// warps every instruction between the plan load and the window loads, and between the loads
// and the exit, lowers the bandwidth: keep the arithmetic lean.
//
// TS / TI: state / input element type, float or uint16_t (bf16 bits); mixed types load each
// source behind its own branch (load_rows). ape (fp32 / bf16 / fp16) is a runtime type: a
// uniform branch on a kernel argument, or a predicated load of either width (load_ape_raw).
#pragma once

#include "vec.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// Rows u with on[u] of one source, unpacked into kv / z; the other rows get kv 0 and the
// score kAbsentScore (kKeep false) or keep their values (kKeep true). The loads of a pass go
// out before any value is used; kKeep (the second source of a mixed-dtype window, rare) runs
// in passes of 2 rows to stay inside the register budget.
template <bool kKeep, typename T, int U, int V>
DSV4_DEVICE void load_rows_from(const bool (&on)[U], const T* const (&p)[U], int64_t sc_off,
                                float (&kv)[U][V], float (&z)[U][V]) {
  using R = typename RawVec<T, V>::type;
  constexpr int kPass = (kKeep && U > 2) ? 2 : U;
  const R zero = splat_raw<T, V>(0u), absent = splat_raw<T, V>(f32_bits(kAbsentScore));
#pragma unroll
  for (int u0 = 0; u0 < U; u0 += kPass) {
    R rk[kPass], rs[kPass];
#pragma unroll
    for (int u = 0; u < kPass; ++u) {
      rk[u] = load_raw_if<T, V>(on[u0 + u], p[u0 + u], zero);
      rs[u] = load_raw_if<T, V>(on[u0 + u], p[u0 + u] + sc_off, absent);
    }
#pragma unroll
    for (int u = 0; u < kPass; ++u) {
      float k[V], sc[V];
      unpack(rk[u], k);
      unpack(rs[u], sc);
      const bool keep = kKeep && !on[u0 + u];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        kv[u0 + u][j] = keep ? kv[u0 + u][j] : k[j];
        z[u0 + u][j] = keep ? z[u0 + u][j] : sc[j];
      }
    }
  }
}

// U window rows of one thread, unpacked to fp32: row u is a state row (fs[u]), an input row
// (fi[u]) or absent (kv 0, score kAbsentScore). Both sources hold row u at the same offset
// off[u] (compile-time constants after unrolling) from their base, sb[u] for the state and
// ib[u] for the input, so that a row's source is a select of two bases and its loads take the
// offset as an immediate; the kv values sit there, the scores sc_off elements further. (Input
// rows are kv_score_input's row stride apart, state rows their width: the callers step ib[u]
// by the difference.)
//   TS == TI: one predicated load pair per row (no select where fi is a compile-time false,
//   as in decode windows).
//   Mixed dtypes: the input rows, then the state rows behind a branch that a thread takes
//   only if it has state rows (decode windows: state rows only, known from fi). Holding
//   both raw sets at once spilled the cr = 128 kernel.
template <typename TS, typename TI, int U, int V>
DSV4_DEVICE void load_rows(const bool (&fs)[U], const bool (&fi)[U], const TS* const (&sb)[U],
                           const TI* const (&ib)[U], const int64_t (&off)[U], int64_t sc_off,
                           float (&kv)[U][V], float (&z)[U][V]) {
  if constexpr (std::is_same<TS, TI>::value) {
    bool on[U];
    const TS* q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      on[u] = fs[u] || fi[u];
      q[u] = (fi[u] ? ib[u] : sb[u]) + off[u];
    }
    load_rows_from<false>(on, q, sc_off, kv, z);
  } else {
    bool any_s = false, any_i = false;
    const TS* sp[U];
    const TI* ip[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      any_s = any_s || fs[u];
      any_i = any_i || fi[u];
      sp[u] = sb[u] + off[u];
      ip[u] = ib[u] + off[u];
    }
    if (!any_i) {
      load_rows_from<false>(fs, sp, sc_off, kv, z);
    } else {
      load_rows_from<false>(fi, ip, sc_off, kv, z);
      if (any_s) load_rows_from<true>(fs, sp, sc_off, kv, z);
    }
  }
}

// Mixed dtypes, rows from at most one source each: row u is a state row at sb + off[u] (fs[u])
// or an input row at ib + off[u] (fi[u], rounded to the state type: the decode window row the
// step writes, as the copy stores it), else absent. One asm statement per vector holds a
// predicated load of either width into the same registers (the wider type's), so a row costs
// the registers of one source and no branch. Used by the fp32-state / bf16-input decode
// instance, which spilled in its loop with a separate load pair for the input row (ptxas -v).
template <typename TS, typename TI, int V>
struct EitherVec {
  using RS = typename RawVec<TS, V>::type;
  using RI = typename RawVec<TI, V>::type;
  static constexpr int kWords = int((sizeof(RS) > sizeof(RI) ? sizeof(RS) : sizeof(RI)) / 4);
};

template <typename TS, typename TI, int V>
DSV4_DEVICE void load_either(bool on_s, const TS* ps, bool on_i, const TI* pi,
                             uint32_t (&w)[EitherVec<TS, TI, V>::kWords]) {
  using E = EitherVec<TS, TI, V>;
  static_assert(V == 2 && E::kWords == 2, "one 8-byte and one 4-byte vector");
#if defined(DSV4_HIP)
  if (on_s) std::memcpy(w, ps, sizeof(typename E::RS));
  if (on_i) std::memcpy(w, pi, sizeof(typename E::RI));
#else
  if constexpr (sizeof(typename E::RS) > sizeof(typename E::RI)) {
    asm volatile(
        "{\n .reg .pred s, i;\n setp.ne.u32 s, %2, 0;\n setp.ne.u32 i, %3, 0;\n"
        " @s ld.global.cs.v2.b32 {%0, %1}, [%4];\n @i ld.global.cs.b32 %0, [%5];\n}"
        : "+r"(w[0]), "+r"(w[1])
        : "r"(uint32_t(on_s)), "r"(uint32_t(on_i)), "l"(ps), "l"(pi));
  } else {
    asm volatile(
        "{\n .reg .pred s, i;\n setp.ne.u32 s, %2, 0;\n setp.ne.u32 i, %3, 0;\n"
        " @s ld.global.cs.b32 %0, [%4];\n @i ld.global.cs.v2.b32 {%0, %1}, [%5];\n}"
        : "+r"(w[0]), "+r"(w[1])
        : "r"(uint32_t(on_s)), "r"(uint32_t(on_i)), "l"(ps), "l"(pi));
  }
#endif
}

template <typename TS, typename TI, int U, int V>
DSV4_DEVICE void load_rows_either(const bool (&fs)[U], const bool (&fi)[U], const TS* sb,
                                  const TI* ib, const int64_t (&off)[U], int64_t sc_off,
                                  float (&kv)[U][V], float (&z)[U][V]) {
  using E = EitherVec<TS, TI, V>;
  uint32_t wk[U][E::kWords] = {}, ws[U][E::kWords] = {};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    load_either<TS, TI, V>(fs[u], sb + off[u], fi[u], ib + off[u], wk[u]);
    load_either<TS, TI, V>(fs[u], sb + off[u] + sc_off, fi[u], ib + off[u] + sc_off, ws[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    typename E::RS sk, ss;
    typename E::RI ik, is;
    std::memcpy(&sk, wk[u], sizeof sk);
    std::memcpy(&ss, ws[u], sizeof ss);
    std::memcpy(&ik, wk[u], sizeof ik);
    std::memcpy(&is, ws[u], sizeof is);
    float k_s[V], z_s[V], k_i[V], z_i[V];
    unpack(sk, k_s);
    unpack(ss, z_s);
    unpack(ik, k_i);
    unpack(is, z_i);
    round_vec<TS, V>(k_i);
    round_vec<TS, V>(z_i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      kv[u][j] = fi[u] ? k_i[j] : (fs[u] ? k_s[j] : 0.0f);
      z[u][j] = fi[u] ? z_i[j] : (fs[u] ? z_s[j] : kAbsentScore);
    }
  }
}

// One ape row's V = 2 channels as raw words: fp32 (both words) or 16-bit (the first), read by
// a predicated load of either width. No branch: behind a branch on the runtime type, nvcc
// unpacked the window rows loaded before it (bf16 state) ahead of the branch, so the ape loads
// waited for them, a second memory round trip.
template <int V>
DSV4_DEVICE typename RawVec<float, V>::type load_ape_raw(bool f32, const void* ape, int64_t i) {
  static_assert(V == 2, "an 8-byte or a 4-byte vector");
  using R = typename RawVec<float, V>::type;
  const float* p32 = static_cast<const float*>(ape) + i;
  const uint16_t* p16 = static_cast<const uint16_t*>(ape) + i;
  R r{};
#if defined(DSV4_HIP)
  if (f32) {
    r = *reinterpret_cast<const R*>(p32);
  } else {
    const auto h = *reinterpret_cast<const typename RawVec<uint16_t, V>::type*>(p16);
    std::memcpy(&r, &h, sizeof h);
  }
#else
  uint32_t* w = reinterpret_cast<uint32_t*>(&r);
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n @p ld.global.v2.b32 {%0, %1}, [%3];\n"
      " @!p ld.global.b32 %0, [%4];\n}"
      : "+r"(w[0]), "+r"(w[1])
      : "r"(uint32_t(f32)), "l"(p32), "l"(p16));
#endif
  return r;
}

// U rows of V channels of a runtime-typed ape table whose rows are kHd apart, the first at
// element i0. kBranchFree (the cr = 128 decode kernel): every load goes out before any is
// converted (load_ape_raw), at the cost of registers for both widths (slower for the other
// kernels, e.g. the bf16-state cr = 128 prefill). Otherwise one uniform branch on the type for
// all rows, so that the loads go out together.
template <int U, int V, int kHd, bool kBranchFree = false>
DSV4_DEVICE void load_ape_rows(const void* ape, int32_t type, int64_t i0, float (&a)[U][V]) {
  using RH = typename RawVec<uint16_t, V>::type;
  if constexpr (kBranchFree) {
    typename RawVec<float, V>::type r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = load_ape_raw<V>(type == kApeF32, ape, i0 + u * kHd);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      RH h;
      std::memcpy(&h, &r[u], sizeof h);
      if (type == kApeF32)
        unpack(r[u], a[u]);
      else if (type == kApeBF16)
        unpack(h, a[u]);
      else
        unpack<true>(h, a[u]);
    }
    return;
  }
  if (type == kApeF32) {
#pragma unroll
    for (int u = 0; u < U; ++u) load_vec(static_cast<const float*>(ape) + i0 + u * kHd, a[u]);
    return;
  }
  RH t[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    t[u] = *reinterpret_cast<const RH*>(static_cast<const uint16_t*>(ape) + i0 + u * kHd);
  if (type == kApeBF16) {
#pragma unroll
    for (int u = 0; u < U; ++u) unpack(t[u], a[u]);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) unpack<true>(t[u], a[u]);
  }
}

// softmax_value() of a thread's fold with the approximate division. s >= 1 whenever a row is
// present and weighs anything (the largest logit weighs 1) and s <= 8 for a cr = 4 window,
// where __fdividef is within 2 ulp of a / s; the IEEE division's slow-path branch, once per
// channel, is a measurable part of the cr = 4 decode kernel. s == 0 (every present row at
// -inf) pools to 0; a NaN gives the canonical NaN, as softmax_value does.
DSV4_DEVICE float softmax_value_fast(const SoftmaxState& st) {
#if defined(DSV4_HIP)
  return softmax_value(st);
#else
  return canonical_nan(st.s != 0.0f ? __fdividef(st.a, st.s) : 0.0f);
#endif
}

// Logits: z <- score + ape. Absent rows stay at most kAbsentScore + ape (weight 0 next to
// any present row, see softmax_of), so no per-row select is needed; a NaN or +inf ape entry
// therefore reaches the pool also where its row is absent (compress_math.h, as on the CPU).
template <int U, int V>
DSV4_DEVICE void add_ape(const float (&a)[U][V], float (&z)[U][V]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < V; ++j) z[u][j] += a[u][j];
}

// Softmax states of U loaded rows, one per channel of the thread.
template <int U, int V>
DSV4_DEVICE void fold_window(SoftmaxState (&acc)[V], const float (&z)[U][V],
                             const float (&kv)[U][V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float zj[U], kj[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      zj[u] = z[u][j];
      kj[u] = kv[u][j];
    }
    acc[j] = softmax_of<U>(zj, kj);
  }
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
