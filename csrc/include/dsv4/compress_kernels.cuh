// compress_forward GPU kernels (CUDA and HIP from the same source; SPEC 3.4, 3.5).
//
// Torch-free. The math (row sources, absent rows, safe softmax, merges, online state) comes
// from compress_math.h, shared with the CPU kernel.
//
// Every thread owns kVec = 4 consecutive channels (one 16-byte fp32 / 8-byte bf16 vector per
// row). What makes these kernels fast is that each thread issues ALL its window loads back to
// back before it uses any: absent rows read a harmless stand-in address (the work item's own
// 16-byte plan record) instead of branching around the load, and their values are replaced
// afterwards (score -FLT_MAX, kv 0, see softmax_of). Branchy per-row loads serialised one
// memory round trip per row (measured on the H200: 3x slower small decode steps).
//   * c4_kernel<TS, TI, kDecode>: kC4Block = 128 threads; one event per hd/4 threads (hd 128:
//     4 events per block, hd 512: 1); a thread folds all 8 window rows of its channels.
//   * c128_kernel<TS, TI, kMode>: grid (events, hd / 64), kC128Block = 512 threads; a block
//     owns 64 channels of one event, its 16 lane x 32 row-group threads fold 4 rows each; the
//     partial states are merged across the row-group pair of a 32-lane group by one xor-16
//     shuffle, then across the 16 lane groups in shared memory (max first, then the sums).
//     Modes: offline prefill, offline decode, online prefill (segments).
//   * online_decode_kernel<TS, TI>: element-wise fold of one token into the running state.
//   * write_rows_kernel<TS, TI>: offline prefill plan_w (copy input rows into state slots);
//     launched after the compress kernel so that every compress read precedes every write.
// TS / TI: state / input element type, float or uint16_t (bf16 bits). ape (fp32 / bf16 /
// fp16) and out (fp32 / bf16) are runtime types: a uniform branch on a kernel argument.
//
// Explicit instantiation (e.g. for a hipcc check): every kernel is a template over
// TS, TI in {float, uint16_t} and, for c4_kernel, kDecode in {false, true}; for c128_kernel,
// kMode in {kModePrefill, kModeDecode, kModeOnline}; all take one `const Params` argument.
#pragma once

#include <type_traits>

#include "compress_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

constexpr int kBlock = 256;  // online decode and row writes

enum : int { kModePrefill = 0, kModeDecode = 1, kModeOnline = 2 };

constexpr int kC4Block = 128;                               // c4_kernel threads per block
constexpr int kC128Ch = 64;                                 // c128_kernel channels per block
constexpr int kC128Lanes = kC128Ch / kVec;                  // threads across those channels
constexpr int kC128Rows = 4;                                // window rows per thread
constexpr int kC128RowGroups = 128 / kC128Rows;             // 32
constexpr int kC128Block = kC128Lanes * kC128RowGroups;     // 512
constexpr int kC128Parts = kC128Block / kLaneGroup;         // partial states after the shuffle
static_assert(2 * kC128Lanes == kLaneGroup, "a lane group holds two row groups of one slice");

// Resident blocks per multiprocessor the pooling kernels are compiled for (register budget):
// tuning knobs, measured on the H200 (benchmarks/bench_compress.py).
#ifndef DSV4_C4_MIN_BLOCKS
#define DSV4_C4_MIN_BLOCKS 4
#endif
#ifndef DSV4_C128_MIN_BLOCKS
#define DSV4_C128_MIN_BLOCKS 2
#endif

#if defined(DSV4_HIP)
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

// ---- 4-channel vector accesses ---------------------------------------------------------------

DSV4_DEVICE void unpack_f32x4(const float4 t, float (&v)[4]) {
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}

DSV4_DEVICE void load4(const float* p, float (&v)[4]) {
  unpack_f32x4(*reinterpret_cast<const float4*>(p), v);
}

DSV4_DEVICE void unpack_bf16x4(const uint2 t, float (&v)[4]) {
  v[0] = bf16_to_f32(uint16_t(t.x & 0xffffu));
  v[1] = bf16_to_f32(uint16_t(t.x >> 16));
  v[2] = bf16_to_f32(uint16_t(t.y & 0xffffu));
  v[3] = bf16_to_f32(uint16_t(t.y >> 16));
}

