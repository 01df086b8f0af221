// Every compress_forward kernel header, and the definition of kernel_set<TS, TI, kHd>() (see
// kernel_set.cuh): included by the instance translation units
// (csrc/compress/instantiations/compress_<state>_<input>_hd<head_dim>.cu, one
// DSV4_COMPRESS_KERNEL_SET each) and by the HIP compile check
// (scripts/hip/compress_instances.cu). Torch-free.
#pragma once

#include "c128_decode.cuh"
#include "c128_prefill.cuh"
#include "c4.cuh"
#include "kernel_set.cuh"
#include "online_decode.cuh"
#include "write_rows.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

template <typename TS, typename TI, int kHd>
KernelSet kernel_set() {
  KernelSet k{};
  k.c4_prefill = c4_kernel<TS, TI, false, kHd>;
  k.c4_decode = c4_kernel<TS, TI, true, kHd>;
  k.c128_prefill = c128_prefill_kernel<TS, TI, kModePrefill, kHd>;
  k.c128_online = c128_prefill_kernel<TS, TI, kModeOnline, kHd>;
  k.c128_decode = c128_decode_kernel<TS, TI, kHd>;
  k.write_c4_rows = write_rows_kernel<TS, TI, 4 * kHd>;
  k.write_c128_rows = write_rows_kernel<TS, TI, 2 * kHd>;
  if constexpr (kHd == 512) k.online_decode = online_decode_kernel<TS, TI>;
  return k;
}

}  // namespace compress
}  // namespace dsv4

// The instance of one translation unit (at global scope).
#define DSV4_COMPRESS_KERNEL_SET(TS, TI, HD)                          \
  namespace dsv4 {                                                    \
  namespace compress {                                                \
  template KernelSet kernel_set<TS, TI, HD>();                        \
  }                                                                   \
  }

#endif  // DSV4_GPU_COMPILER
