// HIP compile check: every context-parallel kernel as csrc/cp/cp_cuda.cu launches them (the
// compress_partials instances: state x input dtype x head_dim x ratio; merge_partials, a plain
// kernel of merge_kernel.cuh).
#include "../include/dsv4/cp/merge_kernel.cuh"
#include "../include/dsv4/cp/partials_kernel.cuh"

namespace dsv4 {
namespace cp {
#define DSV4_CP_PARTIALS_INSTANCES(TS, TI)                                              \
  template __global__ void cp_partials_kernel<TS, TI, 128, 4>(const PartialsParams);   \
  template __global__ void cp_partials_kernel<TS, TI, 128, 128>(const PartialsParams); \
  template __global__ void cp_partials_kernel<TS, TI, 512, 4>(const PartialsParams);   \
  template __global__ void cp_partials_kernel<TS, TI, 512, 128>(const PartialsParams);
DSV4_CP_PARTIALS_INSTANCES(float, float)
DSV4_CP_PARTIALS_INSTANCES(float, uint16_t)
DSV4_CP_PARTIALS_INSTANCES(uint16_t, float)
DSV4_CP_PARTIALS_INSTANCES(uint16_t, uint16_t)
}  // namespace cp
}  // namespace dsv4
