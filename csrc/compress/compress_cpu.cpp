// compress_forward on the CPU (docs/contract.md 3.4, 3.5): plain C++ over at::parallel_for, fp32 math,
// built from the same per-item math as the GPU kernels (include/dsv4/compress_math.h); only
// the summation grouping is the CPU's own (compress/pool_window_cpu.h).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "compress/compress_checks.h"
#include "compress/compress_cpu.h"
#include "compress/pool_window_cpu.h"

namespace dsv4 {
namespace compress {
namespace {

template <typename TS, typename TI>
struct Ctx {
  Params p;
  TS* st;
  const TI* in;
  int64_t st_row;  // elements per state row
  int64_t in_row;  // elements per input row
  int64_t in_stride;  // elements from one input row to the next
  std::vector<float> ape;  // [win, hd] as fp32
};

template <typename TS, typename TI>
Ctx<TS, TI> make_ctx(const Params& p, bool online) {
  return Ctx<TS, TI>{p, static_cast<TS*>(p.state), static_cast<const TI*>(p.input),
                     state_row_elems(p.cr, p.hd, online), input_row_elems(p.cr, p.hd),
                     p.in_row_stride, ape_as_f32(p.ape, p.ape_type, p.cr, p.hd)};
}

// Pool the window `d` into res[0..hd) (softmax states). `scratch` holds hd states. Absent rows
// of a window that has a present row fold as the GPU kernels fold them (pool_window_cpu.h).
template <typename TS, typename TI>
void pool_window(const Ctx<TS, TI>& c, const WindowDesc& d, SoftmaxState* res,
                 SoftmaxState* scratch) {
  const int cr = c.p.cr, hd = c.p.hd;
  const WindowRows w = resolve_rows(d, cr, c.p.num_state_rows, c.p.num_in_rows);
  if (window_empty(w, cr)) {  // e.g. an invalid record: nothing to fold or merge
    for (int ch = 0; ch < hd; ++ch) res[ch] = softmax_empty();
    return;
  }
  fold_window_rows(c.st, c.st_row, c.in, c.in_stride, c.ape.data(), cr, hd,
                   [&](int r) { return row_source(w, cr, r); }, res, scratch);
}

template <typename TS, typename TI>
void copy_row(const Ctx<TS, TI>& c, int64_t src, int64_t dst) {
  if (src < 0 || src >= c.p.num_in_rows || dst < 0 || dst >= c.p.num_state_rows) return;
  const TI* s = c.in + src * c.in_stride;
  TS* d = c.st + dst * c.st_row;
  for (int64_t i = 0; i < c.in_row; ++i) store_from_f32(d, i, load_as_f32(s, i));
}

template <typename TS, typename TI>
void write_out(const Ctx<TS, TI>& c, int64_t row, const SoftmaxState* res) {
  for (int ch = 0; ch < c.p.hd; ++ch)
    store_out(c.p.out, c.p.out_type, row * c.p.hd + ch, res ? softmax_value(res[ch]) : 0.0f);
}

// Offline decode: per batch entry, copy the input row into write_loc, then pool the window
// from the state (the just-written row therefore enters as its state-dtype value).
template <typename TS, typename TI>
void offline_decode(const Ctx<TS, TI>& c) {
  const auto* plan = reinterpret_cast<const DecodePlan*>(c.p.plan);
  at::parallel_for(0, c.p.num_records, 1, [&](int64_t b0, int64_t b1) {
    const size_t hd = static_cast<size_t>(c.p.hd);
    std::vector<SoftmaxState> res(hd), scratch(hd);
    for (int64_t b = b0; b < b1; ++b) {
      DecodePlan rec;
      std::memcpy(&rec, plan + b, sizeof(rec));
      copy_row(c, b, rec.write_loc);
      const WindowDesc d = offline_decode_window(rec, c.p.cr);
      if (d.hi > 0) {
        pool_window(c, d, res.data(), scratch.data());
        write_out(c, b, res.data());
      } else {
        write_out(c, b, nullptr);
      }
    }
  });
}

// The end of the records that are not part of a trailing run of invalid ones. A padded
// (CUDA-graph or traced) plan ends in such a run (contract 3.3); the threads split the records
// before it, and its rows are zeros (static chunks over all num_q records left the valid
// quarter of a cr 4 plan to a quarter of the threads).
int64_t valid_end(const CompressPlan* plan, int64_t n) {
  for (CompressPlan rec; n > 0; --n) {
    std::memcpy(&rec, plan + n - 1, sizeof(rec));
    if (is_valid(rec)) break;
  }
  return n;
}

template <typename TS, typename TI>
void write_zero_rows(const Ctx<TS, TI>& c, int64_t k0, int64_t k1) {
  at::parallel_for(k0, k1, 64, [&](int64_t a, int64_t b) {
    for (int64_t k = a; k < b; ++k) write_out(c, k, nullptr);
  });
}

// Offline prefill: every compress record first (reads the pre-write state), then the writes.
template <typename TS, typename TI>
void offline_prefill(const Ctx<TS, TI>& c, const uint8_t* plan_w, int64_t num_w) {
  const auto* plan = reinterpret_cast<const CompressPlan*>(c.p.plan);
  const int64_t pooled = valid_end(plan, c.p.num_records);
  write_zero_rows(c, pooled, c.p.num_records);
  at::parallel_for(0, pooled, 1, [&](int64_t k0, int64_t k1) {
    const size_t hd = static_cast<size_t>(c.p.hd);
    std::vector<SoftmaxState> res(hd), scratch(hd);
    for (int64_t k = k0; k < k1; ++k) {
      CompressPlan rec;
      std::memcpy(&rec, plan + k, sizeof(rec));
      pool_window(c, offline_prefill_window(rec, c.p.cr), res.data(), scratch.data());
      write_out(c, k, res.data());
    }
  });
  const auto* wplan = reinterpret_cast<const WritePlan*>(plan_w);
  at::parallel_for(0, num_w, 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      WritePlan w;
      std::memcpy(&w, wplan + k, sizeof(w));
      if (is_valid(w)) copy_row(c, int64_t(w.ragged_id), int64_t(w.write_loc));
    }
  });
}

template <typename TS, typename TI>
SoftmaxState load_online(const Ctx<TS, TI>& c, int64_t slot, int ch) {
  if (slot < 0 || slot >= c.p.num_state_rows) return softmax_empty();
  const TS* r = c.st + slot * c.st_row;
  const int hd = c.p.hd;
  return from_online(load_as_f32(r, ch), load_as_f32(r, hd + ch), load_as_f32(r, 2 * hd + ch));
}

template <typename TS, typename TI>
void store_online(const Ctx<TS, TI>& c, int64_t slot, int ch, const SoftmaxState& s) {
  if (slot < 0 || slot >= c.p.num_state_rows) return;
  TS* r = c.st + slot * c.st_row;
  const int hd = c.p.hd;
  const OnlineRow o = to_online(s);
  store_from_f32(r, ch, o.m);
  store_from_f32(r, hd + ch, o.S);
  store_from_f32(r, 2 * hd + ch, o.K);
}

// Online decode (contract 3.5): fold the token into the running state; q == 127 emits K'.
template <typename TS, typename TI>
void online_decode(const Ctx<TS, TI>& c) {
  const auto* plan = reinterpret_cast<const DecodePlan*>(c.p.plan);
  const int hd = c.p.hd;
  at::parallel_for(0, c.p.num_records, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      DecodePlan rec;
      std::memcpy(&rec, plan + b, sizeof(rec));
      const bool active = online_decode_active(rec) && b < c.p.num_in_rows;
      const int q = active ? online_decode_q(rec) : 0;
      for (int ch = 0; ch < hd; ++ch) {
        float res = 0.0f;
        if (active) {
          SoftmaxState s = q == 0 ? softmax_empty() : load_online(c, rec.read_page_0, ch);
          const TI* row = c.in + b * c.in_stride;
          online_fold_token(s, load_as_f32(row, hd + ch) + c.ape[size_t(q * hd + ch)],
                            load_as_f32(row, ch));
          if (q == 127)
            res = softmax_value(s);
          else
            store_online(c, rec.write_loc, ch, s);
        }
        store_out(c.p.out, c.p.out_type, b * hd + ch, res);
      }
    }
  });
}