DSV4_DEVICE void load4(const uint16_t* p, float (&v)[4]) {
  unpack_bf16x4(*reinterpret_cast<const uint2*>(p), v);
}

DSV4_DEVICE void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

DSV4_DEVICE void store4(uint16_t* p, const float (&v)[4]) {
  uint2 t;
  t.x = uint32_t(f32_to_bf16(v[0])) | (uint32_t(f32_to_bf16(v[1])) << 16);
  t.y = uint32_t(f32_to_bf16(v[2])) | (uint32_t(f32_to_bf16(v[3])) << 16);
  *reinterpret_cast<uint2*>(p) = t;
}

// ape[i .. i+3] of a runtime-typed [win, hd] table.
DSV4_DEVICE void load_ape4(const void* ape, int32_t type, int64_t i, float (&v)[4]) {
  if (type == kApeF32) {
    load4(static_cast<const float*>(ape) + i, v);
    return;
  }
  const uint2 t = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(ape) + i);
  if (type == kApeBF16) {
    unpack_bf16x4(t, v);
  } else {
    v[0] = f16_to_f32(uint16_t(t.x & 0xffffu));
    v[1] = f16_to_f32(uint16_t(t.x >> 16));
    v[2] = f16_to_f32(uint16_t(t.y & 0xffffu));
    v[3] = f16_to_f32(uint16_t(t.y >> 16));
  }
}

DSV4_DEVICE void store_out4(void* out, int32_t type, int64_t i, const float (&v)[4]) {
  if (type == kOutF32)
    store4(static_cast<float*>(out) + i, v);
  else
    store4(static_cast<uint16_t*>(out) + i, v);
}

template <typename T>
DSV4_DEVICE void round4(float (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = round_to(static_cast<const T*>(nullptr), v[j]);
}

// Window rows are read once per call: streaming (evict-first) loads on CUDA.
DSV4_DEVICE void load4_stream(const float* p, float (&v)[4]) {
#if defined(DSV4_HIP)
  load4(p, v);
#else
  unpack_f32x4(__ldcs(reinterpret_cast<const float4*>(p)), v);
#endif
}

DSV4_DEVICE void load4_stream(const uint16_t* p, float (&v)[4]) {
#if defined(DSV4_HIP)
  load4(p, v);
#else
  unpack_bf16x4(__ldcs(reinterpret_cast<const uint2*>(p)), v);
#endif
}

// Window row loads: (kv, score) of one row at kv_off / sc_off from its source, issued
// unconditionally (absent rows read `stand_in`, 16 valid bytes); absent rows come back as
// kv = 0, score = -FLT_MAX, which softmax_of weighs 0.
template <typename TS, typename TI>
DSV4_DEVICE void load_window_row(const TS* st, const TI* in, int64_t st_row, int64_t in_row,
                                 const RowSource& s, int64_t kv_off, int64_t sc_off,
                                 const void* stand_in, float (&kv)[4], float (&sc)[4]) {
  const bool from_state = s.kind == kFromState, from_input = s.kind == kFromInput;
  if constexpr (std::is_same<TS, TI>::value) {
    const TS* base = (from_state ? st : in) + s.index * (from_state ? st_row : in_row);
    const bool on = from_state || from_input;
    load4_stream(on ? base + kv_off : static_cast<const TS*>(stand_in), kv);
    load4_stream(on ? base + sc_off : static_cast<const TS*>(stand_in), sc);
  } else {
    // Mixed dtypes: the input load stays unconditional (prefill rows are nearly all input
    // rows); the state load is a branch of its own.
    const TI* ib = in + s.index * in_row;
    load4_stream(from_input ? ib + kv_off : static_cast<const TI*>(stand_in), kv);
    load4_stream(from_input ? ib + sc_off : static_cast<const TI*>(stand_in), sc);
    if (from_state) {
      load4_stream(st + s.index * st_row + kv_off, kv);
      load4_stream(st + s.index * st_row + sc_off, sc);
    }
  }
  if (!(from_state || from_input)) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kv[j] = 0.0f;
      sc[j] = -FLT_MAX;
    }
  }
}

