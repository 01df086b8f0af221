// Online decode (docs/contract.md 3.5): one token per batch entry folded into the running
// (M, S, K) state of its 128-token chunk. Torch-free.
//
// online_decode_kernel<TS, TI>: element-wise, kBlock = 256 threads of kVec = 4 channels each,
// hd / 4 threads per entry (head_dim is a run-time value: the state row is read once and a
// single row is folded, so constant offsets buy nothing here).
#pragma once

#include "params.cuh"
#include "window_rows.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// One token per batch entry: q = (seq_len-1) % 128; fold z = score + ape[q] into the state at
// read_page_0 (restart at q == 0); q == 127: out = K' and the state is not stored; otherwise
// store (M, S', K') at write_loc and out = 0. This thread's channels c..c+3 of entry
// blockIdx.x * online_decode_per_block(hd) + threadIdx.x / (hd / kVec). Also run by the fused
// compress_and_store kernel (fused/online_decode_store.cuh) before its store.
// `sink(i, v)` takes the entry's out channels (vec.cuh's OutStore writes them to p.out).
template <typename TS, typename TI, typename Sink>
DSV4_DEVICE void online_decode_entry(const Params& p, const Sink& sink) {
  const int hd = p.hd;
  const int lanes = hd / kVec;
  const int64_t b = int64_t(blockIdx.x) * online_decode_per_block(hd) + threadIdx.x / lanes;
  const int c = int(threadIdx.x % lanes) * kVec;
  if (b >= p.num_records) return;

  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t st_row = 3 * int64_t(hd);
  const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[b];
  float res[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (online_decode_active(rec) && b < p.num_in_rows) {
    const int q = online_decode_q(rec);
    SoftmaxState s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = softmax_empty();
    const int64_t rp0 = rec.read_page_0;
    if (q != 0 && rp0 >= 0 && rp0 < p.num_state_rows) {
      float m[4], S[4], K[4];
      const TS* r = st + rp0 * st_row;
      load_vec(r + c, m);
      load_vec(r + hd + c, S);
      load_vec(r + 2 * int64_t(hd) + c, K);
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = from_online(m[j], S[j], K[j]);
    }
    float kv[1][4], z[1][4], a[1][4];
    load_vec(in + b * p.in_row_stride + c, kv[0]);
    load_vec(in + b * p.in_row_stride + hd + c, z[0]);
    load_ape_rows<1, kVec, 0>(p.ape, p.ape_type, int64_t(q) * hd + c, a);  // one row: no stride
    add_ape(a, z);
#pragma unroll
    for (int j = 0; j < 4; ++j) online_fold_token(s[j], z[0][j], kv[0][j]);
    if (q == 127) {
#pragma unroll
      for (int j = 0; j < 4; ++j) res[j] = softmax_value(s[j]);
    } else {
      const int64_t wl = rec.write_loc;
      if (wl >= 0 && wl < p.num_state_rows) {
        float m[4], S[4], K[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const OnlineRow o = to_online(s[j]);
          m[j] = o.m;
          S[j] = o.S;
          K[j] = o.K;
        }
        TS* w = st + wl * st_row;
        store_vec(w + c, m);
        store_vec(w + hd + c, S);
        store_vec(w + 2 * int64_t(hd) + c, K);
      }
    }
  }
  pdl_trigger();
  sink(b * hd + c, res);
}

template <typename TS, typename TI>
__global__ void DSV4_COMPRESS_BOUNDS(kBlock, 2) online_decode_kernel(const Params p) {
  pdl_wait();
  online_decode_entry<TS, TI>(p, OutStore{p});
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
