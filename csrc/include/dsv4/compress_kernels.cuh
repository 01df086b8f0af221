// compress_forward GPU kernels (CUDA and HIP from the same source; SPEC 3.4, 3.5).
//
// Torch-free. The math (row sources, absent rows, safe softmax, merges, online state) comes
// from compress_math.h, shared with the CPU kernel.
//
// Every thread owns a few consecutive channels (c4: kVec = 4, one 16-byte fp32 / 8-byte bf16
// vector per row; c128: kC128Vec = 2) of several window rows. What makes these kernels fast is
// that each thread issues ALL its window loads back to back before it uses any: a window is
// resolved once (resolve_rows), each row's source is a couple of compares, and the loads are
// predicated (an absent row loads nothing and reads as kv 0, score kAbsentScore, see
// softmax_of) at offsets that are compile-time constants (head_dim is a template parameter).
// Branchy per-row loads, or a register budget that makes the compiler consume each row before
// loading the next, serialise one memory round trip per row (measured on the H200: 2-3x
// slower small decode steps); check with cuobjdump -sass that the window's LDG instructions
// stay together when changing these kernels. The other lesson of the H200 (ncu): at a block's
// few resident warps, every instruction between the plan load and the window loads, and
// between the loads and the exit, lowers the bandwidth; keep the arithmetic lean.
//   * c4_kernel<TS, TI, kDecode, kHd>: kC4Block = 128 threads; one event per kHd/4 threads
//     (hd 128: 4 events per block, hd 512: 1); a thread folds all 8 window rows of its
//     channels.
//   * c128_kernel<TS, TI, kMode, kHd>: c128_record_blocks(records, kHd, ...) (decode:
//     c128_decode_blocks) blocks of kC128Block = 512 threads (channel slices minor); a block owns
//     64 channels of one record at a time: 32 lanes of 2 channels x 16 row groups of 8 rows. Each
//     thread folds its 8 rows in registers; the 16 partial states per channel are merged in shared
//     memory (max first, then the sums) by one thread per channel (decode: in two alternating
//     buffers, so that a block's next record's loads overlap that merge). Modes: offline prefill,
//     offline decode, online prefill (segments). A record whose window has no present row (a decode
//     step that closes none, an invalid record) gives zeros. A block takes several records strided
//     by the grid where there are many (Params::records_per_block: c128_records_per_block,
//     c128_decode_records_per_block); a decode block first copies its channels of its records' new
//     rows into the state, and in a large batch then pools its share of all the step's closing
//     requests (c128_decode_groups).
//   * online_decode_kernel<TS, TI>: element-wise fold of one token into the running state.
//   * write_rows_kernel<TS, TI, kRow>: offline prefill plan_w (copy input rows into state
//     slots); launched after the compress kernel so that every compress read precedes every
//     write.
// TS / TI: state / input element type, float or uint16_t (bf16 bits); mixed types load each
// source behind its own branch (load_rows). ape (fp32 / bf16 / fp16) and out (fp32 / bf16)
// are runtime types: a uniform branch on a kernel argument.
//
// Explicit instantiation (e.g. for a hipcc check, scripts/hip/compress_instances.cu): TS, TI
// in {float, uint16_t}; kHd in {128, 512}; c4_kernel kDecode in {false, true}; c128_kernel
// kMode in {kModePrefill, kModeDecode, kModeOnline}; write_rows_kernel kRow in {2, 4} * kHd;
// all take one `const Params` argument.
#pragma once

#include <type_traits>

#include "compress_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

constexpr int kBlock = 256;  // online decode and row writes

enum : int { kModePrefill = 0, kModeDecode = 1, kModeOnline = 2 };

constexpr int kC4Block = 128;                               // c4_kernel threads per block
constexpr int kC4MaxTurns = 32;  // c4 prefill: most record groups a block takes in turn
constexpr int kC128Ch = 64;                                 // c128_kernel channels per block
constexpr int kC128Vec = 2;                                 // channels per c128_kernel thread
constexpr int kC128Lanes = kC128Ch / kC128Vec;              // 32 threads across those channels
constexpr int kC128Rows = 8;                                // window rows per thread
constexpr int kC128RowGroups = 128 / kC128Rows;             // 16 partial states per channel
constexpr int kC128Block = kC128Lanes * kC128RowGroups;     // 512

// Resident blocks per multiprocessor the pooling kernels are compiled for (register budget):
// tuning knobs, measured on the H200 (benchmarks/bench_compress.py).
#ifndef DSV4_C4_MIN_BLOCKS
#define DSV4_C4_MIN_BLOCKS 4
#endif
#ifndef DSV4_C128_MIN_BLOCKS
#define DSV4_C128_MIN_BLOCKS 2
#endif

// Grid of a prefill / online pooling launch whose blocks take their units (c128: records; c4:
// a block's group of records) in turn, strided by the grid. A padded (CUDA-graph,
// device-length) plan has num_q records, most of them invalid, and one block per unit (262144
// c128 blocks for 8 x 4096 tokens) spends a block launch and a plan-read round trip on each.
// Up to 16 waves of `wave` resident blocks, every unit has its own block(s); past that the
// grid is 8 waves (each unit spans blocks_per_unit blocks), and at least units / max_per_block
// unit groups. A trimmed plan of that size (a very large prefill) then pools its units in
// turn instead of in waves. Returns the number of unit groups (the stride).
inline int64_t strided_unit_groups(int64_t units, int64_t blocks_per_unit, int64_t wave,
                                   int64_t max_per_block) {
  if (units * blocks_per_unit <= 16 * wave) return units;
  const int64_t groups = (8 * wave + blocks_per_unit - 1) / blocks_per_unit;
  const int64_t floor_groups = (units + max_per_block - 1) / max_per_block;
  return groups > floor_groups ? groups : floor_groups;
}

