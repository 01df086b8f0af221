// HIP compile check: every speculative-decoding kernel as csrc/spec/spec_cuda.cu launches them
// (write_prefix_states: state x input dtype; mark_pending and commit_pending, plain kernels).
#include "../include/dsv4/spec/commit_pending_kernel.cuh"
#include "../include/dsv4/spec/mark_pending_kernel.cuh"
#include "../include/dsv4/spec/write_prefix_kernel.cuh"

namespace dsv4 {
namespace spec {
template __global__ void write_prefix_kernel<float, float>(const WritePrefixParams);
template __global__ void write_prefix_kernel<float, uint16_t>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, float>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, uint16_t>(const WritePrefixParams);
}  // namespace spec
}  // namespace dsv4
