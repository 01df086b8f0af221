// Block sizes the CUDA/HIP glue launches the planner kernels with (and the HIP compile check
// instantiates them with). Torch-free.
#pragma once

namespace dsv4 {

constexpr int kPlanBlock = 256;       // decode / emission / fused kernels (a multiple of 64)
constexpr int kPlanScanBlock = 1024;  // the scan kernel's largest block (a multiple of 64)

}  // namespace dsv4