// c128 prefill / online (Params::records_per_block): a block of several records reads all
// their plan records at once into shared memory, writes the zeros of the invalid ones and
// pools the valid ones. Resident blocks: two 512-thread blocks per SM (DSV4_C128_MIN_BLOCKS).
constexpr int kC128MaxRecords = 512;
inline int c128_records_per_block(int64_t records, int hd, int64_t sms) {
  const int64_t groups = strided_unit_groups(records, hd / kC128Ch, 2 * sms, kC128MaxRecords);
  return groups > 0 ? int((records + groups - 1) / groups) : 1;
}
inline int64_t c128_record_blocks(int64_t records, int hd, int records_per_block) {
  return (records + records_per_block - 1) / records_per_block * (hd / kC128Ch);
}

// c128 decode (Params::records_per_block, see c128_kernel). Below four waves of blocks (two
// resident per SM), a block per request and 64-channel slice. From there, one wave: a block per
// slice and group of requests, which copies its slice of its requests' rows and pools its share
// of the step's closing requests. A decode step closes no window for most requests (a request
// closes one in 128 steps), and a block per request and slice then spends a block's round trip
// on each. Exactly slots / slices groups: fewer would leave multiprocessor slots idle in a step
// where every request closes. Below four waves the groups would hold 3 or fewer requests, and a
// step that closes many windows then pays for the rounding of its pools to whole rounds. Measured
// on the H200: docs/performance_log.md (thirteenth session). In a step where every request
// closes, the fixed shares leave the blocks on slower multiprocessors last (ends spread over
// 118-140 us at 1024 requests). Claiming the last rounds' pools by compare-and-swap, so that
// finished blocks take over, measured slower (fifteenth session).
inline int64_t c128_decode_groups(int64_t events, int hd, int64_t sms) {
  const int64_t slices = hd / kC128Ch, slots = DSV4_C128_MIN_BLOCKS * (sms > 0 ? sms : 1);
  if (events * slices < 4 * slots || events >= (int64_t(1) << 31))
    return 0;  // 0: a block per request and slice
  const int64_t groups = slots / slices > 0 ? slots / slices : 1,
                floor_groups = (events + kC128MaxRecords - 1) / kC128MaxRecords;
  const int64_t n = groups > floor_groups ? groups : floor_groups;
  return n < events ? n : 0;  // (several requests per grouped block)
}
// Records per block and grid of a decode launch with `groups` = c128_decode_groups(...).
inline int c128_decode_records_per_block(int64_t events, int64_t groups) {
  return groups > 0 ? int((events + groups - 1) / groups) : 1;
}
inline int64_t c128_decode_blocks(int64_t events, int hd, int64_t groups) {
  return (groups > 0 ? groups : events) * (hd / kC128Ch);
}

#if defined(DSV4_HIP)
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

// ---- channel vector accesses ------------------------------------------------------------------

// Raw V-channel vector of element type T as it sits in memory (V = 4: 16-byte fp32 / 8-byte
// bf16; V = 2: 8-byte fp32 / 4-byte bf16).
template <typename T, int V>
struct RawVec {
  static_assert(V == 2 || V == 4, "2- or 4-channel vectors");
  static_assert(std::is_same<T, float>::value || std::is_same<T, uint16_t>::value, "fp32 or bf16");
  using type = typename std::conditional<
      std::is_same<T, float>::value, typename std::conditional<V == 4, float4, float2>::type,
      typename std::conditional<V == 4, uint2, uint32_t>::type>::type;
};

DSV4_DEVICE void unpack(const float4 t, float (&v)[4]) {
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
DSV4_DEVICE void unpack(const float2 t, float (&v)[2]) {
  v[0] = t.x;
  v[1] = t.y;
}
// 16-bit floats: bf16, or fp16 with kF16 (only ape may be fp16).
template <bool kF16 = false>
DSV4_DEVICE float half_to_f32(uint32_t bits) {
  return kF16 ? f16_to_f32(uint16_t(bits & 0xffffu)) : bf16_to_f32(uint16_t(bits & 0xffffu));
}
template <bool kF16 = false>
DSV4_DEVICE void unpack(const uint32_t t, float (&v)[2]) {
  v[0] = half_to_f32<kF16>(t);
  v[1] = half_to_f32<kF16>(t >> 16);
}
template <bool kF16 = false>
DSV4_DEVICE void unpack(const uint2 t, float (&v)[4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t w = i == 0 ? t.x : t.y;
    v[2 * i] = half_to_f32<kF16>(w);
    v[2 * i + 1] = half_to_f32<kF16>(w >> 16);
  }
}

// fp32 values as the raw vector of the element type of `tag` (bf16: RNE).
DSV4_DEVICE float4 pack(const float (&v)[4], const float*) {
  return make_float4(v[0], v[1], v[2], v[3]);
}
DSV4_DEVICE float2 pack(const float (&v)[2], const float*) { return make_float2(v[0], v[1]); }
DSV4_DEVICE uint32_t pack(const float (&v)[2], const uint16_t*) { return bf16x2_bits(v[0], v[1]); }
DSV4_DEVICE uint2 pack(const float (&v)[4], const uint16_t*) {
  return make_uint2(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]));
}

template <typename T, int V>
DSV4_DEVICE void load_vec(const T* p, float (&v)[V]) {
  unpack(*reinterpret_cast<const typename RawVec<T, V>::type*>(p), v);
}

template <typename T, int V>
DSV4_DEVICE void store_vec(T* p, const float (&v)[V]) {
  *reinterpret_cast<typename RawVec<T, V>::type*>(p) = pack(v, p);
}

template <int V>
DSV4_DEVICE void store_out_vec(void* out, int32_t type, int64_t i, const float (&v)[V]) {
  if (type == kOutF32)
    store_vec(static_cast<float*>(out) + i, v);
  else
    store_vec(static_cast<uint16_t*>(out) + i, v);
}

