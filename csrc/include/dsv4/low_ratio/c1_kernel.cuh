// c1_norm_rope_store GPU kernel (docs/contract.md, "V4.1" 2.3), shared by CUDA and HIP: the
// ratio-1 compressor. Four 32-lane groups or one per row (kChunks 1 or 4, row_encode.cuh's
// mappings), several rows per block; every row writes its latent, rows with out_loc > 0 their
// cache slot.
//
// Instantiation: c1_norm_rope_store_kernel<Encoding, Chunks> with Encoding a layout_encoding
// (kLayoutV4, kLayoutV41, kLayoutV41Fp4, kLayoutUniformFp8; the interleaved layouts share the
// encoding of their block-split twin and differ only in LatentOutputs::rows) and Chunks 1 or
// 4 (the chunks a thread holds).
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

template <int kEncoding, int kChunks>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c1_norm_rope_store_kernel(C1KernelArgs a) {
  using namespace low_ratio;
  const RowThread r = row_thread<kChunks>();
  pdl_wait();
  pdl_trigger();
  const bool live = r.row < a.n_rows;
  LatentInputs<kChunks> in;
  int64_t loc = 0;
  if (live) {
    const int64_t pos = load_index(a.positions, a.pos64, r.row);
    loc = load_index(a.out_loc, a.loc64, r.row);
    load_bf16_part(a.kv + r.row * kLowRatioHeadDim, r, a.vec_kv, in.x);
    load_latent_params(a.out, pos, r, in);
  }
  publish_latent<kEncoding>(a.out, r, live, in, loc);  // every thread (a block barrier)
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
