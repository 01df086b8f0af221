// HIP compile check: every compress_forward kernel instantiation the extension launches (the
// kernel sets of csrc/compress/instantiations/, include/dsv4/compress/kernel_set.cuh).
#include "../include/dsv4/compress/kernel_set_def.cuh"

namespace dsv4 {
namespace compress {
#define DSV4_POOL_INSTANCES(TS, TI, HD)                                                 \
  template __global__ void c4_kernel<TS, TI, false, HD>(const Params);                 \
  template __global__ void c4_kernel<TS, TI, true, HD>(const Params);                  \
  template __global__ void c128_prefill_kernel<TS, TI, kModePrefill, HD>(const Params); \
  template __global__ void c128_prefill_kernel<TS, TI, kModeOnline, HD>(const Params);  \
  template __global__ void c128_decode_kernel<TS, TI, HD>(const Params);               \
  template __global__ void write_rows_kernel<TS, TI, 2 * HD>(const Params);            \
  template __global__ void write_rows_kernel<TS, TI, 4 * HD>(const Params);
#define DSV4_COMPRESS_INSTANCES(TS, TI)                                                 \
  DSV4_POOL_INSTANCES(TS, TI, 128)                                                      \
  DSV4_POOL_INSTANCES(TS, TI, 512)                                                      \
  template __global__ void online_decode_kernel<TS, TI>(const Params);
DSV4_COMPRESS_INSTANCES(float, float)
DSV4_COMPRESS_INSTANCES(float, uint16_t)
DSV4_COMPRESS_INSTANCES(uint16_t, float)
DSV4_COMPRESS_INSTANCES(uint16_t, uint16_t)
}  // namespace compress
}  // namespace dsv4
