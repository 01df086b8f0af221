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
using WriteStoreKernel = void (*)(compress::Params, StoreKernelArgs, int);

// The store kernel's formats: the four StoreFormats, then fp8_ds_mla rows in each V4.1 layout
// (store_layout_format).
constexpr int kStoreKernelFormats = kStoreFp4Indexer + kNumKvLayouts;

// [rows bf16][format]: the rows (out) fp32 (0) or bf16 (1).
struct KernelSet {
  Kernel c4_decode[2][kStoreKernelFormats];      // c4_decode_store_kernel<TS, TI, TO, format>
  Kernel online_decode[2][kStoreKernelFormats];  // online_decode_store_kernel<TS, TI, TO, format>
  Kernel c4_prefill[2][kStoreKernelFormats];     // c4_prefill_store_kernel<TS, TI, TO, format>
  // write_rows_store_kernel<TS, TI, TO, format>: the cr 128 offline prefill's second launch
  WriteStoreKernel write_rows_store[2][kStoreKernelFormats];
};

// Store blocks of a write_rows_store_kernel launch: a lane group a row up to two blocks an SM,
// then the rows strided over those groups.
inline int64_t write_store_blocks(int64_t rows, int64_t sms) {
  return compress::lane_group_blocks(rows, 2 * sms);
}

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
