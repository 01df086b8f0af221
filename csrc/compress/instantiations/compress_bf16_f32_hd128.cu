// compress_forward kernels of one instance: bf16 state, fp32 input, head_dim 128 (kernel_set.cuh).
#include "include/dsv4/compress/kernel_set_def.cuh"

DSV4_COMPRESS_KERNEL_SET(uint16_t, float, 128)
