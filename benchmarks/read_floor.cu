// How fast the GPU can move the bytes of the large benchmark cases at all: for each case's
// minimum traffic (the MB column of benchmarks/run.py), the cold time of a pure read of that
// many bytes and of a copy moving them (half read, half written), timed as the benchmarks time
// the ops (a 256 MiB memset before each call, CUDA events, median). Two read shapes:
//   * persistent: one wave of blocks (4 of 512 threads per multiprocessor), each striding
//     over the buffer with 4 independent 16-byte streaming loads per thread and turn; every
//     block gets the same share, as the grouped cr 128 decode's blocks do;
//   * one block per 64 KB: the hardware hands each block to the next free slot, as the
//     prefill kernels' one-block-per-record grids are.
// A kernel that reads its bytes cannot beat the faster of the two by much, so these are the
// floors that the performance targets are compared with.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o read_floor benchmarks/read_floor.cu && ./read_floor [reps]
//
// CI compiles it (scripts/check_cuda_build.sh); it runs only on a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                          \
  do {                                                                         \
    const cudaError_t e_ = (x);                                                \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("read_floor: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

constexpr int kThreads = 512;
constexpr int kLoads = 4;        // persistent read: independent loads per thread and turn
constexpr int kChunkLoads = 8;   // one-block-per-chunk read: 8 x 16 B x 512 threads = 64 KB

// The sum keeps the loads alive; it is never equal to the sentinel, so nothing is written.
__device__ void keep(float acc, float* sink) {
  if (acc == -1.0f) *sink = acc;
}

__global__ void persistent_read(const float4* __restrict__ p, int64_t n, float* sink) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  float acc = 0.0f;
  for (int64_t i0 = int64_t(blockIdx.x) * kThreads + threadIdx.x; i0 < n; i0 += kLoads * stride) {
    float4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = i0 + u * stride;
      v[u] = i < n ? __ldcs(p + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  keep(acc, sink);
}

__global__ void chunk_read(const float4* __restrict__ p, int64_t n, float* sink) {
  const int64_t base = int64_t(blockIdx.x) * kThreads * kChunkLoads + threadIdx.x;
  float4 v[kChunkLoads];
#pragma unroll
  for (int u = 0; u < kChunkLoads; ++u) {
    const int64_t i = base + u * kThreads;
    v[u] = i < n ? __ldcs(p + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kChunkLoads; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  keep(acc, sink);
}

struct Case {
  const char* name;
  double mb;
  double target_us;  // the performance target; 0: compress_forward at 90 % of the copy bandwidth
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  // benchmarks/run.py's minimum traffic of the large cases (docs/h200/benchmarks.md) and
  // their targets (the store twice as fast as the reference engine's 20 us, the all-closing
  // decode no slower than its 138 us).
  const Case cases[] = {{"fp8_ds_mla store p8x4096", 23.9, 10.0},
                        {"cr 4 hd 128 prefill p8x4096 (fp32)", 72.5, 0.0},
                        {"cr 128 hd 512 prefill p8x4096 (fp32)", 135.0, 0.0},
                        {"cr 4 hd 512 prefill p8x4096 (fp32)", 290.0, 0.0},
                        {"cr 128 hd 512 decode, 1024 all closing (fp32)", 548.0, 138.0}};
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = size_t(256) << 20, buf_bytes = size_t(1) << 30;
  void *flush = nullptr, *src = nullptr, *dst = nullptr;
  float* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
  CHECK_CUDA(cudaMalloc(&src, buf_bytes));
  CHECK_CUDA(cudaMalloc(&dst, buf_bytes));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(float)));
  CHECK_CUDA(cudaMemset(src, 1, buf_bytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  // Median cold time (us) of `launch`, the L2 flushed by a memset before each call.
  const auto cold_us = [&](auto&& launch) {
    for (int w = 0; w < 3; ++w) launch();
    std::vector<float> ts;
    for (int r = 0; r < reps; ++r) {
      CHECK_CUDA(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
      CHECK_CUDA(cudaEventRecord(start));
      launch();
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      ts.push_back(ms * 1e3f);
    }
    CHECK_CUDA(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    return double(ts[ts.size() / 2]);
  };
  const auto copy = [&](size_t moved) {  // moved = bytes read + bytes written
    return cold_us([&] {
      CHECK_CUDA(cudaMemcpyAsync(dst, src, moved / 2, cudaMemcpyDeviceToDevice));
    });
  };

  const double copy_gbps = double(buf_bytes) * 2 / (copy(buf_bytes * 2) * 1e3);
  std::printf("# read floor: %s, %d SMs, %d reps\n\n", prop.name, sms, reps);
  std::printf("copy bandwidth (1 GiB device-to-device copy, read + write): %.0f GB/s\n\n",
              copy_gbps);
  std::printf("| case | MB | same-size copy us | persistent read us | block-per-64KB read us |"
              " target us |\n|---|---:|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    const int64_t bytes = int64_t(c.mb * 1e6) / 16 * 16, n = bytes / 16;
    const float4* p = static_cast<const float4*>(src);
    const double t_copy = copy(size_t(bytes));
    const double t_persistent =
        cold_us([&] { persistent_read<<<4 * sms, kThreads>>>(p, n, sink); });
    const unsigned chunks = unsigned((n + kThreads * kChunkLoads - 1) / (kThreads * kChunkLoads));
    const double t_chunk = cold_us([&] { chunk_read<<<chunks, kThreads>>>(p, n, sink); });
    const double target = c.target_us > 0 ? c.target_us : c.mb * 1e6 / (0.9 * copy_gbps * 1e3);
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", c.name, c.mb, t_copy,
                t_persistent, t_chunk, target);
  }
  std::printf("\nempty kernel, cold: %.2f us\n",
              cold_us([&] { persistent_read<<<2 * sms, kThreads>>>(nullptr, 0, sink); }));
  return 0;
}
