// Device functions of the V4.1 GPU kernels (docs/contract.md, "V4.1"): a 512-dim row in
// store_math.h's lane layout (lane l of a 32-lane group holds dims lane_dim(j, l, k), j, k < 4),
// its RMSNorm latent, the RoPE of its last 64 dims, the fp4 fake quant and the encoding + store
// into a cache slot of a V4.1 layout. Shared by the c1 / c2 / kv_store kernels and by the V4.1
// layouts of compress_norm_rope_store (store/store_kernel.cuh); the per-value functions are
// low_ratio_math.h's, so the bytes equal the CPU kernels'.
#pragma once

#include "../low_ratio_math.h"
#include "../store/memory_access.cuh"
#include "../store/quantize.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace low_ratio {

constexpr int kRowChunks = kLowRatioHeadDim / 128;  // 4-value chunks per lane
constexpr int kRowsPerBlockMax = 8;                 // lane groups per block (256 threads)
constexpr int kBlockThreadsMax = kRowsPerBlockMax * kLaneGroup;

// A lane's 16 values of a 512-dim row: v[j][k] is dim lane_dim(j, lane, k).
using RowValues = float[kRowChunks][4];

// Dims 448..511 (the RoPE tail) live in chunk 3, lanes 16..31; lane l's pairs (k = 0, 1) and
// (2, 3) are tail pairs 2(l - 16) and 2(l - 16) + 1, i.e. floats 4(l - 16) .. +3 of a freqs row.
DSV4_DEVICE bool rope_lane(int lane) { return lane >= kLaneGroup / 2; }
DSV4_DEVICE int rope_offset(int lane) { return 4 * (lane - kLaneGroup / 2); }

// The calling thread's lane and the row of its lane group (blockDim.x / 32 rows a block).
DSV4_DEVICE int64_t group_row(int* lane) {
  *lane = int(threadIdx.x) % kLaneGroup;
  return int64_t(blockIdx.x) * (blockDim.x / kLaneGroup) + threadIdx.x / kLaneGroup;
}

// An index tensor's element i (int32 or int64).
DSV4_DEVICE int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}

// A bf16 row's (or weight's) values in the lane layout.
DSV4_DEVICE void load_bf16_row(const uint16_t* row, int lane, bool vec, RowValues& v) {
  using namespace store_detail;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    uint32_t r[4];
    load_bits(row + lane_dim(j, lane, 0), vec, r);
    bits_to_f32(r, true, v[j]);
  }
}
DSV4_DEVICE void load_f32_row(const float* row, int lane, bool vec, RowValues& v) {
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) store_detail::load4(row + lane_dim(j, lane, 0), vec, v[j]);
}
// The norm weight, bf16 bits (w_bf16) or fp32.
DSV4_DEVICE void load_weight(const void* w, bool w_bf16, int lane, bool vec, RowValues& v) {
  if (w_bf16) load_bf16_row(static_cast<const uint16_t*>(w), lane, vec, v);
  else load_f32_row(static_cast<const float*>(w), lane, vec, v);
}

// The (cos, sin) pairs of a rope lane from a 64-float freqs row; identity elsewhere.
DSV4_DEVICE void load_rope_pairs(const float* freqs_row, int lane, bool vec, float (&f)[4]) {
  f[0] = 1.0f;
  f[1] = 0.0f;
  f[2] = 1.0f;
  f[3] = 0.0f;
  if (rope_lane(lane)) store_detail::load4(freqs_row + rope_offset(lane), vec, f);
}

// The published latent (contract V4.1 1.4): the sum of squares in (j, k) order per lane, the
// group's xor-butterfly sum, then bf16(x * inv * w), returned as the bf16 value.
DSV4_DEVICE void latent_row(const RowValues& x, const RowValues& w, float eps, RowValues& lat) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc = sumsq_step(acc, x[j][k]);
  const float inv = rms_inv(group_sum(acc), kLowRatioHeadDim, eps);
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) lat[j][k] = round_to_bf16(norm_value(x[j][k], inv, w[j][k]));
}

// bf16 values (exact in bf16) stored as one 512-dim bf16 row.
DSV4_DEVICE void store_bf16_row(uint16_t* row, int lane, bool vec, const RowValues& v) {
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j)
    store_detail::store_u64(reinterpret_cast<uint8_t*>(row + lane_dim(j, lane, 0)),
                            bf16x2_bits(v[j][0], v[j][1]), bf16x2_bits(v[j][2], v[j][3]), vec);
}