template <typename T, int V>
DSV4_DEVICE void round_vec(float (&v)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = round_to(static_cast<const T*>(nullptr), v[j]);
}

// Raw vector of T whose every element reads as `bits` (fp32 bits; bf16: the upper half).
template <typename T, int V>
DSV4_DEVICE typename RawVec<T, V>::type splat_raw(uint32_t bits) {
  using R = typename RawVec<T, V>::type;
  const uint32_t word = std::is_same<T, float>::value ? bits : ((bits >> 16) * 0x10001u);
  R r;
#pragma unroll
  for (int i = 0; i < int(sizeof(R) / 4); ++i) reinterpret_cast<uint32_t*>(&r)[i] = word;
  return r;
}

// Window rows are read once per call: streaming (evict-first) loads on CUDA. `on` false:
// no memory access, `fill`. Written so that the compiler predicates the load instead of
// branching around it: every row's loads of a thread then go out back to back, before any
// value is used (a branch per row served one memory round trip per row on the H200).
// kStream false: a plain load (the c4 decode copy row, which check_load_batching.py must not
// take for a window row).
template <typename T, int V, bool kStream = true>
DSV4_DEVICE typename RawVec<T, V>::type load_raw_if(bool on, const T* p,
                                                    typename RawVec<T, V>::type fill) {
  using R = typename RawVec<T, V>::type;
  R v = fill;
  if (on) {
#if defined(DSV4_HIP)
    v = *reinterpret_cast<const R*>(p);
#else
    v = kStream ? __ldcs(reinterpret_cast<const R*>(p)) : *reinterpret_cast<const R*>(p);
#endif
  }
  return v;
}

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
// ib for the input, so that a row's source is a select of two bases and its loads take the
// offset as an immediate; the kv values sit there, the scores sc_off elements further.
//   TS == TI: one predicated load pair per row (no select where fi is a compile-time false,
//   as in decode windows).
//   Mixed dtypes: the input rows, then the state rows behind a branch that a thread takes
//   only if it has state rows (decode windows: state rows only, known from fi). Holding
//   both raw sets at once spilled the cr = 128 kernel.
template <typename TS, typename TI, int U, int V>
DSV4_DEVICE void load_rows(const bool (&fs)[U], const bool (&fi)[U], const TS* const (&sb)[U],
                           const TI* ib, const int64_t (&off)[U], int64_t sc_off,
                           float (&kv)[U][V], float (&z)[U][V]) {
  if constexpr (std::is_same<TS, TI>::value) {
    bool on[U];
    const TS* q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      on[u] = fs[u] || fi[u];
      q[u] = (fi[u] ? ib : sb[u]) + off[u];
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
      ip[u] = ib + off[u];
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
// waited for them, a second memory round trip (measured on the H200: +12 % on a 128-request
// cr = 128 decode step that closes every window, bf16 state and fp32 input).
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
// converted (load_ape_raw), at the cost of registers for both widths (elsewhere measured
// slower: the bf16-state cr = 128 prefill took 13 % longer). Otherwise one uniform branch on
// the type for all rows, so that the loads go out together.
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
// present (the largest logit weighs 1) and s <= 8 for a cr = 4 window, where __fdividef is
// within 2 ulp of a / s. The IEEE division's slow-path branch, once per channel, cost the
// cr = 4 decode kernel about 0.2 us (H200, graph replay, a scratch build with fp32 ape and
// output types fixed: 8 closing hd 512 requests 1.71-1.72 -> 1.53-1.54 us, 1024 closing
// hd 128 3.37-3.39 -> 3.16-3.18).
DSV4_DEVICE float softmax_value_fast(const SoftmaxState& st) {
#if defined(DSV4_HIP)
  return softmax_value(st);
#else
  return st.s > 0.0f ? __fdividef(st.a, st.s) : 0.0f;
#endif
}

// Logits: z <- score + ape. Absent rows stay at most kAbsentScore + ape (weight 0 next to
// any present row, see softmax_of), so no per-row select is needed.
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

// ---- cr = 4 ---------------------------------------------------------------------------------

// Prefill (kDecode false): plan = CompressPlan rows, pool each window into out[e].
// Decode (kDecode true): plan = DecodePlan rows; copy input row e into write_loc, then pool
// the window from the state, which then holds the just-written row (the thread that writes
// channels c..c+3 of that row is the one that reads them back: program order, no barrier).
// kHd (128 / 512) is a template parameter so that every row offset is a constant.
// c4_record_group pools one block's group of kC4Block / (kHd / kVec) records; prefill: `recs`
// holds the group's plan records (global memory, or shared for a block of several turns).
template <typename TS, typename TI, bool kDecode, int kHd>
DSV4_DEVICE void c4_record_group(const Params& p, int64_t group, const CompressPlan* recs) {
  constexpr int V = kVec;
  constexpr int kLanes = kHd / V;  // threads of one event: 32 (hd 128) / 128 (hd 512)
  constexpr int64_t kRow = 4 * int64_t(kHd);  // input and state rows
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
      cpr[q] = load_raw_if<TI, V, false>(has_row, in + e * kRow + q * kHd + c, RawIn{});
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
      store_out_vec(p.out, p.out_type, e * kHd + c, zero);
    }
    return;
  }

  // Row r: input row in_base + r, or slot r & 3 of page0 (r < 4) / page1 (r >= 4). Both
  // sources hold row r at the same constant offset r * kRow + kv_offset from their base (the
  // page1 base is taken one page early), so a row's source is a select of two bases.
  const TI* in_b = in + (int64_t(w.in_base) * kRow + c);
  const TS* st_b0 = st + (int64_t(w.page0_ok ? w.page0 : 0) * (4 * kRow) + c);
  const TS* st_b1 = st + ((int64_t(w.page1_ok ? w.page1 : 1) - 1) * (4 * kRow) + c);
  bool fs[8], fi[8];
  const TS* sb[8];
  int64_t off[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    fs[r] = row_from_state(w, 4, r);
    fi[r] = !kDecode && row_from_input(w, r);  // decode windows are all state rows
    sb[r] = r < 4 ? st_b0 : st_b1;
    off[r] = r * kRow + kv_offset(4, kHd, r);
  }
  // Scores sit 2 * hd after their kv values in both halves (score_ovl / score, SPEC 1.1).
  float z[8][V], kv[8][V];
  load_rows(fs, fi, sb, in_b, off, 2 * kHd, kv, z);
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
  store_out_vec(p.out, p.out_type, e * kHd + c, res);
}