// z <- score + ape[r]. An absent row's -FLT_MAX stays -FLT_MAX (ape is far smaller; the
// clamp keeps a huge negative ape from making it -inf, which would give inf - inf later).
DSV4_DEVICE void add_ape(const Params& p, int r, int c, float (&z)[4]) {
  float a[4];
  load_ape4(p.ape, p.ape_type, int64_t(r) * p.hd + c, a);
#pragma unroll
  for (int j = 0; j < 4; ++j) z[j] = fmaxf(z[j] + a[j], -FLT_MAX);
}

// Softmax states of U loaded rows, one per channel of the thread.
template <int U>
DSV4_DEVICE void fold_window(SoftmaxState (&acc)[4], const float (&z)[U][4], const float (&kv)[U][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
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
// Decode (kDecode true): plan = DecodePlan rows; copy input row e into write_loc and pool the
// window from the state, the just-written row entering as its state-dtype value (taken from
// registers: the thread that copies channels c..c+3 of the row is the one that pools them).
template <typename TS, typename TI, bool kDecode>
__global__ void DSV4_COMPRESS_BOUNDS(kC4Block, DSV4_C4_MIN_BLOCKS) c4_kernel(const Params p) {
  pdl_wait();
  const int hd = p.hd;
  const int lanes = hd / kVec;  // threads of one event: 32 (hd 128) / 128 (hd 512)
  const int t = int(threadIdx.x);
  const int64_t e = int64_t(blockIdx.x) * (kC4Block / lanes) + t / lanes;
  const int c = (t % lanes) * kVec;
  const bool active = e < p.num_records;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t row = 4 * int64_t(hd);  // input and state rows
  const uint8_t* stand_in = p.plan + (active ? e : 0) * 16;

  WindowDesc d{0, -1, -1, 0, 0, 0};
  int64_t wl = -1;
  bool copy = false;
  float cp[4][4];  // decode: quarters 0..3 of input row e at c..c+3, state-rounded
  if (active) {
    if constexpr (kDecode) {
      const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e];
      d = offline_decode_window(rec, 4);
      wl = rec.write_loc;
      copy = wl >= 0 && wl < p.num_state_rows && e < p.num_in_rows;
    } else {
      d = offline_prefill_window(reinterpret_cast<const CompressPlan*>(p.plan)[e], 4);
    }
  }
  if constexpr (kDecode) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      load4(copy ? in + e * row + q * int64_t(hd) + c : static_cast<const TI*>(
                                                            static_cast<const void*>(stand_in)),
            cp[q]);
      round4<TS>(cp[q]);
    }
  }

  float z[8][4], kv[8][4];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const RowSource s = row_source(d, 4, r, p.num_state_rows, p.num_in_rows);
    load_window_row(st, in, row, row, s, kv_offset(4, hd, r) + c, score_offset(4, hd, r) + c,
                    stand_in, kv[r], z[r]);
    if (kDecode && copy && s.kind == kFromState && s.index == wl) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kv[r][j] = cp[r < 4 ? 0 : 1][j];
        z[r][j] = cp[r < 4 ? 2 : 3][j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) add_ape(p, r, c, z[r]);
  pdl_trigger();
  if (!active) return;

  SoftmaxState acc[4];
  fold_window<8>(acc, z, kv);
  float res[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) res[j] = softmax_value(acc[j]);
  store_out4(p.out, p.out_type, e * hd + c, res);

  if constexpr (kDecode) {
    if (copy) {
#pragma unroll
      for (int q = 0; q < 4; ++q) store4(st + wl * row + q * int64_t(hd) + c, cp[q]);
    }
  }
}

// ---- cr = 128 -------------------------------------------------------------------------------

