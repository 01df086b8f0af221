// Device functions of the V4.1 GPU kernels (docs/contract.md, "V4.1"). A 512-dim row is four
// 128-dim chunks; lane l of a 32-lane group holds dims lane_dim(j, l, k) = 128j + 4l + k (k < 4)
// of a chunk j. A kernel holds a row in one of two mappings, a template argument kChunks (the
// chunks a thread holds; the launch picks it by the row count: low_ratio_cuda.cu, row_chunks):
//   kChunks = 1: four lane groups a row (group j = chunk j, 4 values a thread): a row's
//     arithmetic spread over 128 threads, for the small (decode-sized) launches;
//   kChunks = 4: one lane group a row (16 values a thread): 4x a thread's loads in flight, for
//     the large (bandwidth-bound) launches.
// Every tile of the layouts (16, 32 or 64 dims) lies inside one chunk, so amaxes and scales are
// lane-group reductions in both; the RMSNorm sum of squares adds the four chunk sums in the
// fixed order of latent_sumsq (low_ratio_math.h) in both (through shared memory across the four
// groups), so the two mappings write the same bytes. The functions here: the latent, the RoPE of
// the last 64 dims (chunk 3, lanes 16..31), the fp4 fake quant and the encoding + store into a
// cache slot of a V4.1 layout. The encoder also serves the V4.1 layouts of
// compress_norm_rope_store (store/store_kernel.cuh, one lane group holding all four chunks of a
// token); the per-value functions are low_ratio_math.h's, so the bytes equal the CPU kernels'.
#pragma once

#include "../low_ratio_math.h"
#include "../store/memory_access.cuh"
#include "../store/quantize.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace low_ratio {

constexpr int kRowChunks = kLowRatioHeadDim / 128;  // 128-dim chunks of a row
constexpr int kBlockThreadsMax = 256;               // whole rows, whole 64-lane wavefronts

// Threads of one 512-dim row when each holds `chunks` chunks (1 or kRowChunks), and the most
// rows a block then holds.
constexpr int row_threads(int chunks) { return kRowChunks / chunks * kLaneGroup; }
constexpr int rows_per_block_max(int chunks) { return kBlockThreadsMax / row_threads(chunks); }
static_assert(kBlockThreadsMax % row_threads(1) == 0 && kBlockThreadsMax % 64 == 0,
              "a block holds whole rows and whole wavefronts");

// A thread's values of a 512-dim row: v[i][k] is dim lane_dim(chunk + i, lane, k) (RowThread).
template <int kChunks>
using RowPart = float[kChunks][4];

// The calling thread's place: row (blockDim.x / row_threads(kChunks) rows a block), its first
// chunk and lane, and the row's index inside the block (`slot`, for the shared sums).
struct RowThread {
  int64_t row;
  int chunk;
  int lane;
  int slot;
};
template <int kChunks>
DSV4_DEVICE RowThread row_thread() {
  static_assert(kChunks == 1 || kChunks == kRowChunks, "a thread holds one chunk or all four");
  constexpr int kThreads = row_threads(kChunks);
  const int tid = int(threadIdx.x);
  RowThread r;
  r.slot = tid / kThreads;
  r.chunk = tid % kThreads / kLaneGroup * kChunks;
  r.lane = tid % kLaneGroup;
  r.row = int64_t(blockIdx.x) * (blockDim.x / kThreads) + r.slot;
  return r;
}

// The calling thread's lane and the row of its lane group, for the 128-dim rows of index-K
// (one lane group a row, blockDim.x / 32 rows a block).
DSV4_DEVICE int64_t group_row(int* lane) {
  *lane = int(threadIdx.x) % kLaneGroup;
  return int64_t(blockIdx.x) * (blockDim.x / kLaneGroup) + threadIdx.x / kLaneGroup;
}

// The RoPE dims of a 128-dim chunk are its lanes 16..31 (dims 64..127); lane l's pairs (k = 0, 1)
// and (2, 3) are tail pairs 2(l - 16) and 2(l - 16) + 1, i.e. floats 4(l - 16) .. +3 of a freqs
// row. A 512-dim row rotates dims 448..511: chunk 3's, a thread's last chunk.
DSV4_DEVICE bool rope_lane(int lane) { return lane >= kLaneGroup / 2; }
DSV4_DEVICE int rope_offset(int lane) { return 4 * (lane - kLaneGroup / 2); }
template <int kChunks>
DSV4_DEVICE bool rope_thread(const RowThread& r) {
  return r.chunk + kChunks == kRowChunks && rope_lane(r.lane);
}

