// c1_norm_rope_store GPU kernel (docs/contract.md, "V4.1" 2.3), shared by CUDA and HIP: the
// ratio-1 compressor. One 32-lane group per row, several rows per block; every row writes its
// latent, rows with out_loc > 0 their cache slot.
//
// Instantiation: c1_norm_rope_store_kernel<Encoding> with Encoding a layout_encoding
// (kLayoutV4, kLayoutV41, kLayoutV41Fp4, kLayoutUniformFp8; the interleaved layouts share the
// encoding of their block-split twin and differ only in LatentOutputs::layout).
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct C1KernelArgs {
  low_ratio::LatentOutputs out;
  const uint16_t* kv;     // [n_rows, 512] bf16 bits
  const void* positions;  // [n_rows] int32 (pos64 false) or int64
  const void* out_loc;    // [n_rows] int32 (loc64 false) or int64
  int64_t n_rows;
  bool pos64;
  bool loc64;
  bool vec_kv;  // kv 8-byte aligned
};

template <int kEncoding>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c1_norm_rope_store_kernel(C1KernelArgs a) {
  using namespace low_ratio;
  int lane;
  const int64_t t = group_row(&lane);
  pdl_wait();
  pdl_trigger();
  if (t >= a.n_rows) return;
  const int64_t pos = load_index(a.positions, a.pos64, t);
  const int64_t loc = load_index(a.out_loc, a.loc64, t);
  RowValues x, w, lat;
  float f[4];
  load_bf16_row(a.kv + t * kLowRatioHeadDim, lane, a.vec_kv, x);
  load_weight(a.out.norm_weight, a.out.w_bf16, lane, a.out.vec_w, w);
  const bool rope_ok = load_rope_at(a.out, pos, lane, f);
  latent_row(x, w, a.out.eps, lat);
  publish_latent<kEncoding>(a.out, t, lane, lat, loc, rope_ok, f);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
