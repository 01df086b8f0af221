// Host-side kernel launch shared by every CUDA/HIP op: one place that knows about
// programmatic dependent launch (PDL) and its absence on HIP. No torch includes.
#pragma once

#include "portability.h"

#include <utility>

namespace dsv4 {

#if defined(DSV4_HIP)
using gpuStream_t = hipStream_t;
#else
using gpuStream_t = cudaStream_t;
#endif

// Launch `kernel` on `stream`. With `pdl` (sm_90+ only, CUDA only) the kernel may start
// while the previous kernel of the stream drains; every dsv4 kernel calls pdl_wait()
// before it touches memory that earlier work produces, which is what makes this safe.
template <typename... KArgs, typename... Args>
inline void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                          gpuStream_t stream, bool pdl, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if defined(DSV4_HIP)
  (void)pdl;
  hipLaunchKernelGGL(kernel, grid, block, smem, stream, static_cast<KArgs>(args)...);
#else
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
#endif
}

}  // namespace dsv4