// RoPE of dims 448..511 by the lane's (cos, sin) pairs f; `round_bf16`: each rotated value
// rounded to bf16 (contract V4.1 1.5).
DSV4_DEVICE void rope_tail(RowValues& v, const float (&f)[4], int lane, bool round_bf16) {
  if (!rope_lane(lane)) return;
  float* t = v[kRowChunks - 1];
  rope_pair(t[0], t[1], f[0], f[1]);
  rope_pair(t[2], t[3], f[2], f[3]);
  if (round_bf16) {
#pragma unroll
    for (int k = 0; k < 4; ++k) t[k] = round_to_bf16(t[k]);
  }
}

// am[j]: max |v| over the tile of kLanes lanes (4 kLanes dims) that holds chunk j's values,
// the four chunks' reductions interleaved.
template <int kLanes>
DSV4_DEVICE void tile_amaxes(const RowValues& v, float (&am)[kRowChunks]) {
  using namespace store_detail;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) am[j] = abs_max4(v[j]);
  subgroup_max<kLanes>(am);
}

// The fp4 fake quant of the fp8-style layouts (contract V4.1 1.6): 16-dim blocks = 4 lanes.
DSV4_DEVICE void fake_quant_row(RowValues& v) {
  float am[kRowChunks];
  tile_amaxes<kFakeQuantBlock / 4>(v, am);
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    const TileDivisor s = tile_divisor(fake_quant_scale(am[j]));
#pragma unroll
    for (int k = 0; k < 4; ++k) v[j][k] = fake_quant_value(v[j][k], s);
  }
}

// Where a token's data and scales go, or false when `loc` writes nothing (negative or past the
// cache). `layout` decides the interleaving (kv_layout.h offsets).
struct RowDestination {
  uint8_t* data;
  uint8_t* scales;
};
DSV4_DEVICE bool row_destination(uint8_t* cache, int64_t loc, int layout, int log2_page_size,
                                 int64_t page_size, int64_t num_pages, int64_t page_bytes,
                                 RowDestination* d) {
  const int64_t page = store_page_of(loc, log2_page_size, num_pages);
  if (page < 0) return false;
  const int64_t off = loc & (page_size - 1);
  uint8_t* base = cache + page * page_bytes;
  d->data = base + layout_data_offset(layout, off);
  d->scales = base + layout_scale_offset(layout, page_size, off);
  return true;
}

// Scale byte b of a row whose scale for (chunk j, lane) is e[j], for the lane-group-wide
// arrangement of `kLanesPerScale` lanes per scale: byte b = (128 / tile) * j + lane / lanes,
// gathered so that lane b holds it (b < 512 / tile).
template <int kLanesPerScale>
DSV4_DEVICE uint32_t gather_scale_byte(const uint32_t (&e)[kRowChunks], int lane) {
  constexpr int kPerChunk = kLaneGroup / kLanesPerScale;  // scales per chunk
  const int src = kLanesPerScale * (lane % kPerChunk);
  uint32_t out = 0u;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    const uint32_t g = shfl_idx(e[j], src);
    if (lane / kPerChunk == j) out = g;
  }
  return out;
}

