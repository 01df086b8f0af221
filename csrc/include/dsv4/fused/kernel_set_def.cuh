// Every compress_and_store kernel header, and the definition of kernel_set<TS, TI>() (see
// kernel_set.cuh): included by the instance translation units
// (csrc/fused/instantiations/fused_<state>_<input>.cu, one DSV4_FUSED_KERNEL_SET each) and by
// the HIP compile check (scripts/hip/fused_instances.cu). Torch-free.
#pragma once

#include "c4_decode_store.cuh"
#include "kernel_set.cuh"
#include "online_decode_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI>
KernelSet kernel_set() {
  KernelSet k{};
  k.c4_decode[kStoreFp8DsMla] = c4_decode_store_kernel<TS, TI, kStoreFp8DsMla>;
  k.c4_decode[kStoreBf16] = c4_decode_store_kernel<TS, TI, kStoreBf16>;
  k.c4_decode[kStoreFp8Indexer] = c4_decode_store_kernel<TS, TI, kStoreFp8Indexer>;
  k.c4_decode[kStoreFp4Indexer] = c4_decode_store_kernel<TS, TI, kStoreFp4Indexer>;
  k.online_decode[kStoreFp8DsMla] = online_decode_store_kernel<TS, TI, kStoreFp8DsMla>;
  k.online_decode[kStoreBf16] = online_decode_store_kernel<TS, TI, kStoreBf16>;
  k.online_decode[kStoreFp8Indexer] = online_decode_store_kernel<TS, TI, kStoreFp8Indexer>;
  k.online_decode[kStoreFp4Indexer] = online_decode_store_kernel<TS, TI, kStoreFp4Indexer>;
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
