// HIP compile check: every compress_norm_rope_store kernel instantiation (4 formats and the
// 5 V4.1 layouts x kv dtype; the layouts also with four lane groups a row).
#include "../include/dsv4/store/store_kernel.cuh"

namespace dsv4 {
#define DSV4_STORE_INSTANCES(FMT)                                                        \
  template __global__ void compress_norm_rope_store_kernel<FMT, float>(StoreKernelArgs);    \
  template __global__ void compress_norm_rope_store_kernel<FMT, uint16_t>(StoreKernelArgs);
DSV4_STORE_INSTANCES(kStoreFp8DsMla)
DSV4_STORE_INSTANCES(kStoreBf16)
DSV4_STORE_INSTANCES(kStoreFp8Indexer)
DSV4_STORE_INSTANCES(kStoreFp4Indexer)
#define DSV4_STORE_LAYOUT_INSTANCES(LAYOUT)                                                    \
  DSV4_STORE_INSTANCES(store_layout_format(LAYOUT))                                            \
  template __global__ void compress_norm_rope_store_kernel<store_layout_format(LAYOUT), float, \
                                                           4>(StoreKernelArgs);                \
  template __global__ void                                                                     \
      compress_norm_rope_store_kernel<store_layout_format(LAYOUT), uint16_t, 4>(StoreKernelArgs);
DSV4_STORE_LAYOUT_INSTANCES(kLayoutV41)
DSV4_STORE_LAYOUT_INSTANCES(kLayoutV41Fp4)
DSV4_STORE_LAYOUT_INSTANCES(kLayoutUniformFp8)
DSV4_STORE_LAYOUT_INSTANCES(kLayoutV41New)
DSV4_STORE_LAYOUT_INSTANCES(kLayoutV41Fp4New)
}  // namespace dsv4