template <typename TS, typename TI, bool kDecode, int kHd>
__global__ void DSV4_COMPRESS_BOUNDS(kC4Block, DSV4_C4_MIN_BLOCKS) c4_kernel(const Params p) {
  constexpr int kGroup = kC4Block / (kHd / kVec);  // records of one block at a time
  static_assert(kC4Block % (kHd / kVec) == 0, "events tile a block");
  pdl_wait();
  if constexpr (kDecode) {
    c4_record_group<TS, TI, true, kHd>(p, blockIdx.x, nullptr);
  } else {
    // A long (padded) plan: the block takes groups blockIdx.x + j * gridDim.x in turn
    // (strided_unit_groups, at most kC4MaxTurns), their plan records read at once, so that a
    // turn of invalid records costs no memory round trip.
    __shared__ CompressPlan recs[kC4MaxTurns * kGroup];
    const int64_t groups = (p.num_records + kGroup - 1) / kGroup;
    const CompressPlan* src = reinterpret_cast<const CompressPlan*>(p.plan);
    int turns = 1;
    if (int64_t(gridDim.x) >= groups) {
      src += int64_t(blockIdx.x) * kGroup;
    } else {
      turns = int((groups - blockIdx.x + gridDim.x - 1) / gridDim.x);
      for (int k = int(threadIdx.x); k < turns * kGroup; k += kC4Block) {
        const int64_t e = (blockIdx.x + int64_t(k / kGroup) * gridDim.x) * kGroup + k % kGroup;
        if (e < p.num_records) recs[k] = src[e];
      }
      __syncthreads();
      src = recs;
    }
    for (int j = 0; j < turns; ++j)
      c4_record_group<TS, TI, false, kHd>(p, blockIdx.x + int64_t(j) * gridDim.x, src + j * kGroup);
  }
}

// ---- cr = 128 -------------------------------------------------------------------------------

// Whether a cr = 128 record pools anything, from its resolved window (prefill, decode) or its
// online segment: a decode step that closes no window, and the invalid records / segments of
// a padded plan, do not.
template <int kMode>
DSV4_DEVICE bool c128_pools(const WindowRows& w, const OnlineSegment& seg) {
  return kMode != kModeOnline ? !window_empty(w, 128) : seg.valid;
}

// The same straight from a plan record: a prefill record, an online segment, or a decode
// record (DecodePlan).
template <int kMode>
DSV4_DEVICE bool c128_record_pools(const Params& p, const CompressPlan& rec) {
  if constexpr (kMode == kModeOnline) {
    return c128_pools<kMode>(WindowRows{}, online_segment(rec));
  } else {
    const WindowDesc d = offline_prefill_window(rec, 128);
    return c128_pools<kMode>(resolve_rows(d, 128, p.num_state_rows, p.num_in_rows),
                             OnlineSegment{});
  }
}
// The rows of a cr = 128 decode request's window (state rows only).
DSV4_DEVICE WindowRows c128_decode_rows(const Params& p, const DecodePlan& rec) {
  return resolve_state_rows(offline_decode_window(rec, 128), 128, p.num_state_rows);
}
template <int kMode>
DSV4_DEVICE bool c128_record_pools(const Params& p, const DecodePlan& rec) {
  return c128_pools<kMode>(c128_decode_rows(p, rec), OnlineSegment{});
}

// Decode: threads per record that copy the block's 64 channels of its input row (V channels
// each, kv half then score half), and the records whose copies a block loads together with
// its plan records (more go in further rounds).
constexpr int kC128CopyLanes = 2 * kC128Lanes;
constexpr int kC128CopyAhead = 4 * (kC128Block / kC128CopyLanes);

