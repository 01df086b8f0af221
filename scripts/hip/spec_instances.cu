// HIP compile check: every speculative-decoding kernel as csrc/spec/spec_cuda.cu launches them
// (write_prefix_states: state x input dtype x head_dim; mark_pending and commit_pending, plain
// kernels).
#include "../include/dsv4/spec/commit_pending_kernel.cuh"
#include "../include/dsv4/spec/mark_pending_kernel.cuh"
#include "../include/dsv4/spec/write_prefix_kernel.cuh"

namespace dsv4 {
namespace spec {
template __global__ void write_prefix_kernel<float, float, 128>(const WritePrefixParams);
template __global__ void write_prefix_kernel<float, uint16_t, 128>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, float, 128>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, uint16_t, 128>(const WritePrefixParams);
template __global__ void write_prefix_kernel<float, float, 512>(const WritePrefixParams);
template __global__ void write_prefix_kernel<float, uint16_t, 512>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, float, 512>(const WritePrefixParams);
template __global__ void write_prefix_kernel<uint16_t, uint16_t, 512>(const WritePrefixParams);
}  // namespace spec
}  // namespace dsv4
