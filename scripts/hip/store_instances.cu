// HIP compile check: every compress_norm_rope_store kernel instantiation (4 formats and the
// 5 V4.1 layouts x kv dtype).
#include "../include/dsv4/store/store_kernel.cuh"

namespace dsv4 {
#define DSV4_STORE_INSTANCES(FMT)                                                        \
  template __global__ void compress_norm_rope_store_kernel<FMT, float>(StoreKernelArgs);    \
  template __global__ void compress_norm_rope_store_kernel<FMT, uint16_t>(StoreKernelArgs);
DSV4_STORE_INSTANCES(kStoreFp8DsMla)
DSV4_STORE_INSTANCES(kStoreBf16)
DSV4_STORE_INSTANCES(kStoreFp8Indexer)
DSV4_STORE_INSTANCES(kStoreFp4Indexer)
DSV4_STORE_INSTANCES(store_layout_format(kLayoutV41))
DSV4_STORE_INSTANCES(store_layout_format(kLayoutV41Fp4))
DSV4_STORE_INSTANCES(store_layout_format(kLayoutUniformFp8))
DSV4_STORE_INSTANCES(store_layout_format(kLayoutV41New))
DSV4_STORE_INSTANCES(store_layout_format(kLayoutV41Fp4New))
}  // namespace dsv4
