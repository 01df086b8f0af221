// compress_and_store kernels of one instance: bf16 state, bf16 input (kernel_set.cuh).
#include "include/dsv4/fused/kernel_set_def.cuh"

DSV4_FUSED_KERNEL_SET(uint16_t, uint16_t)
