// The compress_and_store kernels one launch may pick, per (state type, input type) instance
// and store format. Declarations only: the glue (csrc/fused/fused_cuda.cu) includes this, each
// instance is defined in its own translation unit (csrc/fused/instantiations/,
// kernel_set_def.cuh), as compress/kernel_set.cuh does for compress_forward. Torch-free.
#pragma once

#include "../compress/params.cuh"
#include "../store/store_kernel.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

using Kernel = void (*)(compress::Params, StoreKernelArgs);

// The store kernel's formats: the four StoreFormats, then fp8_ds_mla rows in each V4.1 layout
// (store_layout_format).
constexpr int kStoreKernelFormats = kStoreFp4Indexer + kNumKvLayouts;

// [rows bf16][format]: the rows (out) fp32 (0) or bf16 (1).
struct KernelSet {
  Kernel c4_decode[2][kStoreKernelFormats];      // c4_decode_store_kernel<TS, TI, TO, format>
  Kernel online_decode[2][kStoreKernelFormats];  // online_decode_store_kernel<TS, TI, TO, format>
};

// TS, TI in {float, uint16_t} (bf16 bits).
template <typename TS, typename TI>
KernelSet kernel_set();

#define DSV4_FUSED_EXTERN_KERNEL_SET(TS, TI) extern template KernelSet kernel_set<TS, TI>();
DSV4_FUSED_EXTERN_KERNEL_SET(float, float)
DSV4_FUSED_EXTERN_KERNEL_SET(float, uint16_t)
DSV4_FUSED_EXTERN_KERNEL_SET(uint16_t, float)
DSV4_FUSED_EXTERN_KERNEL_SET(uint16_t, uint16_t)
#undef DSV4_FUSED_EXTERN_KERNEL_SET

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
