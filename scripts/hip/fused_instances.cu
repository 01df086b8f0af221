// HIP compile check: every compress_and_store kernel instantiation the extension launches (the
// kernel sets of csrc/fused/instantiations/, include/dsv4/fused/kernel_set.cuh).
#include "../include/dsv4/fused/kernel_set_def.cuh"

namespace dsv4 {
namespace fused {
#define DSV4_FUSED_ROWS_INSTANCES(TS, TI, TO, F)                                            \
  template __global__ void c4_decode_store_kernel<TS, TI, TO, F>(const compress::Params,    \
                                                                 const StoreKernelArgs);    \
  template __global__ void online_decode_store_kernel<TS, TI, TO, F>(                       \
      const compress::Params, const StoreKernelArgs);                                         \
  template __global__ void c4_prefill_store_kernel<TS, TI, TO, F>(const compress::Params,   \
                                                                  const StoreKernelArgs);   \
  template __global__ void write_rows_store_kernel<TS, TI, TO, F>(                          \
      const compress::Params, const StoreKernelArgs, int);
#define DSV4_FUSED_FORMAT_INSTANCES(TS, TI, F)                                              \
  DSV4_FUSED_ROWS_INSTANCES(TS, TI, float, F)                                               \
  DSV4_FUSED_ROWS_INSTANCES(TS, TI, uint16_t, F)
#define DSV4_FUSED_INSTANCES(TS, TI)                                                        \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, kStoreFp8DsMla)                                       \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, kStoreBf16)                                           \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, kStoreFp8Indexer)                                     \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, kStoreFp4Indexer)                                     \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, store_layout_format(kLayoutV41))                      \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, store_layout_format(kLayoutV41Fp4))                   \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, store_layout_format(kLayoutUniformFp8))               \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, store_layout_format(kLayoutV41New))                   \
  DSV4_FUSED_FORMAT_INSTANCES(TS, TI, store_layout_format(kLayoutV41Fp4New))
DSV4_FUSED_INSTANCES(float, float)
DSV4_FUSED_INSTANCES(float, uint16_t)
DSV4_FUSED_INSTANCES(uint16_t, float)
DSV4_FUSED_INSTANCES(uint16_t, uint16_t)
}  // namespace fused
}  // namespace dsv4