// kModePrefill: CompressPlan rows, window per SPEC 3.1 -> out[e].
// kModeDecode: DecodePlan rows; copy the block's channels of input row e into write_loc first
//   (V channels per thread), then pool page read_page_1, which holds that row -> out[e].
// kModeOnline: online segments (CompressPlan rows); merge with the stored state when the
//   segment does not start its chunk; p.online_store == 0: out[e] = K, else store (M, S, K)
//   at read_page_0 (p.out is null).
template <typename TS, typename TI, int kMode, int kHd>
__global__ void DSV4_COMPRESS_BOUNDS(kC128Block, DSV4_C128_MIN_BLOCKS) c128_kernel(const Params p) {
  constexpr int V = kC128Vec, U = kC128Rows;
  // The row groups' partial states (m, s, a) of a pooled record. Decode: double-buffered, so that
  // in a grouped block the merge of one record by the first 64 threads overlaps the window loads
  // of the next by the others (see the loop at the end). Measured on the H200 (1024 closing
  // requests, cold / graph): bf16 state 85.2 -> 85.0 / 76.8 -> 74.8 us, bf16 state with fp32
  // input 92.4 -> 87.9 / 84.7 -> 78.0, fp32 unchanged. A prefill block of 16 records lost 1.5 %
  // with it, so prefill and online keep one buffer and a barrier between records.
  constexpr bool kDecode = kMode == kModeDecode;
  alignas(16) __shared__ float parts[kDecode ? 2 : 1][3][kC128RowGroups][kC128Ch];
  constexpr int64_t kInRow = 2 * int64_t(kHd);
  constexpr int64_t kStRow = kMode == kModeOnline ? 3 * int64_t(kHd) : kInRow;
  using Rec = typename std::conditional<kDecode, DecodePlan, CompressPlan>::type;
  using RawIn = typename RawVec<TI, V>::type;

  pdl_wait();
  // Channel slices minor: the kHd / 64 slices of a record run side by side and read its rows
  // whole, which keeps DRAM pages and TLB entries shared.
  constexpr int kSlices = kHd / kC128Ch;
  const int64_t e0 = blockIdx.x / kSlices;
  const int c0 = int(blockIdx.x % kSlices) * kC128Ch;  // the block's channels c0 .. c0 + 63
  const int t = int(threadIdx.x);
  const int g = t / kC128Lanes;  // row group: window rows U*g .. U*g+U-1
  const int lane = t % kC128Lanes;
  const int c = c0 + lane * V;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);

  // Decode: the V channels of a record's input row that thread t copies: of the kv half where
  // t % 64 < 32, of the score half where t % 64 >= 32.
  const int64_t copy_at = (t % kC128CopyLanes >= kC128Lanes ? kHd : 0) + c0 + lane * V;

  // Decode: the window row the step writes (-1: none in the window, or no input row or state
  // slot for it).
  const auto decode_new_row = [&](const DecodePlan& rec, int64_t e) {
    const int64_t wl = rec.write_loc, r = wl - int64_t(rec.read_page_1) * 128;
    return e < p.num_in_rows && wl >= 0 && wl < p.num_state_rows && r >= 0 && r < 128
               ? int32_t(r)
               : int32_t(-1);
  };
  // Pools record e's window w (seg: an online segment) into out[e] or the online state.
  // Decode: new_row is the window row the step writes, pooled from input row e (-1: none).
  // buf: the parts[] buffer of the partial states (0 unless decode).
  const auto pool = [&](int64_t e, const WindowRows& w, const OnlineSegment& seg, int32_t new_row,
                        int buf) {
    float(&part)[3][kC128RowGroups][kC128Ch] = parts[buf];
    if (!c128_pools<kMode>(w, seg)) {
      // Nothing to pool (one record per block: a decode step that closes none, an invalid record
      // or segment of a padded plan): zeros, or nothing in the online store pass. Uniform across
      // the block, so no thread is left waiting at a barrier below.
      if (p.out != nullptr && t < kC128Ch) store_out(p.out, p.out_type, e * kHd + c0 + t, 0.0f);
      return;
    }
    // Row r = U*g + u: input row in_base + r, or row r of page1, both at offset u * kInRow
    // from their base (online windows have no state rows, whose stride differs). A closing
    // cr = 128 decode window spans rows [0, 128) of page1 (seq_len >= 128), so past the
    // empty-window exit every decode row is present: a state row, except the one the step
    // writes, which is read from its input row as the copy stores it (no block waits for a copy,
    // its own or another block's). Mixed dtypes: with the wider state type (fp32 state, bf16
    // input) through load_rows_either, else (bf16 state, fp32 input) as one extra load pair of
    // the warp that holds it (g is warp-uniform). Each is the form that kept its instance
    // fast: the extra pair spilled the former in the grouped loop (ptxas -v), and
    // load_rows_either made the latter 1.4x slower on 1024 closing requests (measured on the
    // H200, docs/performance_log.md, fourteenth session).
    constexpr bool kSameType = std::is_same<TS, TI>::value;
    constexpr bool kEither = kDecode && !kSameType && sizeof(TS) > sizeof(TI);
    constexpr bool kNewPair = kDecode && !kSameType && !kEither;
    const int32_t in_base = kDecode ? int32_t(e) - new_row : w.in_base;
    const TI* in_g = in + ((int64_t(in_base) + g * U) * kInRow + c);
    const TS* st_g = st + ((int64_t(w.page1_ok ? w.page1 : 0) * 128 + g * U) * kStRow + c);
    bool fs[U], fi[U];
    const TS* sb[U];
    int64_t off[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      fi[u] = kDecode ? !kNewPair && g * U + u == new_row : row_from_input(w, g * U + u);
      fs[u] = kDecode ? g * U + u != new_row
                      : kMode == kModePrefill && row_from_state(w, 128, g * U + u);
      sb[u] = st_g;
      off[u] = u * kInRow;
    }
    const bool new_here = kNewPair && new_row >= 0 && new_row / U == g;
    RawIn new_kv{}, new_sc{};
    if constexpr (kNewPair) {
      const TI* r = in + e * kInRow + c;
      new_kv = load_raw_if<TI, V>(new_here, r, RawIn{});
      new_sc = load_raw_if<TI, V>(new_here, r + kHd, RawIn{});
    }
    float z[U][V], kv[U][V];
    if constexpr (kEither)
      load_rows_either<TS, TI>(fs, fi, st_g, in_g, off, kHd, kv, z);
    else
      load_rows(fs, fi, sb, in_g, off, kHd, kv, z);
    float a[U][V];
    load_ape_rows<U, V, kHd, kDecode>(p.ape, p.ape_type, int64_t(g * U) * kHd + c, a);
    if (new_here) {  // (after the ape loads are issued: this waits for the loads)
      float k[V], sc[V];
      unpack(new_kv, k);
      unpack(new_sc, sc);
      round_vec<TS, V>(k);  // as the state holds it (a bf16 state rounds an fp32 input)
      round_vec<TS, V>(sc);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (g * U + u != new_row) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          kv[u][j] = k[j];
          z[u][j] = sc[j];
        }
      }
    }
    add_ape(a, z);
    pdl_trigger();

    // One partial state per row group and channel; the merge below combines the row groups.
    SoftmaxState acc[V];
    fold_window<U, V>(acc, z, kv);
    {
      float m[V], sum[V], acc_a[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        m[j] = acc[j].m;
        sum[j] = acc[j].s;
        acc_a[j] = acc[j].a;
      }
      store_vec(&part[0][g][lane * V], m);
      store_vec(&part[1][g][lane * V], sum);
      store_vec(&part[2][g][lane * V], acc_a);
    }
    __syncthreads();

    if (t < kC128Ch) {
      const int cc = t;
      const int ch = c0 + cc;
      // Merge of the partial states: the common max first, then independent rescales.
      float M = -FLT_MAX;
#pragma unroll
      for (int k = 0; k < kC128RowGroups; ++k) M = fmaxf(M, part[0][k][cc]);
      float S = 0.0f, A = 0.0f;
#pragma unroll
      for (int k = 0; k < kC128RowGroups; ++k) {
        const float f = fexp(part[0][k][cc] - M);
        S = fmaf(part[1][k][cc], f, S);
        A = fmaf(part[2][k][cc], f, A);
      }
      SoftmaxState x{M, S, A};
      if constexpr (kMode == kModeOnline) {
        if (seg.merge) {
          SoftmaxState y = softmax_empty();
          if (seg.read_slot >= 0 && seg.read_slot < p.num_state_rows) {
            const TS* r = st + seg.read_slot * kStRow;
            y = from_online(load_as_f32(r, ch), load_as_f32(r, kHd + ch),
                            load_as_f32(r, 2 * int64_t(kHd) + ch));
          }
          softmax_merge(y, x);
          x = y;
        }
        if (!p.online_store) {
          store_out(p.out, p.out_type, e * kHd + ch, softmax_value(x));
        } else if (seg.valid && seg.write_slot >= 0 && seg.write_slot < p.num_state_rows) {
          TS* r = st + seg.write_slot * kStRow;
          store_from_f32(r, ch, x.m);
          store_from_f32(r, kHd + ch, x.s);
          store_from_f32(r, 2 * int64_t(kHd) + ch, softmax_value(x));
        }
      } else {
        store_out(p.out, p.out_type, e * kHd + ch, softmax_value(x));
      }
    }
  };

  if constexpr (kDecode) {
    if (p.records_per_block <= 1) {  // (see nrec below)
      // A block per request and slice (a small batch). The block's channels of input row e0
      // (kv and score halves, V channels per thread) go to state row write_loc; they are loaded
      // together with the plan record (the address does not depend on it), first thing: a step
      // that closes no window costs this one round trip, and every instruction before it adds
      // to that.
      const bool has = t < kC128CopyLanes && e0 < p.num_in_rows;
      const RawIn cv = load_raw_if<TI, V, false>(has, in + e0 * kInRow + copy_at, RawIn{});
      const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e0];
      const int64_t wl = rec.write_loc;
      if (has && wl >= 0 && wl < p.num_state_rows) {
        float f[V];
        unpack(cv, f);
        store_vec(st + wl * kStRow + copy_at, f);
      }
      pool(e0, c128_decode_rows(p, rec), OnlineSegment{}, decode_new_row(rec, e0), 0);
      return;
    }
  }

  // Records e0 + k * stride, k < nrec (c128_records_per_block). With more than one, a thread per
  // record reads its plan record, all in one round trip, and sorts it: order[0, n_pool) are the
  // records to pool, order[nrec - n_zero, nrec) those that pool nothing. The block writes the
  // zero rows of the latter together, then pools the former in turn. Which of its records a
  // block pools first changes no result.
  // Decode with more than one (c128_decode_records_per_block, a large batch): the block copies
  // its slice of its records' rows and writes the zero rows of those that close nothing; then
  // every block counts the closing requests of the whole step in request order, and pools its
  // slice of those whose count c has c % stride == e0. The pooling is thus spread evenly over
  // the blocks whatever pattern of requests closes (an assignment of the block's own records
  // serialises some pattern), and a step that closes few windows costs about one block per
  // multiprocessor slot. The window row the step writes is pooled from the input row (as the
  // copy stores it), so that no block waits for another block's copy.
  const int nrec = p.records_per_block > 1 ? p.records_per_block : 1;
  const int64_t stride = int64_t(gridDim.x) / kSlices;
  __shared__ Rec recs[kC128MaxRecords];
  __shared__ int16_t order[kC128MaxRecords];
  __shared__ int n_pool, n_zero;
  constexpr int kScanGroups = kC128Block / kLaneGroup;
  __shared__ int32_t evs[kDecode ? kC128MaxRecords : 1];  // decode: the pooled requests
  // Decode scan, in rounds of kScanChunks chunks of kC128Block plan records: thread t holds
  // records t + kC128Block * j of the round (the first round's loaded with the copy rows), and
  // the closing requests per lane group and chunk (double-buffered by round). Rounds of 2 chunks
  // and the counts prefixed by lane shuffles, against a round per chunk whose every thread summed
  // the counts of the groups before its own, measured on the H200 (docs/performance_log.md,
  // nineteenth session): 4096 requests closing none 21.8 -> 19.1 us, 1024 8.4 -> 7.7, 256 equal;
  // rounds of 4 chunks lost 0.2-0.4 us on batches of 256-1024.
  constexpr int kScanChunks = 2;
  __shared__ int group_closing[2][kDecode ? kScanGroups : 1][kDecode ? kScanChunks : 1];
  static_assert(kScanGroups <= kLaneGroup, "the scan's lane-group counts fit one lane group");
  int to_pool = 1;
  const Rec* src = reinterpret_cast<const Rec*>(p.plan) + e0;  // record k
  if (nrec > 1) {
    src = recs;
    // Decode: record k's row is copied by threads t with t / 64 == k % 8; the first
    // kC128CopyAhead records' rows are loaded with the plan records (their addresses do not
    // depend on them).
    const auto copy_row = [&](int k) {
      const int64_t e = e0 + k * stride;
      return k < nrec && e < p.num_records && e < p.num_in_rows ? in + e * kInRow + copy_at
                                                                : nullptr;
    };
    constexpr int kStep = kC128Block / kC128CopyLanes;  // records whose rows a round copies
    constexpr int kAhead = kDecode ? kC128CopyAhead / kStep : 1;
    RawIn cv[kAhead];
    Rec scan_recs[kScanChunks];  // decode: the scan round's plan records (below)
    const auto load_scan_round = [&](int64_t b0) {
#pragma unroll
      for (int j = 0; j < kScanChunks; ++j) {
        const int64_t ev = b0 + j * kC128Block + t;
        if (ev < p.num_records) scan_recs[j] = reinterpret_cast<const Rec*>(p.plan)[ev];
      }
    };
    if constexpr (kDecode) {
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const TI* r = copy_row(t / kC128CopyLanes + j * kStep);
        cv[j] = load_raw_if<TI, V, false>(r != nullptr, r, RawIn{});
      }
      load_scan_round(0);
    }
    if (t == 0) n_pool = n_zero = 0;
    __syncthreads();
    if (t < nrec && e0 + t * stride < p.num_records) {
      const Rec rec = reinterpret_cast<const Rec*>(p.plan)[e0 + t * stride];
      recs[t] = rec;
      if (c128_record_pools<kMode>(p, rec))
        order[atomicAdd(&n_pool, 1)] = int16_t(t);
      else
        order[nrec - 1 - atomicAdd(&n_zero, 1)] = int16_t(t);
    }
    __syncthreads();
    to_pool = n_pool;
    if constexpr (kDecode) {
      const auto copy_to = [&](int k, RawIn v) {
        if (copy_row(k) == nullptr) return;
        const int64_t wl = recs[k].write_loc;
        if (wl < 0 || wl >= p.num_state_rows) return;
        float f[V];
        unpack(v, f);
        store_vec(st + wl * kStRow + copy_at, f);
      };
#pragma unroll
      for (int j = 0; j < kAhead; ++j) copy_to(t / kC128CopyLanes + j * kStep, cv[j]);
      // Further rounds of kAhead rows (a large batch): all loads of a round, then its stores
      // (a store between two loads would keep the next load waiting for the one before).
      for (int k0 = kC128CopyAhead + t / kC128CopyLanes; k0 < nrec; k0 += kAhead * kStep) {
#pragma unroll
        for (int j = 0; j < kAhead; ++j) {
          const TI* r = copy_row(k0 + j * kStep);
          cv[j] = load_raw_if<TI, V, false>(r != nullptr, r, RawIn{});
        }
#pragma unroll
        for (int j = 0; j < kAhead; ++j) copy_to(k0 + j * kStep, cv[j]);
      }
    }
    if (p.out != nullptr) {
      constexpr int kLanesPerRow = kC128Ch / 4;  // 4 channels per thread
      const float zero[4] = {};
      for (int k = nrec - n_zero + t / kLanesPerRow; k < nrec; k += kC128Block / kLanesPerRow)
        store_out_vec(p.out, p.out_type,
                      (e0 + order[k] * stride) * kHd + c0 + (t % kLanesPerRow) * 4, zero);
    }
    if constexpr (kDecode) {
      // The step's closing requests in request order (see above): recs / evs [0, to_pool) get
      // those of this block. The own records in recs are read (copies) before.
      __syncthreads();
      // 32-bit ranks and divisions (a 64-bit one is a slow library call, per thread and chunk):
      // a grouped decode has fewer than 2^31 records (c128_decode_groups).
      const uint32_t ustride = uint32_t(stride);
      const int lane_g = t % kLaneGroup, group = t / kLaneGroup;
      int64_t closing = 0;  // closing requests before the round
      for (int64_t b0 = 0, round = 0; b0 < p.num_records;
           b0 += kScanChunks * kC128Block, ++round) {
        if (round > 0) load_scan_round(b0);  // (the first round's were loaded with the copies)
        int(&counts)[kScanGroups][kScanChunks] = group_closing[round & 1];
        bool closes[kScanChunks];
        uint32_t mask[kScanChunks];
#pragma unroll
        for (int j = 0; j < kScanChunks; ++j) {
          closes[j] = b0 + j * kC128Block + t < p.num_records &&
                      c128_record_pools<kMode>(p, scan_recs[j]);
          mask[j] = group_ballot(closes[j]);
          if (lane_g == 0) counts[group][j] = __popc(mask[j]);
        }
        __syncthreads();  // (double-buffered counts: one barrier per round)
        // Per chunk, the closing requests up to lane group k, in lane k: a scan across lanes
        // that every warp does for itself (a thread summing the groups before its own took ~130
        // instructions per chunk, in every warp).
        int upto[kScanChunks];
#pragma unroll
        for (int j = 0; j < kScanChunks; ++j)
          upto[j] = lane_g < kScanGroups ? counts[lane_g][j] : 0;
#pragma unroll
        for (int d = 1; d < kScanGroups; d <<= 1) {
#pragma unroll
          for (int j = 0; j < kScanChunks; ++j) {
            const int u = shfl_idx(upto[j], lane_g >= d ? lane_g - d : lane_g);
            upto[j] += lane_g >= d ? u : 0;
          }
        }
        int total = 0;  // closing requests of the round's chunks before chunk j
#pragma unroll
        for (int j = 0; j < kScanChunks; ++j) {
          const int groups_before = shfl_idx(upto[j], group > 0 ? group - 1 : 0);
          const int before = total + (group > 0 ? groups_before : 0) +
                             __popc(mask[j] & ((1u << lane_g) - 1u));
          total += shfl_idx(upto[j], kScanGroups - 1);
          if (closes[j]) {  // rank ci: pooled by the block with ci % stride == e0, as its pool q
            const uint32_t ci = uint32_t(closing + before), q = ci / ustride;
            if (ci - q * ustride == uint32_t(e0)) {
              recs[q] = scan_recs[j];
              evs[q] = int32_t(b0 + j * kC128Block + t);
            }
          }
        }
        closing += total;
      }
      __syncthreads();
      to_pool = closing > e0 ? int(uint32_t(closing - e0 + stride - 1) / ustride) : 0;
    }
  }
  // Decode: no barrier between two records. Record i's partial states go to parts[i % 2], and a
  // thread writes them only after the barrier inside pool() of record i - 1 (every record here
  // pools, so every pool() call reaches it), which the merging threads reach only once they
  // have merged record i - 2 from that buffer.
  for (int i = 0; i < to_pool; ++i) {
    const int k = nrec > 1 ? (kDecode ? i : order[i]) : 0;
    if (!kDecode && i > 0) __syncthreads();  // every thread has read parts[] of the record before
    if constexpr (kMode == kModePrefill) {
      pool(e0 + k * stride, resolve_rows(offline_prefill_window(src[k], 128), 128,
                                         p.num_state_rows, p.num_in_rows),
           OnlineSegment{}, -1, 0);
    } else if constexpr (kDecode) {
      const DecodePlan rec = src[k];  // its row was copied above
      const int64_t e = evs[i];
      pool(e, c128_decode_rows(p, rec), OnlineSegment{}, decode_new_row(rec, e), i & 1);
    } else {
      const OnlineSegment seg = online_segment(src[k]);
      pool(e0 + k * stride, resolve_rows(seg.win, 128, p.num_state_rows, p.num_in_rows), seg, -1,
           0);
    }
  }
}

