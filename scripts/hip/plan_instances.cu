// HIP compile check: the planner kernels exactly as the extension uses them.
#include "../include/dsv4/plan_kernels.cuh"

DSV4_PLAN_INSTANTIATE_KERNELS()
