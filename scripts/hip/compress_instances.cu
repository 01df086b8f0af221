// HIP compile check: every compress_forward kernel instantiation the extension launches.
#include "../include/dsv4/compress_kernels.cuh"

namespace dsv4 {
namespace compress {
#define DSV4_COMPRESS_INSTANCES(TS, TI)                                           \
  template __global__ void c4_kernel<TS, TI, false>(const Params);               \
  template __global__ void c4_kernel<TS, TI, true>(const Params);                \
  template __global__ void c128_kernel<TS, TI, kModePrefill>(const Params);      \
  template __global__ void c128_kernel<TS, TI, kModeDecode>(const Params);       \
  template __global__ void c128_kernel<TS, TI, kModeOnline>(const Params);       \
  template __global__ void online_decode_kernel<TS, TI>(const Params);           \
  template __global__ void write_rows_kernel<TS, TI>(const Params);
DSV4_COMPRESS_INSTANCES(float, float)
DSV4_COMPRESS_INSTANCES(float, uint16_t)
DSV4_COMPRESS_INSTANCES(uint16_t, float)
DSV4_COMPRESS_INSTANCES(uint16_t, uint16_t)
}  // namespace compress
}  // namespace dsv4