// An index tensor's element i (int32 or int64).
DSV4_DEVICE int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}

// The thread's values of a bf16 row (or weight) and of an fp32 one.
template <int kChunks>
DSV4_DEVICE void load_bf16_part(const uint16_t* row, const RowThread& r, bool vec,
                                RowPart<kChunks>& v) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    uint32_t b[4];
    store_detail::load_bits(row + lane_dim(r.chunk + i, r.lane, 0), vec, b);
    store_detail::bits_to_f32(b, true, v[i]);
  }
}
template <int kChunks>
DSV4_DEVICE void load_f32_part(const float* row, const RowThread& r, bool vec,
                               RowPart<kChunks>& v) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
    store_detail::load4(row + lane_dim(r.chunk + i, r.lane, 0), vec, v[i]);
}
// The norm weight, bf16 bits (w_bf16) or fp32.
template <int kChunks>
DSV4_DEVICE void load_weight(const void* w, bool w_bf16, const RowThread& r, bool vec,
                             RowPart<kChunks>& v) {
  if (w_bf16) load_bf16_part(static_cast<const uint16_t*>(w), r, vec, v);
  else load_f32_part(static_cast<const float*>(w), r, vec, v);
}

// The (cos, sin) pairs of a rope lane from a 64-float freqs row; identity elsewhere
// (`rotates`: the thread holds RoPE dims).
DSV4_DEVICE void load_rope_pairs(const float* freqs_row, int lane, bool rotates, bool vec,
                                 float (&f)[4]) {
  f[0] = 1.0f;
  f[1] = 0.0f;
  f[2] = 1.0f;
  f[3] = 0.0f;
  if (rotates) store_detail::load4(freqs_row + rope_offset(lane), vec, f);
}

// The sum of squares of a 512-dim row (contract V4.1 1.4) in latent_sumsq's order: each lane's
// partial over k of each chunk, the lane group's xor-butterfly of each (group_sum's, the
// chunks' interleaved: the chunk sums), then the four chunk sums in chunk order; with four
// groups a row through shared memory. kChunks = 1 is a block barrier: every thread of the
// block calls it, once per kernel (threads of rows that publish nothing pass zeros).
template <int kChunks>
DSV4_DEVICE float row_sumsq(const RowPart<kChunks>& x, const RowThread& r) {
  float s[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    s[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s[i] = sumsq_step(s[i], x[i][k]);
  }
#pragma unroll
  for (int m = kLaneGroup / 2; m > 0; m >>= 1)
#pragma unroll
    for (int i = 0; i < kChunks; ++i) s[i] += shfl_xor(s[i], m);
  if constexpr (kChunks == kRowChunks) {
    return chunk_sumsq_total(s[0], s[1], s[2], s[3]);
  } else {
    __shared__ float chunk_sums[rows_per_block_max(kChunks)][kRowChunks];
    if (r.lane == 0) chunk_sums[r.slot][r.chunk] = s[0];
    __syncthreads();
    const float* c = chunk_sums[r.slot];
    return chunk_sumsq_total(c[0], c[1], c[2], c[3]);
  }
}

// bf16 values (exact in bf16) stored into a 512-dim bf16 row.
template <int kChunks>
DSV4_DEVICE void store_bf16_part(uint16_t* row, const RowThread& r, bool vec,
                                 const RowPart<kChunks>& v) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
    store_detail::store_u64(reinterpret_cast<uint8_t*>(row + lane_dim(r.chunk + i, r.lane, 0)),
                            bf16x2_bits(v[i][0], v[i][1]), bf16x2_bits(v[i][2], v[i][3]), vec);
}

// RoPE of dims 448..511 by the thread's (cos, sin) pairs f; `round_bf16`: each rotated value
// rounded to bf16 (contract V4.1 1.5).
template <int kChunks>
DSV4_DEVICE void rope_tail(RowPart<kChunks>& v, const float (&f)[4], const RowThread& r,
                           bool round_bf16) {
  if (!rope_thread<kChunks>(r)) return;
  float* t = v[kChunks - 1];
  rope_pair(t[0], t[1], f[0], f[1]);
  rope_pair(t[2], t[3], f[2], f[3]);
  if (round_bf16) {
#pragma unroll
    for (int k = 0; k < 4; ++k) t[k] = round_to_bf16(t[k]);
  }
}