// kModePrefill: CompressPlan rows, window per SPEC 3.1 -> out[e].
// kModeDecode: DecodePlan rows; copy input row e into write_loc (by the row group that pools
//   that row, which uses the state-rounded registers), pool page read_page_1 -> out[e].
// kModeOnline: online segments (CompressPlan rows); merge with the stored state when the
//   segment does not start its chunk; p.online_store == 0: out[e] = K, else store (M, S, K)
//   at read_page_0 (p.out is null).
template <typename TS, typename TI, int kMode>
__global__ void DSV4_COMPRESS_BOUNDS(kC128Block, DSV4_C128_MIN_BLOCKS) c128_kernel(const Params p) {
  alignas(16) __shared__ float part[3][kC128Parts][kC128Ch];

  pdl_wait();
  const int64_t e = blockIdx.x;
  const int t = int(threadIdx.x);
  const int g = t / kC128Lanes;  // row group: window rows 4g .. 4g+3
  const int lane = t % kC128Lanes;
  const int hd = p.hd;
  const int c0 = int(blockIdx.y) * kC128Ch;
  const int c = c0 + lane * kVec;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t in_row = 2 * int64_t(hd);
  const int64_t st_row = kMode == kModeOnline ? 3 * int64_t(hd) : in_row;
  const uint8_t* stand_in = p.plan + e * 16;

  WindowDesc d{};
  OnlineSegment seg{};
  int64_t wl = -1;
  bool copier = false;
  float ckv[4], csc[4];  // decode: input row e at channels c..c+3 (kv, score), state-rounded
  if constexpr (kMode == kModePrefill) {
    d = offline_prefill_window(reinterpret_cast<const CompressPlan*>(p.plan)[e], 128);
  } else if constexpr (kMode == kModeDecode) {
    const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e];
    d = offline_decode_window(rec, 128);
    wl = rec.write_loc;
    const bool copy = wl >= 0 && wl < p.num_state_rows && e < p.num_in_rows;
    // Window row of the written slot (-1: not in this window): its row group copies.
    int64_t rw = -1;
    if (d.hi > 0 && d.page1 >= 0 && d.page1 < p.num_state_rows / 128) {
      const int64_t o = wl - d.page1 * 128;
      rw = (o >= 0 && o < 128) ? o : -1;
    }
    copier = copy && g == (rw >= 0 ? int(rw) / kC128Rows : 0);
    const TI* src = copier ? in + e * in_row + c : static_cast<const TI*>(static_cast<const void*>(stand_in));
    load4(src, ckv);
    load4(copier ? src + hd : src, csc);
    round4<TS>(ckv);
    round4<TS>(csc);
  } else {
    seg = online_segment(reinterpret_cast<const CompressPlan*>(p.plan)[e]);
    d = seg.win;
  }

  float z[kC128Rows][4], kv[kC128Rows][4];
#pragma unroll
  for (int u = 0; u < kC128Rows; ++u) {
    const RowSource s = row_source(d, 128, g * kC128Rows + u, p.num_state_rows, p.num_in_rows);
    load_window_row(st, in, st_row, in_row, s, int64_t(c), int64_t(hd) + c, stand_in, kv[u], z[u]);
    if (kMode == kModeDecode && copier && s.kind == kFromState && s.index == wl) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kv[u][j] = ckv[j];
        z[u][j] = csc[j];
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kC128Rows; ++u) add_ape(p, g * kC128Rows + u, c, z[u]);
  pdl_trigger();

  SoftmaxState acc[4];
  fold_window<kC128Rows>(acc, z, kv);
  // Row groups 2k and 2k+1 share a lane group: merge them (same order in both halves).
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const SoftmaxState o{shfl_xor(acc[j].m, kC128Lanes), shfl_xor(acc[j].s, kC128Lanes),
                         shfl_xor(acc[j].a, kC128Lanes)};
    SoftmaxState lo = (g & 1) ? o : acc[j];
    softmax_merge(lo, (g & 1) ? acc[j] : o);
    acc[j] = lo;
  }
  if ((g & 1) == 0) {
    float m4[4], s4[4], a4[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m4[j] = acc[j].m;
      s4[j] = acc[j].s;
      a4[j] = acc[j].a;
    }
    store4(&part[0][g / 2][lane * kVec], m4);
    store4(&part[1][g / 2][lane * kVec], s4);
    store4(&part[2][g / 2][lane * kVec], a4);
  }
  __syncthreads();

  if (t < kC128Ch) {
    const int cc = t;
    const int ch = c0 + cc;
    // Merge of the partial states: the common max first, then independent rescales.
    float M = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < kC128Parts; ++k) M = fmaxf(M, part[0][k][cc]);
    float S = 0.0f, A = 0.0f;