// Encodes a lane's values q and stores them in the slot d with the row encoding kEncoding
// (layout_encoding of the layout; contract V4.1 1.7, 3.2 - 3.4). V4: dims 0..447 e4m3 with one
// ds_mla_exponent per 64, 448..511 bf16 of q, scale byte 7 untouched. Every lane of the group
// calls (shuffles).
template <int kEncoding>
DSV4_DEVICE void encode_store_row(const RowValues& q, int lane, const RowDestination& d,
                                  bool vec_out) {
  using namespace store_detail;
  if constexpr (kEncoding == kLayoutV4) {
    float am[kRowChunks];
    uint32_t lo[kRowChunks], hi[kRowChunks], ex[kRowChunks];
    tile_amaxes<kDsMlaGroup / 4>(q, am);
    const auto is_rope = [&](int j) { return 2 * j + lane / 16 >= kDsMlaNopeDim / kDsMlaGroup; };
#pragma unroll
    for (int j = 0; j < kRowChunks; ++j) {
      ex[j] = ds_mla_exponent(am[j]);
      if (is_rope(j)) {
        lo[j] = bf16x2_bits(q[j][0], q[j][1]);
        hi[j] = bf16x2_bits(q[j][2], q[j][3]);
      } else {
        lo[j] = e4m3x4_mul(q[j], ue8m0_inv_scale(uint8_t(ex[j])));
        hi[j] = 0u;
      }
    }
    const uint32_t e1 = shfl_xor(ex[0], 16), e3 = shfl_xor(ex[1], 16), e5 = shfl_xor(ex[2], 16);
#pragma unroll
    for (int j = 0; j < kRowChunks; ++j) {
      if (is_rope(j))  // rope dims as bf16 at byte 448 + 2 * (dim - 448)
        store_u64(d.data + 2 * lane_dim(j, lane, 0) - kDsMlaNopeDim, lo[j], hi[j], vec_out);
      else
        store_u32(d.data + lane_dim(j, lane, 0), lo[j], vec_out);
    }
    if (lane == 0) {
      store_u32(d.scales, ex[0] | (e1 << 8) | (ex[1] << 16) | (e3 << 24), vec_out);
      store_u16(d.scales + 4, ex[2] | (e5 << 8), vec_out);
      d.scales[6] = uint8_t(ex[3]);
    }
  } else if constexpr (kEncoding == kLayoutV41) {
    // One UE8M0 per 32 dims = 8 lanes; 16 scale bytes, byte 4j + lane / 8.
    constexpr int kLanes = 32 / 4;
    float am[kRowChunks];
    uint32_t ex[kRowChunks];
    tile_amaxes<kLanes>(q, am);
#pragma unroll
    for (int j = 0; j < kRowChunks; ++j) {
      ex[j] = v41_exponent(am[j]);
      store_u32(d.data + lane_dim(j, lane, 0), e4m3x4_mul(q[j], ue8m0_inv_scale(uint8_t(ex[j]))),
                vec_out);
    }
    const uint32_t b = gather_scale_byte<kLanes>(ex, lane);
    if (lane < kLowRatioHeadDim / 32) d.scales[lane] = uint8_t(b);
  } else if constexpr (kEncoding == kLayoutV41Fp4) {
    // One e4m3 scale per 16 dims = 4 lanes; nibble pairs (dim 2k low nibble of byte k): a lane's
    // 4 dims of chunk j are bytes 64j + 2 * lane, +1; 32 scale bytes, byte 8j + lane / 4.
    constexpr int kLanes = 16 / 4;
    float am[kRowChunks];
    uint32_t sb[kRowChunks];
    tile_amaxes<kLanes>(q, am);
#pragma unroll
    for (int j = 0; j < kRowChunks; ++j) {
      sb[j] = v41_fp4_scale_byte(am[j]);
      const TileDivisor s = tile_divisor(e4m3_value(uint8_t(sb[j])));
      const uint32_t c0 =
          uint32_t(v41_fp4_code(q[j][0], s)) | (uint32_t(v41_fp4_code(q[j][1], s)) << 4);
      const uint32_t c1 =
          uint32_t(v41_fp4_code(q[j][2], s)) | (uint32_t(v41_fp4_code(q[j][3], s)) << 4);
      store_u16(d.data + lane_dim(j, lane, 0) / 2, c0 | (c1 << 8), vec_out);
    }
    d.scales[lane] = uint8_t(gather_scale_byte<kLanes>(sb, lane));  // 32 bytes, one a lane
  } else {
    static_assert(kEncoding == kLayoutUniformFp8, "unknown row encoding");
#pragma unroll
    for (int j = 0; j < kRowChunks; ++j)
      store_u32(d.data + lane_dim(j, lane, 0),
                e4m3x2(q[j][0], q[j][1]) | (e4m3x2(q[j][2], q[j][3]) << 16), vec_out);
  }
}

// The cache row of a latent (contract V4.1 1.5 - 1.7): float(latent), the tail rotated by f and
// rounded to bf16, the fake quant for the fp8-style encodings, then the encoding.
template <int kEncoding>
DSV4_DEVICE void store_latent_row(RowValues& v, const float (&f)[4], int lane,
                                  const RowDestination& d, bool vec_out) {
  rope_tail(v, f, lane, true);
  if constexpr (layout_fake_quantises(kEncoding)) fake_quant_row(v);
  encode_store_row<kEncoding>(v, lane, d, vec_out);
}

