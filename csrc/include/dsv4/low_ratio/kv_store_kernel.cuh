// kv_store GPU kernel (docs/contract.md, "V4.1" 4.2; the reference's fused_store_cache of type
// flashmla), shared by CUDA and HIP: plain stores of 512-dim rows into a cache layout. Four
// 32-lane groups or one per row (kChunks 1 or 4, row_encode.cuh's mappings; no reduction
// crosses the groups), several rows per block; rows with loc < 0 or a page past the cache write
// nothing. v = float(x); with freqs_rows (V41 family) dims 448..511 are rotated by the row's
// (cos, sin) pairs and rounded to x's dtype; no fake quant; then the layout's encoding.
//
// Instantiation: kv_store_kernel<Encoding, XT, Chunks, CommonForm> with Encoding a
// layout_encoding, XT float or uint16_t (bf16 bits), Chunks 1 or 4 (the chunks a thread holds)
// and CommonForm true only with Chunks 1 (the arguments of kv_store_common_form as constants).
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct KvStoreKernelArgs {
  const void* x;           // [n_rows, 512] XT elements
  const void* loc;         // [n_rows] int32 (loc64 false) or int64
  const float* freqs_rows; // [n_rows, 64] (cos, sin) pairs, or null: no RoPE
  uint8_t* cache;          // num_pages pages of page_bytes, in `layout`
  int64_t n_rows;
  int64_t num_pages;
  int64_t page_bytes;
  LayoutRowAddressing rows;  // the layout's token addressing in a page
  Dcp dcp;                   // the cache entries this rank stores (contract 9)
  int log2_page_size;
  bool loc64;
  bool vec_in;   // x and freqs_rows 16-byte aligned
  bool vec_out;  // cache and page_bytes 8-byte aligned
};

// The arguments of a serving engine's decode step (int64 loc, aligned tensors, one DCP rank):
// the few-row launches run an instance with these as constants, a shorter machine code for a
// latency-bound launch (docs/design/low_ratio.md, "Few-row launches").
// kv_store_common_form(a): a is in that form.
DSV4_HD void set_kv_store_common_form(KvStoreKernelArgs& a) {
  a.loc64 = true;
  a.vec_in = true;
  a.vec_out = true;
  a.dcp = Dcp{};
}
DSV4_HD bool kv_store_common_form(const KvStoreKernelArgs& a) {
  return a.loc64 && a.vec_in && a.vec_out && dcp_is_identity(a.dcp);
}

namespace low_ratio {
// The thread's values of row r.row of x and, with freqs_rows, its RoPE pairs.
template <bool kBf16, int kChunks>
DSV4_DEVICE void load_kv_store_row(const KvStoreKernelArgs& a, const RowThread& r,
                                   RowPart<kChunks>& v, float (&f)[4]) {
  if constexpr (kBf16)
    load_bf16_part(static_cast<const uint16_t*>(a.x) + r.row * kLowRatioHeadDim, r, a.vec_in, v);
  else
    load_f32_part(static_cast<const float*>(a.x) + r.row * kLowRatioHeadDim, r, a.vec_in, v);
  if (a.freqs_rows != nullptr)
    load_rope_pairs(a.freqs_rows + r.row * kRopeDim, r.lane, rope_thread<kChunks>(r), a.vec_in,
                    f);
}
}  // namespace low_ratio

// Blocks of 256 threads an SM holds at once (CUDA): 6, at most 40 registers a thread (unbound,
// ptxas gives the one-group V41_FP4 instances up to 53, 4 blocks). HIP reads the second
// __launch_bounds__ argument as waves per execution unit: no bound.
constexpr int kv_store_min_blocks() {
#if defined(DSV4_HIP)
  return 1;
#else
  return 6;
#endif
}

template <int kEncoding, typename XT, int kChunks, bool kCommonForm>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax, kv_store_min_blocks())
    kv_store_kernel(KvStoreKernelArgs a) {
  using namespace low_ratio;
  static_assert(!kCommonForm || kChunks == 1, "the common-form instances are the few-row ones");
  constexpr bool kBf16 = sizeof(XT) == 2;
  if constexpr (kCommonForm) set_kv_store_common_form(a);
  // These layouts take no RoPE (checked): no RoPE code in their instances.
  if constexpr (kEncoding == kLayoutV4 || kEncoding == kLayoutUniformFp8) a.freqs_rows = nullptr;
  RowThread r = row_thread<kChunks>();
  pdl_wait();
  pdl_trigger();
  // The row, its RoPE pairs and its loc go out together, before any test (a thread past the
  // last row loads row 0's); the tests only gate the stores, after the reductions that need
  // the row. With exits before the encoding, ptxas sank the row's loads below the test of loc
  // (two memory round trips: docs/design/low_ratio.md).
  const bool in_rows = r.row < a.n_rows;
  if (!in_rows) r.row = 0;
  RowPart<kChunks> v;
  float f[4];
  load_kv_store_row<kBf16, kChunks>(a, r, v, f);
  const int64_t loc = load_index(a.loc, a.loc64, r.row);
  RowDestination d;
  const bool stores = row_destination(a.cache, loc, a.dcp, a.rows, a.log2_page_size,
                                      a.num_pages, a.page_bytes, &d) && in_rows;
  if (a.freqs_rows != nullptr) rope_tail(v, f, r, kBf16);
  encode_store_chunks<kEncoding, kChunks>(v, r.chunk, r.lane, d, a.vec_out, stores);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
