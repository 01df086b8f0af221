// Global-memory access of the store kernel: loads of 4 consecutive input elements as raw bits
// (converted to float only once every load of a round is out) and little-endian cache stores of
// 2, 4 and 8 bytes, vectorised when the tensors are aligned and byte by byte otherwise.
#pragma once

#include "../numerics.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace store_detail {

// Loads of 4 consecutive elements as raw bits, converted to float by bits_to_f32 only once
// every load of the round is out: nvcc places a conversion in its load's own branch (vector or
// scalar, fp32 or bf16 weights), and there the thread waits for that load before it issues the
// next one, a second round trip after the grid-dependency wait (seen in the SASS of the
// bf16-weight instances). fp32: one element per word. bf16: two per word, low half first (the
// scalar loads of an unaligned tensor are packed right away: that path is not the fast one).
DSV4_DEVICE void load_bits(const float* p, bool vec, uint32_t (&r)[4]) {
  if (vec) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    r[0] = q.x;
    r[1] = q.y;
    r[2] = q.z;
    r[3] = q.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = f32_bits(p[k]);
  }
}

DSV4_DEVICE void load_bits(const uint16_t* p, bool vec, uint32_t (&r)[4]) {
  if (vec) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    r[0] = q.x;
    r[1] = q.y;
    r[2] = r[3] = 0u;
  } else {
    r[0] = uint32_t(p[0]) | (uint32_t(p[1]) << 16);
    r[1] = uint32_t(p[2]) | (uint32_t(p[3]) << 16);
    r[2] = r[3] = 0u;
  }
}

DSV4_DEVICE void bits_to_f32(const uint32_t (&r)[4], bool bf16, float (&v)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (!bf16) v[k] = bits_f32(r[k]);
    else v[k] = bits_f32(k % 2 == 0 ? r[k / 2] << 16 : r[k / 2] & 0xffff0000u);
  }
}

DSV4_DEVICE void load4(const float* p, bool vec, float (&v)[4]) {
  uint32_t r[4];
  load_bits(p, vec, r);
  bits_to_f32(r, false, v);
}

// Little-endian stores of 2, 4 and 8 bytes; byte by byte when the cache is not aligned.
DSV4_DEVICE void store_bytes(uint8_t* p, uint32_t v, int n) {
#pragma unroll 4
  for (int i = 0; i < n; ++i) p[i] = uint8_t(v >> (8 * i));
}
DSV4_DEVICE void store_u16(uint8_t* p, uint32_t v, bool vec) {
  if (vec) *reinterpret_cast<uint16_t*>(p) = uint16_t(v);
  else store_bytes(p, v, 2);
}
DSV4_DEVICE void store_u32(uint8_t* p, uint32_t v, bool vec) {
  if (vec) *reinterpret_cast<uint32_t*>(p) = v;
  else store_bytes(p, v, 4);
}
DSV4_DEVICE void store_u64(uint8_t* p, uint32_t lo, uint32_t hi, bool vec) {
  if (vec) {
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  } else {
    store_bytes(p, lo, 4);
    store_bytes(p + 4, hi, 4);
  }
}

}  // namespace store_detail
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
