// Channel vectors of the compress_forward GPU kernels: a thread owns V = 2 or 4 consecutive
// channels of a row and moves them as one raw vector (V = 4: 16-byte fp32 / 8-byte bf16;
// V = 2: 8-byte fp32 / 4-byte bf16), unpacked to fp32 for the math and packed back (bf16: RNE)
// for a store. load_raw_if is the predicated window-row load every pooling kernel builds on:
// written so that a thread's loads of all its rows go out back to back (see window_rows.cuh).
// Torch-free (compiled by nvcc and hipcc alike).
#pragma once

#include <type_traits>

#include "../compress_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

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

// A streaming (evict-first) store on CUDA: rows that no kernel of the call reads back.
template <typename T, int V>
DSV4_DEVICE void store_vec_streaming(T* p, const float (&v)[V]) {
  using R = typename RawVec<T, V>::type;
#if defined(DSV4_HIP)
  *reinterpret_cast<R*>(p) = pack(v, p);
#else
  __stcs(reinterpret_cast<R*>(p), pack(v, p));
#endif
}

// kStream: store_vec_streaming.
template <int V, bool kStream = false>
DSV4_DEVICE void store_out_vec(void* out, int32_t type, int64_t i, const float (&v)[V]) {
  if (type == kOutF32) {
    if constexpr (kStream) store_vec_streaming(static_cast<float*>(out) + i, v);
    else store_vec(static_cast<float*>(out) + i, v);
  } else {
    if constexpr (kStream) store_vec_streaming(static_cast<uint16_t*>(out) + i, v);
    else store_vec(static_cast<uint16_t*>(out) + i, v);
  }
}

// The pooling kernels' sink of pooled channels (c4.cuh, online_decode.cuh): out elements
// i..i+3 stored to p.out.
struct OutStore {
  const Params& p;
  DSV4_DEVICE void operator()(int64_t i, const float (&v)[4]) const {
    store_out_vec(p.out, p.out_type, i, v);
  }
};

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

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
