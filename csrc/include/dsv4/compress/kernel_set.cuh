// The compress_forward kernels one launch may pick, as a table per (state type, input type,
// head_dim) instance. Declarations only (no kernel body): the launching glue
// (csrc/compress/compress_cuda.cu) includes this, and each instance is defined in its own
// translation unit (csrc/compress/instantiations/, kernel_set_def.cuh), so that the kernels
// compile in parallel. A table of kernel addresses rather than extern kernel templates: nvcc's
// whole-program mode gives each template kernel's host stub internal linkage. Torch-free.
#pragma once

#include "params.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

using Kernel = void (*)(Params);

struct KernelSet {
  Kernel c4_prefill, c4_decode;                  // c4_kernel<TS, TI, kDecode, kHd>
  Kernel c128_prefill, c128_online;              // c128_prefill_kernel<TS, TI, kMode, kHd>
  Kernel c128_decode;                            // c128_decode_kernel<TS, TI, kHd>
  Kernel write_c4_rows, write_c128_rows;         // write_rows_kernel<TS, TI, 4 / 2 * kHd>
  // online_decode_kernel<TS, TI> takes head_dim at run time: only the kHd = 512 set holds it
  // (nullptr in the other), so that it is compiled once.
  Kernel online_decode;
};

// TS, TI in {float, uint16_t} (bf16 bits), kHd in {128, 512}.
template <typename TS, typename TI, int kHd>
KernelSet kernel_set();

// X(TS, TI, HD) for every instance, one translation unit each.
#define DSV4_COMPRESS_KERNEL_SETS(X)                                              \
  X(float, float, 128) X(float, float, 512) X(float, uint16_t, 128)               \
  X(float, uint16_t, 512) X(uint16_t, float, 128) X(uint16_t, float, 512)         \
  X(uint16_t, uint16_t, 128) X(uint16_t, uint16_t, 512)

#define DSV4_COMPRESS_EXTERN_KERNEL_SET(TS, TI, HD) \
  extern template KernelSet kernel_set<TS, TI, HD>();
DSV4_COMPRESS_KERNEL_SETS(DSV4_COMPRESS_EXTERN_KERNEL_SET)
#undef DSV4_COMPRESS_EXTERN_KERNEL_SET

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