#pragma unroll
    for (int k = 0; k < kC128Parts; ++k) {
      const float f = fexp(part[0][k][cc] - M);
      S = fmaf(part[1][k][cc], f, S);
      A = fmaf(part[2][k][cc], f, A);
    }
    SoftmaxState x{M, S, A};
    if constexpr (kMode == kModeOnline) {
      if (seg.merge) {
        SoftmaxState y = softmax_empty();
        if (seg.read_slot >= 0 && seg.read_slot < p.num_state_rows) {
          const TS* r = st + seg.read_slot * st_row;
          y = from_online(load_as_f32(r, ch), load_as_f32(r, hd + ch),
                          load_as_f32(r, 2 * int64_t(hd) + ch));
        }
        softmax_merge(y, x);
        x = y;
      }
      if (!p.online_store) {
        store_out(p.out, p.out_type, e * hd + ch, softmax_value(x));
      } else if (seg.valid && seg.write_slot >= 0 && seg.write_slot < p.num_state_rows) {
        TS* r = st + seg.write_slot * st_row;
        store_from_f32(r, ch, x.m);
        store_from_f32(r, hd + ch, x.s);
        store_from_f32(r, 2 * int64_t(hd) + ch, softmax_value(x));
      }
    } else {
      store_out(p.out, p.out_type, e * hd + ch, softmax_value(x));
    }
  }

  if constexpr (kMode == kModeDecode) {
    if (copier) {
      store4(st + wl * st_row + c, ckv);
      store4(st + wl * st_row + hd + c, csc);
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
      load4(r + c, m);
      load4(r + hd + c, S);
      load4(r + 2 * int64_t(hd) + c, K);
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = from_online(m[j], S[j], K[j]);
    }
    float kv[1][4], z[1][4], a[4];
    load4(in + b * in_row + c, kv[0]);
    load4(in + b * in_row + hd + c, z[0]);
    load_ape4(p.ape, p.ape_type, int64_t(q) * hd + c, a);
#pragma unroll
    for (int j = 0; j < 4; ++j) z[0][j] += a[j];
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
        store4(w + c, m);
        store4(w + hd + c, S);
        store4(w + 2 * int64_t(hd) + c, K);
      }
    }
  }
  pdl_trigger();
  store_out4(p.out, p.out_type, b * hd + c, res);
}

// ---- offline prefill writes -------------------------------------------------------------------

// Copy input row ragged_id into state slot write_loc for every valid WritePlan record (input
// and state rows have the same width). One 32-lane group per record (grid-stride): a group
// reads its record once and skips an invalid one as a whole, so the planners' padding of
// num_q_tokens mostly-invalid records costs one load per group, not one per row element.
constexpr int kWriteGroups = kBlock / kLaneGroup;  // records in flight per block

template <typename TS, typename TI>
__global__ void DSV4_COMPRESS_BOUNDS(kBlock, 2) write_rows_kernel(const Params p) {
  pdl_wait();
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t row = input_row_elems(p.cr, p.hd);
  const auto* plan = reinterpret_cast<const WritePlan*>(p.plan);
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t stride = int64_t(gridDim.x) * kWriteGroups;
  for (int64_t k = int64_t(blockIdx.x) * kWriteGroups + threadIdx.x / kLaneGroup;
       k < p.num_records; k += stride) {
    const WritePlan w = plan[k];
    if (!is_valid(w)) continue;
    const int64_t src = int64_t(w.ragged_id), dst = w.write_loc;
    if (src >= p.num_in_rows || dst < 0 || dst >= p.num_state_rows) continue;
    const TI* from = in + src * row;
    TS* to = st + dst * row;
#pragma unroll 4
    for (int64_t v = lane * kVec; v < row; v += kLaneGroup * kVec) {
      float x[4];
      load4(from + v, x);
      store4(to + v, x);
    }
  }
  pdl_trigger();
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