// Online prefill pass over plan_c (store == false: out[k] = K) or plan_w (store: (M, S, K) at
// read_page_0). The segment's pooled state is merged after the stored one; a segment of at most
// kTokenFoldMax tokens is folded token by token from the stored state instead (as decode).
template <typename TS, typename TI>
void online_prefill_pass(const Ctx<TS, TI>& c, bool store) {
  const auto* plan = reinterpret_cast<const CompressPlan*>(c.p.plan);
  const int hd = c.p.hd;
  const int64_t pooled = valid_end(plan, c.p.num_records);  // the rest: out zeros, no store
  if (!store) write_zero_rows(c, pooled, c.p.num_records);
  at::parallel_for(0, pooled, 1, [&](int64_t k0, int64_t k1) {
    std::vector<SoftmaxState> res(static_cast<size_t>(hd)), scratch(static_cast<size_t>(hd));
    for (int64_t k = k0; k < k1; ++k) {
      CompressPlan rec;
      std::memcpy(&rec, plan + k, sizeof(rec));
      const OnlineSegment seg = online_segment(rec);
      const bool by_token = folds_by_token(seg);
      const WindowRows w = resolve_rows(seg.win, 128, c.p.num_state_rows, c.p.num_in_rows);
      if (!by_token) pool_window(c, seg.win, res.data(), scratch.data());
      for (int ch = 0; ch < hd; ++ch) {
        SoftmaxState x = res[size_t(ch)];
        if (by_token) {
          x = online_fold_tokens<TS, TI>(
              seg.merge ? load_online(c, seg.read_slot, ch) : softmax_empty(), w, c.in,
              c.in_stride, c.p.ape, c.p.ape_type, hd, ch);
        } else if (seg.merge) {
          SoftmaxState y = load_online(c, seg.read_slot, ch);
          softmax_merge(y, x);
          x = y;
        }
        if (!store)
          store_out(c.p.out, c.p.out_type, k * hd + ch, softmax_value(x));
        else if (seg.valid)
          store_online(c, seg.write_slot, ch, x);
      }
    }
  });
}