// am[i]: max |v| over the tile of kLanes lanes (4 kLanes dims) that holds v[i]'s values, the
// reductions of a thread's chunks interleaved.
template <int kLanes, int kChunks>
DSV4_DEVICE void tile_amaxes(const float (&v)[kChunks][4], float (&am)[kChunks]) {
  using namespace store_detail;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) am[i] = abs_max4(v[i]);
  subgroup_max<kLanes>(am);
}

// The fp4 fake quant of the fp8-style layouts (contract V4.1 1.6): 16-dim blocks = 4 lanes.
template <int kChunks>
DSV4_DEVICE void fake_quant(RowPart<kChunks>& v) {
  float am[kChunks];
  tile_amaxes<kFakeQuantBlock / 4>(v, am);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const TileDivisor s = tile_divisor(fake_quant_scale(am[i]));
#pragma unroll
    for (int k = 0; k < 4; ++k) v[i][k] = fake_quant_value(v[i][k], s);
  }
}

// Where the token of global entry `loc` goes on this rank (store_slot_of: its local slot), or
// false when it writes nothing here (negative, another rank's or past the cache). `rows` is
// the layout's addressing (kv_layout.h).
struct RowDestination {
  uint8_t* data;
  uint8_t* scales;
};
DSV4_DEVICE bool row_destination(uint8_t* cache, int64_t loc, const Dcp& dcp,
                                 const LayoutRowAddressing& rows, int log2_page_size,
                                 int64_t num_pages, int64_t page_bytes, RowDestination* d) {
  const CacheSlot s = store_slot_of(loc, dcp, log2_page_size, num_pages);
  uint8_t* base = cache + s.page * page_bytes;
  // off < page_size <= 2^30 and the strides < 2^10: 32 x 32-bit products.
  const uint32_t off = uint32_t(s.off);
  d->data = base + uint64_t(off) * uint32_t(rows.data_stride);
  d->scales = base + rows.scale_base + uint64_t(off) * uint32_t(rows.scale_stride);
  return s.page >= 0;
}

