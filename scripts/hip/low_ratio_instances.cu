// HIP compile check: every V4.1 low-ratio kernel instantiation (c1, c2, c2 prefill: 4 row
// encodings x the two row mappings, kChunks 1 and 4, c2 also its one-chunk common-form instance;
// index-K: ratios 1, 2; kv_store: 4 encodings x input dtype x the two mappings, and the
// one-chunk common-form instance).
#include "../include/dsv4/low_ratio/c1_kernel.cuh"
#include "../include/dsv4/low_ratio/c2_kernel.cuh"
#include "../include/dsv4/low_ratio/c2_prefill_kernel.cuh"
#include "../include/dsv4/low_ratio/index_k_kernel.cuh"
#include "../include/dsv4/low_ratio/kv_store_kernel.cuh"

namespace dsv4 {
#define DSV4_LOW_RATIO_INSTANCES(ENC, CH)                                             \
  template __global__ void c1_norm_rope_store_kernel<ENC, CH>(C1KernelArgs);          \
  template __global__ void c2_norm_rope_store_kernel<ENC, CH, false>(C2KernelArgs);   \
  template __global__ void c2_prefill_pool_kernel<ENC, CH>(C2PrefillKernelArgs);      \
  template __global__ void kv_store_kernel<ENC, float, CH, false>(KvStoreKernelArgs); \
  template __global__ void kv_store_kernel<ENC, uint16_t, CH, false>(KvStoreKernelArgs);
#define DSV4_LOW_RATIO_COMMON_FORM(ENC)                                             \
  template __global__ void c2_norm_rope_store_kernel<ENC, 1, true>(C2KernelArgs);   \
  template __global__ void kv_store_kernel<ENC, float, 1, true>(KvStoreKernelArgs); \
  template __global__ void kv_store_kernel<ENC, uint16_t, 1, true>(KvStoreKernelArgs);
#define DSV4_LOW_RATIO_MAPPINGS(ENC) \
  DSV4_LOW_RATIO_INSTANCES(ENC, 1)   \
  DSV4_LOW_RATIO_INSTANCES(ENC, 4)   \
  DSV4_LOW_RATIO_COMMON_FORM(ENC)
DSV4_LOW_RATIO_MAPPINGS(kLayoutV4)
DSV4_LOW_RATIO_MAPPINGS(kLayoutV41)
DSV4_LOW_RATIO_MAPPINGS(kLayoutV41Fp4)
DSV4_LOW_RATIO_MAPPINGS(kLayoutUniformFp8)
template __global__ void c2_prefill_park_kernel<1>(C2PrefillKernelArgs);
template __global__ void c2_prefill_park_kernel<4>(C2PrefillKernelArgs);
template __global__ void low_ratio_index_k_store_kernel<1>(IndexKKernelArgs);
template __global__ void low_ratio_index_k_store_kernel<2>(IndexKKernelArgs);
}  // namespace dsv4
