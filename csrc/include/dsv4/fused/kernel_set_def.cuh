// Every compress_and_store kernel header, and the definition of kernel_set<TS, TI>() (see
// kernel_set.cuh): included by the instance translation units
// (csrc/fused/instantiations/fused_<state>_<input>.cu, one DSV4_FUSED_KERNEL_SET each) and by
// the HIP compile check (scripts/hip/fused_instances.cu). Torch-free.
#pragma once

#include "c4_decode_store.cuh"
#include "c4_prefill_store.cuh"
#include "kernel_set.cuh"
#include "online_decode_store.cuh"
#include "write_rows_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, int kFormat>
void set_format(KernelSet& k) {
  k.c4_decode[0][kFormat] = c4_decode_store_kernel<TS, TI, float, kFormat>;
  k.c4_decode[1][kFormat] = c4_decode_store_kernel<TS, TI, uint16_t, kFormat>;
  k.online_decode[0][kFormat] = online_decode_store_kernel<TS, TI, float, kFormat>;
  k.online_decode[1][kFormat] = online_decode_store_kernel<TS, TI, uint16_t, kFormat>;
  k.c4_prefill[0][kFormat] = c4_prefill_store_kernel<TS, TI, float, kFormat>;
  k.c4_prefill[1][kFormat] = c4_prefill_store_kernel<TS, TI, uint16_t, kFormat>;
  k.write_rows_store[0][kFormat] = write_rows_store_kernel<TS, TI, float, kFormat>;
  k.write_rows_store[1][kFormat] = write_rows_store_kernel<TS, TI, uint16_t, kFormat>;
}

template <typename TS, typename TI>
KernelSet kernel_set() {
  KernelSet k{};
  set_format<TS, TI, kStoreFp8DsMla>(k);
  set_format<TS, TI, kStoreBf16>(k);
  set_format<TS, TI, kStoreFp8Indexer>(k);
  set_format<TS, TI, kStoreFp4Indexer>(k);
  set_format<TS, TI, store_layout_format(kLayoutV41)>(k);
  set_format<TS, TI, store_layout_format(kLayoutV41Fp4)>(k);
  set_format<TS, TI, store_layout_format(kLayoutUniformFp8)>(k);
  set_format<TS, TI, store_layout_format(kLayoutV41New)>(k);
  set_format<TS, TI, store_layout_format(kLayoutV41Fp4New)>(k);
  static_assert(store_layout_format(kLayoutV41Fp4New) + 1 == kStoreKernelFormats,
                "every store kernel format has its fused kernels");
  return k;
}

}  // namespace fused
}  // namespace dsv4

// The instance of one translation unit (at global scope).
#define DSV4_FUSED_KERNEL_SET(TS, TI)   \
  namespace dsv4 {                      \
  namespace fused {                     \
  template KernelSet kernel_set<TS, TI>(); \
  }                                     \
  }

#endif  // DSV4_GPU_COMPILER
