// compress_partials and merge_partials on the CPU (docs/contract.md 8): plain C++ over
// at::parallel_for. A window folds in compress_forward's CPU order (compress/pool_window_cpu.h)
// over the rows this rank holds; the merge is cp_math.h's, element by element.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "compress/pool_window_cpu.h"
#include "cp/cp_checks.h"

namespace dsv4 {
namespace cp {
namespace {

template <typename TS, typename TI>
void partials_cpu(const PartialsParams& p) {
  const int cr = p.cr, hd = p.hd;
  const TS* st = static_cast<const TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  const int64_t row = compress::input_row_elems(cr, hd);
  const std::vector<float> ape = compress::ape_as_f32(p.ape, p.ape_type, cr, hd);
  const auto* plan = reinterpret_cast<const CompressPlan*>(p.plan_c);
  const int64_t n = p.num_windows;
  at::parallel_for(0, n, 1, [&](int64_t k0, int64_t k1) {
    const size_t channels = static_cast<size_t>(hd);
    std::vector<SoftmaxState> res(channels), scratch(channels);
    for (int64_t k = k0; k < k1; ++k) {
      CompressPlan rec;
      std::memcpy(&rec, plan + k, sizeof(rec));
      const WindowRows w = compress::resolve_rows(compress::offline_prefill_window(rec, cr), cr,
                                                  p.num_state_rows, p.num_batch_rows);
      const auto source = [&](int r) {
        return rank_row_source(w, cr, r, p.input_rows, p.num_local_rows, p.read_state != 0);
      };
      bool holds = false;
      for (int r = 0; r < window_of(cr) && !holds; ++r) holds = rank_holds(source(r));
      if (holds) {
        compress::fold_window_rows(st, row, in, row, ape.data(), cr, hd, source, res.data(),
                                   scratch.data());
      } else {
        for (int ch = 0; ch < hd; ++ch) res[static_cast<size_t>(ch)] = no_rows();
      }
      for (int ch = 0; ch < hd; ++ch) {
        const SoftmaxState& s = res[static_cast<size_t>(ch)];
        p.partials[k * hd + ch] = s.m;
        p.partials[(n + k) * hd + ch] = s.s;
        p.partials[(2 * n + k) * hd + ch] = s.a;
      }
    }
  });
  // The rows plan_w persists that this rank holds, bit for bit; zeros elsewhere.
  const auto* wplan = reinterpret_cast<const WritePlan*>(p.plan_w);
  TI* persist = static_cast<TI*>(p.persist);
  at::parallel_for(0, p.num_persist, 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      WritePlan rec;
      std::memcpy(&rec, wplan + k, sizeof(rec));
      const int64_t local = persist_source(rec, p);
      TI* dst = persist + k * row;
      if (local >= 0)
        std::memcpy(dst, in + local * row, size_t(row) * sizeof(TI));
      else
        std::memset(dst, 0, size_t(row) * sizeof(TI));
    }
  });
}

void compress_partials_cpu(const at::Tensor& kv_score_buffer, const at::Tensor& kv_score_input,
                           const at::Tensor& input_rows, const at::Tensor& ape,
                           const at::Tensor& plan_c, const at::Tensor& plan_w,
                           at::Tensor partials, at::Tensor persist_rows, int64_t head_dim,
                           int64_t compress_ratio, bool read_state) {
  const PartialsParams p =
      check_compress_partials(kv_score_buffer, kv_score_input, input_rows, ape, plan_c, plan_w,
                              partials, persist_rows, head_dim, compress_ratio, read_state);
  DSV4_CHECK(kv_score_buffer.device().is_cpu(), kPartialsOp, "kv_score_buffer",
             "must be a CPU tensor for the CPU kernel, got ", kv_score_buffer.device());
  const bool st_bf16 = kv_score_buffer.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  if (!st_bf16 && !in_bf16)
    partials_cpu<float, float>(p);
  else if (!st_bf16 && in_bf16)
    partials_cpu<float, uint16_t>(p);
  else if (st_bf16 && !in_bf16)
    partials_cpu<uint16_t, float>(p);
  else
    partials_cpu<uint16_t, uint16_t>(p);
}

void merge_partials_cpu(const at::Tensor& partials, const std::optional<at::Tensor>& max_m,
                        at::Tensor out) {
  const MergeParams p = check_merge_partials(partials, max_m, out);
  DSV4_CHECK(partials.device().is_cpu(), kMergeOp, "partials",
             "must be a CPU tensor for the CPU kernel, got ", partials.device());
  at::parallel_for(0, p.num_elems, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) merge_element(p, i);
  });
}

}  // namespace
}  // namespace cp
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("compress_partials", &dsv4::cp::compress_partials_cpu);
  m.impl("merge_partials", &dsv4::cp::merge_partials_cpu);
}