// Encodes a lane's values q of kChunks chunks (q[i] of chunk first_chunk + i) and stores them
// in the slot d with the row encoding kEncoding (layout_encoding of the layout; contract V4.1
// 1.7, 3.2 - 3.4); the chunks' reductions interleaved, then the stores. A tile's scale byte is
// written by its first lane. V4: dims 0..447 e4m3 with one ds_mla_exponent per 64, 448..511
// bf16 of q, scale byte 7 untouched. Every lane of the group calls (shuffles); `writes` false
// stores nothing (a caller that encodes its row whether or not it is stored).
template <int kEncoding, int kChunks>
DSV4_DEVICE void encode_store_chunks(const float (&q)[kChunks][4], int first_chunk, int lane,
                                     const RowDestination& d, bool vec_out, bool writes = true) {
  using namespace store_detail;
  if constexpr (kEncoding == kLayoutV4) {
    // One UE8M0 per 64 dims = 16 lanes: byte 2j + lane / 16 of chunk j (7 bytes).
    constexpr int kLanes = kDsMlaGroup / 4;
    float am[kChunks];
    tile_amaxes<kLanes>(q, am);
    const auto group = [&](int i) { return 2 * (first_chunk + i) + lane / kLanes; };
    const auto is_rope = [&](int i) { return group(i) >= kDsMlaNopeDim / kDsMlaGroup; };
    if constexpr (kChunks == 1) {
      // One chunk a thread (the decode-sized launches): the rope lanes store their bf16 values
      // and skip the exponent and the codes, a shorter path for the launch's latency
      // (docs/design/low_ratio.md, "Few-row launches").
      const int dim = lane_dim(first_chunk, lane, 0);
      if (is_rope(0)) {
        if (writes)
          store_u64(d.data + 2 * dim - kDsMlaNopeDim, bf16x2_bits(q[0][0], q[0][1]),
                    bf16x2_bits(q[0][2], q[0][3]), vec_out);
        return;
      }
      const uint8_t e = ds_mla_exponent(am[0]);
      const uint32_t codes = e4m3x4_mul(q[0], ue8m0_inv_scale(e));
      if (!writes) return;
      store_u32(d.data + dim, codes, vec_out);
      if (lane % kLanes == 0) d.scales[group(0)] = e;
    } else {
      uint32_t lo[kChunks], hi[kChunks], ex[kChunks];
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        ex[i] = ds_mla_exponent(am[i]);
        if (is_rope(i)) {
          lo[i] = bf16x2_bits(q[i][0], q[i][1]);
          hi[i] = bf16x2_bits(q[i][2], q[i][3]);
        } else {
          lo[i] = e4m3x4_mul(q[i], ue8m0_inv_scale(uint8_t(ex[i])));
          hi[i] = 0u;
        }
      }
      if (!writes) return;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int dim = lane_dim(first_chunk + i, lane, 0);
        if (is_rope(i))  // rope dims as bf16 at byte 448 + 2 * (dim - 448)
          store_u64(d.data + 2 * dim - kDsMlaNopeDim, lo[i], hi[i], vec_out);
        else
          store_u32(d.data + dim, lo[i], vec_out);
        if (lane % kLanes == 0 && !is_rope(i)) d.scales[group(i)] = uint8_t(ex[i]);
      }
    }
  } else if constexpr (kEncoding == kLayoutV41) {
    // One UE8M0 per 32 dims = 8 lanes; 16 scale bytes, byte 4j + lane / 8 of chunk j.
    constexpr int kLanes = 32 / 4;
    float am[kChunks];
    uint32_t ex[kChunks];
    tile_amaxes<kLanes>(q, am);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int j = first_chunk + i;
      ex[i] = v41_exponent(am[i]);
      if (!writes) continue;
      store_u32(d.data + lane_dim(j, lane, 0), e4m3x4_mul(q[i], ue8m0_inv_scale(uint8_t(ex[i]))),
                vec_out);
      if (lane % kLanes == 0) d.scales[(128 / 32) * j + lane / kLanes] = uint8_t(ex[i]);
    }
  } else if constexpr (kEncoding == kLayoutV41Fp4) {
    // One e4m3 scale per 16 dims = 4 lanes; nibble pairs (dim 2k low nibble of byte k): a lane's
    // 4 dims of chunk j are bytes 64j + 2 * lane, +1; 32 scale bytes, byte 8j + lane / 4.
    constexpr int kLanes = 16 / 4;
    float am[kChunks];
    tile_amaxes<kLanes>(q, am);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int j = first_chunk + i;
      const uint8_t sb = v41_fp4_scale_byte(am[i]);
      const TileDivisor s = tile_divisor(e4m3_value(sb));
      const uint32_t c0 =
          uint32_t(v41_fp4_code(q[i][0], s)) | (uint32_t(v41_fp4_code(q[i][1], s)) << 4);
      const uint32_t c1 =
          uint32_t(v41_fp4_code(q[i][2], s)) | (uint32_t(v41_fp4_code(q[i][3], s)) << 4);
      if (!writes) continue;
      store_u16(d.data + lane_dim(j, lane, 0) / 2, c0 | (c1 << 8), vec_out);
      if (lane % kLanes == 0) d.scales[(128 / 16) * j + lane / kLanes] = sb;
    }
  } else {
    static_assert(kEncoding == kLayoutUniformFp8, "unknown row encoding");
    if (!writes) return;
#pragma unroll
    for (int i = 0; i < kChunks; ++i)
      store_u32(d.data + lane_dim(first_chunk + i, lane, 0),
                e4m3x2(q[i][0], q[i][1]) | (e4m3x2(q[i][2], q[i][3]) << 16), vec_out);
  }
}

// The cache row of a latent (contract V4.1 1.5 - 1.7): float(latent), the tail rotated by f and
// rounded to bf16, the fake quant for the fp8-style encodings, then the encoding.
template <int kEncoding, int kChunks>
DSV4_DEVICE void store_latent_part(RowPart<kChunks>& v, const float (&f)[4], const RowThread& r,
                                   const RowDestination& d, bool vec_out) {
  rope_tail(v, f, r, true);
  if constexpr (layout_fake_quantises(kEncoding)) fake_quant(v);
  encode_store_chunks<kEncoding, kChunks>(v, r.chunk, r.lane, d, vec_out);
}

