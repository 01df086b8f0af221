// compress_forward kernels of one instance: fp32 state, bf16 input, head_dim 512 (kernel_set.cuh).
#include "include/dsv4/compress/kernel_set_def.cuh"

DSV4_COMPRESS_KERNEL_SET(float, uint16_t, 512)
