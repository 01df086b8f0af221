// compress_forward GPU kernels (CUDA and HIP from the same source; SPEC 3.4, 3.5).
//
// Torch-free. The math (row sources, absent rows, chunked safe softmax, merges, online state)
// comes from compress_math.h, shared with the CPU kernel.
//
// Work decomposition (all blocks kBlock = 256 threads, every thread owns kVec = 4 consecutive
// channels, loaded as one 16-byte fp32 / 8-byte bf16 vector):
//   * c4_kernel<TS, TI, kDecode>: one compress event per hd/4 threads (hd 128: 8 events per
//     block, hd 512: 2); each thread loads its 8 window rows (kv + score quarters) at once
//     and folds them in one chunk.
//   * c128_kernel<TS, TI, kMode>: grid (events, hd / 128); a block owns 128 channels of one
//     event; its 8 lane groups of 32 threads take 16 window rows each (2 chunks of 8 rows,
//     one softmax rescale per chunk) and the 8 partial (max, sum, acc) states are merged in
//     shared memory. Modes: offline prefill, offline decode, online prefill (segments).
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

#include "compress_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

constexpr int kBlock = 256;

enum : int { kModePrefill = 0, kModeDecode = 1, kModeOnline = 2 };

// Resident blocks per multiprocessor the pooling kernels are compiled for (register budget):
// tuning knobs, measured on the H200 (benchmarks/).
#ifndef DSV4_C4_MIN_BLOCKS
#define DSV4_C4_MIN_BLOCKS 3
#endif
#ifndef DSV4_C128_MIN_BLOCKS  // prefill and online segments
#define DSV4_C128_MIN_BLOCKS 4
#endif
#ifndef DSV4_C128_DECODE_MIN_BLOCKS  // decode also carries the copied row: more registers
#define DSV4_C128_DECODE_MIN_BLOCKS 3
#endif

#if defined(DSV4_HIP)
#define DSV4_COMPRESS_BOUNDS(min_blocks) __launch_bounds__(kBlock)
#else
#define DSV4_COMPRESS_BOUNDS(min_blocks) __launch_bounds__(kBlock, min_blocks)
#endif

// ---- 4-channel vector accesses ---------------------------------------------------------------

DSV4_DEVICE void load4(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
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

// Load (kv, score) of window row r at channel c from its source into registers; absent rows
// give kv = 0, score = -FLT_MAX (their weight is masked to 0 by `present`).
template <typename TS, typename TI>
DSV4_DEVICE void load_row(const TS* st, const TI* in, int64_t st_row, int64_t in_row,
                          const RowSource& s, int64_t kv_off, int64_t sc_off, float (&kv)[4],
                          float (&sc)[4]) {
  if (s.kind == kFromState) {
    const TS* p = st + s.index * st_row;
    load4(p + kv_off, kv);
    load4(p + sc_off, sc);
  } else if (s.kind == kFromInput) {
    const TI* p = in + s.index * in_row;
    load4(p + kv_off, kv);
    load4(p + sc_off, sc);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kv[j] = 0.0f;
      sc[j] = -FLT_MAX;
    }
  }
}

// Fold U loaded rows (z already includes ape) into the 4 per-channel states.
template <int U>
DSV4_DEVICE void fold_rows(SoftmaxState (&acc)[4], const float (&z)[U][4], const float (&kv)[U][4],
                           const bool (&present)[U]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float zj[U], kj[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      zj[u] = z[u][j];
      kj[u] = kv[u][j];
    }
    softmax_fold<U>(acc[j], zj, kj, present);
  }
}

// ---- cr = 4 ---------------------------------------------------------------------------------

// Prefill (kDecode false): plan = CompressPlan rows, pool each window into out[e].
// Decode (kDecode true): plan = DecodePlan rows; copy input row e into write_loc and pool the
// window from the state, the just-written row entering as its state-dtype value (taken from
// registers: the thread that copies channels c..c+3 of a quarter is one that pools them).
//
// The 8 window rows are split between the two halves of each 32-lane group: lanes 0..15 fold
// rows 0..3 (previous window, overlap quarters), lanes 16..31 rows 4..7 (current window) of
// the same 16 channel groups, and one xor-16 exchange merges the two partial softmax states.
// Half the registers of a whole-window thread, so twice the resident warps keep more loads in
// flight (the kernel is latency-bound otherwise). A lane group never spans two events.
DSV4_HD constexpr int c4_event_threads(int hd) { return 2 * hd / kVec; }  // 64 (hd 128) / 256 (hd 512)