// A ratio-2 input / state row (kv | score, 1024 fp32) in the lane layout: kv[j][k] is
// row[lane_dim(j, lane, k)], score[j][k] is row[512 + lane_dim(j, lane, k)].
struct PairRow {
  RowValues kv;
  RowValues score;
};
DSV4_DEVICE void load_pair_row(const float* row, int lane, bool vec, PairRow& r) {
  load_f32_row(row, lane, vec, r.kv);
  load_f32_row(row + kLowRatioHeadDim, lane, vec, r.score);
}
// Bitwise copy of a pair row (the values as loaded) into a state row.
DSV4_DEVICE void store_pair_row(float* row, int lane, bool vec, const PairRow& r) {
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    float* kv = row + lane_dim(j, lane, 0);
    float* sc = row + kLowRatioHeadDim + lane_dim(j, lane, 0);
    if (vec) {
      *reinterpret_cast<uint4*>(kv) = make_uint4(f32_bits(r.kv[j][0]), f32_bits(r.kv[j][1]),
                                                 f32_bits(r.kv[j][2]), f32_bits(r.kv[j][3]));
      *reinterpret_cast<uint4*>(sc) = make_uint4(f32_bits(r.score[j][0]), f32_bits(r.score[j][1]),
                                                 f32_bits(r.score[j][2]), f32_bits(r.score[j][3]));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        kv[k] = r.kv[j][k];
        sc[k] = r.score[j][k];
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
  DSV4_DEVICE void park(int64_t r, int64_t p, int lane, const PairRow& values) const {
    float* dst = ring_row(r, p);
    if (dst != nullptr) store_pair_row(dst, lane, vec_state, values);
  }
};

// The latent of the odd row of a ratio-2 pair (contract V4.1 1.2, 1.4): of
// x = bf16(pair_pool(partner, own)).
DSV4_DEVICE void pooled_latent(const PairRow& partner, const PairRow& own, const RowValues& w,
                               float eps, RowValues& lat) {
  RowValues x;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[j][k] = round_to_bf16(
          pair_pool(partner.kv[j][k], partner.score[j][k], own.kv[j][k], own.score[j][k]));
  latent_row(x, w, eps, lat);
}

// What the c1 / c2 kernels write for a latent row, and where.
struct LatentOutputs {
  const void* norm_weight;  // [512] bf16 bits (w_bf16) or fp32
  const float* freqs;       // [max_pos, 64] (cos, sin) pairs
  uint8_t* cache;           // num_pages pages of page_bytes, in `layout`
  uint16_t* latent;         // [n_rows, 512] bf16 bits
  int64_t max_pos;
  int64_t num_pages;
  int64_t page_bytes;
  int64_t page_size;
  int log2_page_size;
  int layout;
  float eps;
  bool w_bf16;
  bool vec_w;       // norm_weight 16-byte aligned
  bool vec_freqs;   // freqs 16-byte aligned
  bool vec_out;     // cache and page_bytes 8-byte aligned
  bool vec_latent;  // latent 8-byte aligned
};

// The (cos, sin) pairs of RoPE position p, loaded (with the row's other inputs) only when p is
// inside freqs; false: the row stores no cache row.
DSV4_DEVICE bool load_rope_at(const LatentOutputs& o, int64_t p, int lane, float (&f)[4]) {
  const bool in_table = p >= 0 && p < o.max_pos;
  if (in_table) load_rope_pairs(o.freqs + p * kRopeDim, lane, o.vec_freqs, f);
  return in_table;
}

// Row t's latent, then its cache row at `loc` with the RoPE pairs f (of load_rope_at) where
// loc > 0, the page lies in the cache and f's position is inside freqs (`rope_ok`) (contract
// V4.1 2.3, 2.4). Uniform over the lane group.
template <int kEncoding>
DSV4_DEVICE void publish_latent(const LatentOutputs& o, int64_t t, int lane, RowValues& lat,
                                int64_t loc, bool rope_ok, const float (&f)[4]) {
  store_bf16_row(o.latent + t * kLowRatioHeadDim, lane, o.vec_latent, lat);
  if (loc <= 0 || !rope_ok) return;
  RowDestination d;
  if (!row_destination(o.cache, loc, o.layout, o.log2_page_size, o.page_size, o.num_pages,
                       o.page_bytes, &d))
    return;
  store_latent_row<kEncoding>(lat, f, lane, d, o.vec_out);
}

// The odd row t of a ratio-2 pair (its own row `own`, its partner at `partner_row`): pooled,
// its latent row written, its cache row at raw_out_loc >> 1 with RoPE at pos - 1 (contract
// V4.1 1.2 - 1.7).
template <int kEncoding>
DSV4_DEVICE void close_pair(const LatentOutputs& o, int64_t t, int lane, const PairRow& own,
                            const float* partner_row, bool vec_partner, int64_t raw,
                            int64_t pos) {
  PairRow partner;
  RowValues w, lat;
  float f[4];
  load_pair_row(partner_row, lane, vec_partner, partner);
  load_weight(o.norm_weight, o.w_bf16, lane, o.vec_w, w);
  const bool rope_ok = load_rope_at(o, pos - 1, lane, f);
  pooled_latent(partner, own, w, o.eps, lat);
  publish_latent<kEncoding>(o, t, lane, lat, raw >> 1, rope_ok, f);
}

}  // namespace low_ratio
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