// A thread's part of a ratio-2 input / state row (kv | score, 1024 fp32): kv[i][k] is
// row[lane_dim(chunk + i, lane, k)], score[i][k] is row[512 + lane_dim(chunk + i, lane, k)].
template <int kChunks>
struct PairPart {
  RowPart<kChunks> kv;
  RowPart<kChunks> score;
};
template <int kChunks>
DSV4_DEVICE void load_pair_part(const float* row, const RowThread& r, bool vec,
                                PairPart<kChunks>& p) {
  load_f32_part(row, r, vec, p.kv);
  load_f32_part(row + kLowRatioHeadDim, r, vec, p.score);
}
// out = first ? a : b, value by value (selects: no address taken).
template <int kChunks>
DSV4_DEVICE void select_pair_part(bool first, const PairPart<kChunks>& a,
                                  const PairPart<kChunks>& b, PairPart<kChunks>& out) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out.kv[i][k] = first ? a.kv[i][k] : b.kv[i][k];
      out.score[i][k] = first ? a.score[i][k] : b.score[i][k];
    }
}
// Bitwise copy of a pair row's values (as loaded) into a state row.
template <int kChunks>
DSV4_DEVICE void store_pair_part(float* row, const RowThread& r, bool vec,
                                 const PairPart<kChunks>& p) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    float* kv = row + lane_dim(r.chunk + i, r.lane, 0);
    float* sc = kv + kLowRatioHeadDim;
    if (vec) {
      *reinterpret_cast<uint4*>(kv) = make_uint4(f32_bits(p.kv[i][0]), f32_bits(p.kv[i][1]),
                                                 f32_bits(p.kv[i][2]), f32_bits(p.kv[i][3]));
      *reinterpret_cast<uint4*>(sc) =
          make_uint4(f32_bits(p.score[i][0]), f32_bits(p.score[i][1]), f32_bits(p.score[i][2]),
                     f32_bits(p.score[i][3]));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        kv[k] = p.kv[i][k];
        sc[k] = p.score[i][k];
      }
    }
  }
}

// The ratio-2 inputs and pair-state ring of the c2 kernels (decode / verify and prefill).
struct PairInputs {
  const float* kv_score;    // [n_rows, 1024] kv | score
  float* state;             // [state_rows, 1024]
  const void* positions;    // [n_rows] int32 (pos64 false) or int64
  const void* req;          // [n_rows] int32 (req64 false) or int64
  const void* raw_out_loc;  // [n_rows] int32 (loc64 false) or int64
  int64_t n_rows;
  int64_t state_rows;
  int64_t ring;
  bool pos64;
  bool req64;
  bool loc64;
  bool vec_in;     // kv_score 16-byte aligned
  bool vec_state;  // state 16-byte aligned

  DSV4_DEVICE int64_t pos(int64_t t) const { return load_index(positions, pos64, t); }
  DSV4_DEVICE int64_t rid(int64_t t) const { return load_index(req, req64, t); }
  DSV4_DEVICE int64_t raw(int64_t t) const { return load_index(raw_out_loc, loc64, t); }
  DSV4_DEVICE const float* row(int64_t t) const { return kv_score + t * kPairRowWidth; }
  // The state row of slot(rid, p) = rid * ring + (p mod ring), or null when it lies outside
  // the state (rid < 0 or past its rows). The ring is a power of two (checked): p mod ring is
  // p & (ring - 1), negative p included.
  DSV4_DEVICE float* ring_row(int64_t r, int64_t p) const {
    if (r < 0) return nullptr;
    const int64_t slot = r * ring + (p & (ring - 1));
    return slot < state_rows ? state + slot * kPairRowWidth : nullptr;
  }
  // An input row's values, bitwise, to state[slot(r, p)] (nothing outside the state).
  template <int kChunks>
  DSV4_DEVICE void park(int64_t r, int64_t p, const RowThread& th,
                        const PairPart<kChunks>& values) const {
    float* dst = ring_row(r, p);
    if (dst != nullptr) store_pair_part(dst, th, vec_state, values);
  }
};