template <typename TS, typename TI, bool kDecode>
__global__ void DSV4_COMPRESS_BOUNDS(DSV4_C4_MIN_BLOCKS) c4_kernel(const Params p) {
  pdl_wait();
  const int hd = p.hd;
  const int lanes = hd / kVec;                       // channel groups of one event
  const int t = int(threadIdx.x);
  const int half = (t / 16) & 1;                     // 0: rows 0..3, 1: rows 4..7
  const int cg = (t / kLaneGroup) * 16 + (t % 16);   // channel group within the block
  const int64_t e = int64_t(blockIdx.x) * (kBlock / c4_event_threads(hd)) + cg / lanes;
  const int c = (cg % lanes) * kVec;
  const bool active = e < p.num_records;             // uniform per lane group

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t row = 4 * int64_t(hd);  // input and state rows

  WindowDesc d{};
  int64_t wl = -1;
  bool copy = false;
  float cp_kv[4], cp_sc[4];  // decode: quarters `half` and `half + 2` of input row e, state-rounded
  if (active) {
    if constexpr (kDecode) {
      const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e];
      d = offline_decode_window(rec, 4);
      wl = rec.write_loc;
      copy = wl >= 0 && wl < p.num_state_rows && e < p.num_in_rows;
      if (copy) {
        load4(in + e * row + half * int64_t(hd) + c, cp_kv);
        load4(in + e * row + (half + 2) * int64_t(hd) + c, cp_sc);
        round4<TS>(cp_kv);
        round4<TS>(cp_sc);
      }
    } else {
      const CompressPlan rec = reinterpret_cast<const CompressPlan*>(p.plan)[e];
      d = offline_prefill_window(rec, 4);
    }
  }

  float z[4][4], kv[4][4];
  bool present[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = half * 4 + u;
    const RowSource s = active ? row_source(d, 4, r, p.num_state_rows, p.num_in_rows)
                               : RowSource{kAbsent, -1};
    present[u] = s.kind != kAbsent;
    if (kDecode && copy && s.kind == kFromState && s.index == wl) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kv[u][j] = cp_kv[j];
        z[u][j] = cp_sc[j];
      }
    } else {
      load_row(st, in, row, row, s, kv_offset(4, hd, r) + c, score_offset(4, hd, r) + c, kv[u],
               z[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    float a[4];
    load_ape4(p.ape, p.ape_type, int64_t(half * 4 + u) * hd + c, a);
#pragma unroll
    for (int j = 0; j < 4; ++j) z[u][j] += a[j];
  }
  pdl_trigger();

  SoftmaxState acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = softmax_empty();
  fold_rows<4>(acc, z, kv, present);
  float res[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const SoftmaxState other{shfl_xor(acc[j].m, 16), shfl_xor(acc[j].s, 16), shfl_xor(acc[j].a, 16)};
    if (half == 0) {
      softmax_merge(acc[j], other);
    } else {  // same merge order in both halves, so both hold the same bits
      SoftmaxState mine = other;
      softmax_merge(mine, acc[j]);
      acc[j] = mine;
    }
    res[j] = softmax_value(acc[j]);
  }
  if (!active) return;
  if (half == 0) store_out4(p.out, p.out_type, e * hd + c, res);

  if constexpr (kDecode) {
    if (copy) {
      store4(st + wl * row + half * int64_t(hd) + c, cp_kv);
      store4(st + wl * row + (half + 2) * int64_t(hd) + c, cp_sc);
    }
  }
}

// ---- cr = 128 -------------------------------------------------------------------------------

// kModePrefill: CompressPlan rows, window per SPEC 3.1 -> out[e].
// kModeDecode: DecodePlan rows; copy input row e into write_loc (by the lane group that pools
//   that row, which uses the state-rounded registers), pool page read_page_1 -> out[e].
// kModeOnline: online segments (CompressPlan rows); merge with the stored state when the
//   segment does not start its chunk; p.online_store == 0: out[e] = K, else store (M, S, K)
//   at read_page_0 (p.out is null).
template <typename TS, typename TI, int kMode>
__global__ void DSV4_COMPRESS_BOUNDS(kMode == kModeDecode ? DSV4_C128_DECODE_MIN_BLOCKS : DSV4_C128_MIN_BLOCKS) c128_kernel(const Params p) {
  constexpr int kGroupThreads = kBlock / kC128Groups;  // 32 threads x 4 channels = one slice
  static_assert(kGroupThreads * kVec == kC128SliceCh, "a lane group covers one channel slice");
  alignas(16) __shared__ float part[3][kC128Groups][kC128SliceCh];

  pdl_wait();
  const int64_t e = blockIdx.x;
  const int g = int(threadIdx.x) / kGroupThreads;
  const int lane = int(threadIdx.x) % kGroupThreads;
  const int hd = p.hd;
  const int c0 = int(blockIdx.y) * kC128SliceCh;
  const int c = c0 + lane * kVec;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t in_row = 2 * int64_t(hd);
  const int64_t st_row = kMode == kModeOnline ? 3 * int64_t(hd) : in_row;

  WindowDesc d{};
  OnlineSegment seg{};
  int64_t wl = -1;
  bool copier = false;
  float ckv[4], csc[4];  // decode: input row e at channels c..c+3 (kv, score), state-rounded
  if constexpr (kMode == kModePrefill) {
    const CompressPlan rec = reinterpret_cast<const CompressPlan*>(p.plan)[e];
    d = offline_prefill_window(rec, 128);
  } else if constexpr (kMode == kModeDecode) {
    const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e];
    d = offline_decode_window(rec, 128);
    wl = rec.write_loc;
    const bool copy = wl >= 0 && wl < p.num_state_rows && e < p.num_in_rows;
    // Window row of the written slot (-1: not in this window): its lane group copies.
    int64_t rw = -1;
    if (d.hi > 0 && d.page1 >= 0 && d.page1 < p.num_state_rows / 128) {
      const int64_t t = wl - d.page1 * 128;
      rw = (t >= 0 && t < 128) ? t : -1;
    }
    copier = copy && g == (rw >= 0 ? int(rw) / kC128GroupRows : 0);
    if (copier) {
      load4(in + e * in_row + c, ckv);
      load4(in + e * in_row + hd + c, csc);
      round4<TS>(ckv);
      round4<TS>(csc);
    }
  } else {
    const CompressPlan rec = reinterpret_cast<const CompressPlan*>(p.plan)[e];
    seg = online_segment(rec);
    d = seg.win;
  }

  SoftmaxState acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = softmax_empty();
#pragma unroll
  for (int chunk = 0; chunk < kC128GroupRows / kChunk; ++chunk) {
    const int r0 = g * kC128GroupRows + chunk * kChunk;
    if (r0 + kChunk <= d.lo || r0 >= d.hi) continue;  // uniform per lane group
    float z[kChunk][4], kv[kChunk][4];
    bool present[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const RowSource s = row_source(d, 128, r0 + u, p.num_state_rows, p.num_in_rows);
      present[u] = s.kind != kAbsent;
      if (kMode == kModeDecode && copier && s.kind == kFromState && s.index == wl) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          kv[u][j] = ckv[j];
          z[u][j] = csc[j];
        }
      } else {
        load_row(st, in, st_row, in_row, s, int64_t(c), int64_t(hd) + c, kv[u], z[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      float a[4];
      load_ape4(p.ape, p.ape_type, int64_t(r0 + u) * hd + c, a);
#pragma unroll
      for (int j = 0; j < 4; ++j) z[u][j] += a[j];
    }
    fold_rows<kChunk>(acc, z, kv, present);
  }
  pdl_trigger();

  {
    float m4[4], s4[4], a4[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m4[j] = acc[j].m;
      s4[j] = acc[j].s;
      a4[j] = acc[j].a;
    }
    store4(&part[0][g][lane * kVec], m4);
    store4(&part[1][g][lane * kVec], s4);
    store4(&part[2][g][lane * kVec], a4);
  }
  __syncthreads();

  if (threadIdx.x < kC128SliceCh) {
    const int cc = int(threadIdx.x);
    const int ch = c0 + cc;
    SoftmaxState x{part[0][0][cc], part[1][0][cc], part[2][0][cc]};
#pragma unroll
    for (int gg = 1; gg < kC128Groups; ++gg)
      softmax_merge(x, SoftmaxState{part[0][gg][cc], part[1][gg][cc], part[2][gg][cc]});
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
__global__ void DSV4_COMPRESS_BOUNDS(2) online_decode_kernel(const Params p) {
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
    fold_rows<1>(s, z, kv, present);
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
// and state rows have the same width); 4 elements per thread and step, grid-stride.
template <typename TS, typename TI>
__global__ void DSV4_COMPRESS_BOUNDS(2) write_rows_kernel(const Params p) {
  pdl_wait();
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t row = input_row_elems(p.cr, p.hd);
  const int64_t vecs = row / kVec;
  const int64_t total = p.num_records * vecs;
  const auto* plan = reinterpret_cast<const WritePlan*>(p.plan);
  for (int64_t i = int64_t(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kBlock) {
    const int64_t k = i / vecs;
    const int64_t v = (i - k * vecs) * kVec;
    const WritePlan w = plan[k];
    if (!is_valid(w)) continue;
    const int64_t src = int64_t(w.ragged_id), dst = w.write_loc;
    if (src >= p.num_in_rows || dst < 0 || dst >= p.num_state_rows) continue;
    float x[4];
    load4(in + src * row + v, x);
    store4(st + dst * row + v, x);
  }
  pdl_trigger();
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