// ---- online decode ----------------------------------------------------------------------------

// One token per batch entry: q = (seq_len-1) % 128; fold z = score + ape[q] into the state at
// read_page_0 (restart at q == 0); q == 127: out = K' and the state is not stored; otherwise
// store (M, S', K') at write_loc and out = 0.
template <typename TS, typename TI>
__global__ void DSV4_COMPRESS_BOUNDS(kBlock, 2) online_decode_kernel(const Params p) {
  pdl_wait();
  const int hd = p.hd;
  const int lanes = hd / kVec;
  const int per_block = kBlock / lanes;
  const int64_t b = int64_t(blockIdx.x) * per_block + threadIdx.x / lanes;
  const int c = int(threadIdx.x % lanes) * kVec;
  if (b >= p.num_records) return;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t in_row = 2 * int64_t(hd), st_row = 3 * int64_t(hd);
  const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[b];
  float res[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (online_decode_active(rec) && b < p.num_in_rows) {
    const int q = online_decode_q(rec);
    SoftmaxState s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = softmax_empty();
    const int64_t rp0 = rec.read_page_0;
    if (q != 0 && rp0 >= 0 && rp0 < p.num_state_rows) {
      float m[4], S[4], K[4];
      const TS* r = st + rp0 * st_row;
      load_vec(r + c, m);
      load_vec(r + hd + c, S);
      load_vec(r + 2 * int64_t(hd) + c, K);
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = from_online(m[j], S[j], K[j]);
    }
    float kv[1][4], z[1][4], a[1][4];
    load_vec(in + b * in_row + c, kv[0]);
    load_vec(in + b * in_row + hd + c, z[0]);
    load_ape_rows<1, kVec, 0>(p.ape, p.ape_type, int64_t(q) * hd + c, a);  // one row: no stride
    add_ape(a, z);
    const bool present[1] = {true};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float zj[1] = {z[0][j]}, kj[1] = {kv[0][j]};
      softmax_fold<1>(s[j], zj, kj, present);
    }
    if (q == 127) {
#pragma unroll
      for (int j = 0; j < 4; ++j) res[j] = softmax_value(s[j]);
    } else {
      const int64_t wl = rec.write_loc;
      if (wl >= 0 && wl < p.num_state_rows) {
        float m[4], S[4], K[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          m[j] = s[j].m;
          S[j] = s[j].s;
          K[j] = softmax_value(s[j]);
        }
        TS* w = st + wl * st_row;
        store_vec(w + c, m);
        store_vec(w + hd + c, S);
        store_vec(w + 2 * int64_t(hd) + c, K);
      }
    }
  }
  pdl_trigger();
  store_out_vec(p.out, p.out_type, b * hd + c, res);
}

// ---- offline prefill writes -------------------------------------------------------------------

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
constexpr int kWriteGroups = kBlock / kLaneGroup;  // records in flight per block

template <typename TS, typename TI, int kRow>
__global__ void DSV4_COMPRESS_BOUNDS(kBlock, 2) write_rows_kernel(const Params p) {
  constexpr int kPerLane = kRow / (kLaneGroup * kVec);
  static_assert(kPerLane * kLaneGroup * kVec == kRow, "row vectors tile the lane group");
  if (!p.after_pool) pdl_wait();
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const auto* plan = reinterpret_cast<const WritePlan*>(p.plan);
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t stride = int64_t(gridDim.x) * kWriteGroups;
  for (int64_t k = int64_t(blockIdx.x) * kWriteGroups + threadIdx.x / kLaneGroup;
       k < p.num_records; k += stride) {
    const WritePlan w = plan[k];
    const int64_t src = int64_t(w.ragged_id), dst = w.write_loc;
    if (!is_valid(w) || src >= p.num_in_rows || dst < 0 || dst >= p.num_state_rows) continue;
    const TI* from = in + src * kRow + lane * kVec;
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

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