// What the c1 / c2 kernels write for a latent row, and where.
struct LatentOutputs {
  const void* norm_weight;  // [512] bf16 bits (w_bf16) or fp32
  const float* freqs;       // [max_pos, 64] (cos, sin) pairs
  uint8_t* cache;           // num_pages pages of page_bytes, in `layout`
  uint16_t* latent;         // [n_rows, 512] bf16 bits
  int64_t max_pos;
  int64_t num_pages;
  int64_t page_bytes;
  LayoutRowAddressing rows;  // the layout's token addressing in a page
  Dcp dcp;                   // the cache entries this rank stores (contract 9)
  int log2_page_size;
  float eps;
  bool w_bf16;
  bool vec_w;       // norm_weight 16-byte aligned
  bool vec_freqs;   // freqs 16-byte aligned
  bool vec_out;     // cache and page_bytes 8-byte aligned
  bool vec_latent;  // latent 8-byte aligned
};

// A thread's inputs of a latent row: x (the RMSNorm input), the weights w, the RoPE pairs f
// and whether the RoPE position lies inside freqs (`rope_ok`; else no cache row). Zeros for a
// row that publishes nothing (it still takes part in row_sumsq's barrier).
template <int kChunks>
struct LatentInputs {
  RowPart<kChunks> x = {};
  RowPart<kChunks> w;
  float f[4];
  bool rope_ok = false;
};

// The weights and the (cos, sin) pairs of RoPE position p, loaded with the row's other inputs
// (the pairs only when p is inside freqs).
template <int kChunks>
DSV4_DEVICE void load_latent_params(const LatentOutputs& o, int64_t p, const RowThread& r,
                                    LatentInputs<kChunks>& in) {
  load_weight(o.norm_weight, o.w_bf16, r, o.vec_w, in.w);
  in.rope_ok = p >= 0 && p < o.max_pos;
  load_rope_pairs(o.freqs + (in.rope_ok ? p : 0) * kRopeDim, r.lane,
                  in.rope_ok && rope_thread<kChunks>(r), o.vec_freqs, in.f);
}

// Row r.row's latent (contract V4.1 1.4: bf16(x * inv * w)) when `publishes`, then its cache row
// at global entry `loc` where loc > 0, this rank owns it, its page lies in the cache and the RoPE
// position inside freqs (contract V4.1 2.3, 2.4). Every thread of the block calls it
// (row_sumsq); `publishes` is uniform over a row.
template <int kEncoding, int kChunks>
DSV4_DEVICE void publish_latent(const LatentOutputs& o, const RowThread& r, bool publishes,
                                const LatentInputs<kChunks>& in, int64_t loc) {
  const float inv = rms_inv(row_sumsq(in.x, r), kLowRatioHeadDim, o.eps);
  if (!publishes) return;
  RowPart<kChunks> lat;
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      lat[i][k] = round_to_bf16(norm_value(in.x[i][k], inv, in.w[i][k]));
  store_bf16_part(o.latent + r.row * kLowRatioHeadDim, r, o.vec_latent, lat);
  if (loc <= 0 || !in.rope_ok) return;
  RowDestination d;
  if (!row_destination(o.cache, loc, o.dcp, o.rows, o.log2_page_size, o.num_pages,
                       o.page_bytes, &d))
    return;
  store_latent_part<kEncoding>(lat, in.f, r, d, o.vec_out);
}

// The inputs of the odd row of a ratio-2 pair (its own values `own`, its partner's `partner`,
// RoPE at pos - 1; contract V4.1 1.2, 1.4): x = bf16(pair_pool(partner, own)).
template <int kChunks>
DSV4_DEVICE void pooled_inputs(const LatentOutputs& o, const RowThread& r,
                               const PairPart<kChunks>& own, const PairPart<kChunks>& partner,
                               int64_t pos, LatentInputs<kChunks>& in) {
  load_latent_params(o, pos - 1, r, in);
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      in.x[i][k] = round_to_bf16(
          pair_pool(partner.kv[i][k], partner.score[i][k], own.kv[i][k], own.score[i][k]));
}
// The same with the partner loaded from its row `partner_row`.
template <int kChunks>
DSV4_DEVICE void load_pooled_inputs(const LatentOutputs& o, const RowThread& r,
                                    const PairPart<kChunks>& own, const float* partner_row,
                                    bool vec_partner, int64_t pos, LatentInputs<kChunks>& in) {
  PairPart<kChunks> partner;
  load_pair_part(partner_row, r, vec_partner, partner);
  pooled_inputs(o, r, own, partner, pos, in);
}

}  // namespace low_ratio
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