template <typename TS, typename TI>
void run(const CallShape& cs, const Params& base, const at::Tensor& plan,
         const std::optional<at::Tensor>& plan_w) {
  if (cs.online) {
    if (cs.decode) {
      online_decode(make_ctx<TS, TI>(pass_params(base, plan, true), true));
    } else {
      online_prefill_pass(make_ctx<TS, TI>(pass_params(base, plan, true), true), false);
      online_prefill_pass(make_ctx<TS, TI>(pass_params(base, *plan_w, false), true), true);
    }
  } else if (cs.decode) {
    offline_decode(make_ctx<TS, TI>(pass_params(base, plan, true), false));
  } else {
    offline_prefill(make_ctx<TS, TI>(pass_params(base, plan, true), false),
                    plan_w->data_ptr<uint8_t>(), plan_w->size(0));
  }
}

}  // namespace

void compress_forward_cpu(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                          const at::Tensor& ape, const at::Tensor& plan,
                          const std::optional<at::Tensor>& plan_w, at::Tensor out,
                          int64_t head_dim, int64_t compress_ratio, bool is_online) {
  const CallShape cs = check_compress_forward(kv_score_buffer, kv_score_input, ape, plan, plan_w,
                                              out, head_dim, compress_ratio, is_online);
  DSV4_CHECK(kv_score_buffer.device().is_cpu(), kOp, "kv_score_buffer",
             "must be a CPU tensor for the CPU kernel, got ", kv_score_buffer.device());
  const Params base = make_params(cs, kv_score_buffer, kv_score_input, ape, out);
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  if (!st_bf16 && !in_bf16)
    run<float, float>(cs, base, plan, plan_w);
  else if (!st_bf16 && in_bf16)
    run<float, uint16_t>(cs, base, plan, plan_w);
  else if (st_bf16 && !in_bf16)
    run<uint16_t, float>(cs, base, plan, plan_w);
  else
    run<uint16_t, uint16_t>(cs, base, plan, plan_w);
}

}  // namespace compress
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("compress_forward", &dsv4::compress::compress_forward_cpu);
}
