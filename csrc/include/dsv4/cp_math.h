// Context-parallel prefill math shared by the CPU kernels and the GPU kernels (docs/contract.md
// 8): which window rows a rank folds into its partials, and the merge of the ranks' partials.
//
// Torch-free. A window of the batch's plan (contract 3.1) is resolved exactly as compress_forward
// resolves it (compress_math.h), against the batch's ragged rows; a rank then folds
//   * the input rows it holds (input_rows[ragged row] = its local row),
//   * the state rows, if it is the group's state reader (the state is the same on every rank,
//     so exactly one rank folds it),
//   * the window's absent rows as compress_forward folds them (kv 0, logit kAbsentScore + ape),
// and skips the rows another rank holds. A rank with no row of the window gives the partial
// (-inf, 0, 0); every other partial has m >= -FLT_MAX, so -inf marks "no rows here".
// The merge M = max_r m_r, S = sum_r s_r e^(m_r - M), K = sum_r k_r e^(m_r - M), out = K / S
// gives compress_forward's value up to the fp32 summation order: the fold over one window is
// the same sum split at other places.
#pragma once

#include "compress_math.h"

namespace dsv4 {
namespace cp {

using compress::RowSource;
using compress::SoftmaxState;
using compress::WindowRows;

// Window row held by another rank of the group: not folded here.
enum : int32_t { kElsewhere = 3 };

// Where this rank reads window row r: compress::kAbsent, kFromState (index = flat state row),
// kFromInput (index = local input row) or kElsewhere. The window must have been resolved with
// num_in_rows = the batch's ragged rows (the length of input_rows); an input_rows entry outside
// [0, num_local_rows) is a row held elsewhere.
DSV4_HD RowSource rank_row_source(const WindowRows& w, int cr, int r, const int32_t* input_rows,
                                  int64_t num_local_rows, bool read_state) {
  const RowSource s = compress::row_source(w, cr, r);
  if (s.kind == compress::kFromInput) {
    const int32_t local = input_rows[s.index];
    if (local >= 0 && local < num_local_rows) return RowSource{compress::kFromInput, local};
    return RowSource{kElsewhere, -1};
  }
  if (s.kind == compress::kFromState && !read_state) return RowSource{kElsewhere, -1};
  return s;
}

DSV4_HD bool rank_holds(const RowSource& s) {
  return s.kind == compress::kFromInput || s.kind == compress::kFromState;
}

// The partial of a window without a row on this rank.
DSV4_HD SoftmaxState no_rows() { return SoftmaxState{-INFINITY, 0.0f, 0.0f}; }

// Weight of a partial of max m in a merge of max M: e^(m - M), 0 for a partial without rows
// (also when every partial is one: M = -inf, where e^(m - M) would be a NaN). A NaN partial (a
// +inf logit, m = M = +inf) keeps its NaN.
DSV4_HD float partial_weight(float m, float M) {
  return m == -INFINITY ? 0.0f : compress::fexp(m - M);
}

// Merge of R partials (m, s, k) at p[r * rank_stride + {0, plane, 2 * plane}] and a bare max
// `floor` (-inf: none): M = max(floor, max_r m_r), S and K summed in rank order. R == 1 with
// floor -inf returns the partial itself (its weight is e^0 = 1).
DSV4_HD SoftmaxState merge_partials(const float* p, int64_t rank_stride, int64_t plane, int R,
                                    float floor) {
  float M = floor;
  for (int r = 0; r < R; ++r) M = fmaxf(M, p[r * rank_stride]);
  float S = 0.0f, K = 0.0f;
  for (int r = 0; r < R; ++r) {
    const float* q = p + r * rank_stride;
    const float w = partial_weight(q[0], M);
    S += q[plane] * w;
    K += q[2 * plane] * w;
  }
  return SoftmaxState{M, S, K};
}

// ---- kernel parameters (both backends) --------------------------------------------------------

struct PartialsParams {
  const void* state;        // kv_score_buffer (TS), read only
  const void* input;        // this rank's kv_score rows (TI)
  const int32_t* input_rows;  // [num_batch_rows]: local row of each ragged row of the batch
  const void* ape;          // [win, hd], ape_type
  const uint8_t* plan_c;    // CompressPlan [num_windows]
  const uint8_t* plan_w;    // WritePlan [num_persist]
  float* partials;          // [3, num_windows, hd]: m | s | k
  void* persist;            // [num_persist, row] (TI): the plan_w rows this rank holds, else 0
  int64_t num_state_rows;
  int64_t num_local_rows;
  int64_t num_batch_rows;
  int64_t num_windows;
  int64_t num_persist;
  int32_t hd;
  int32_t cr;
  int32_t ape_type;
  int32_t read_state;
};

struct MergeParams {
  const float* partials;  // [R, 3, num_windows, hd]
  const float* max_m;     // [num_windows, hd] or nullptr
  void* out;              // rows [num_windows, hd] (out_type) or a partial [3, num_windows, hd]
  int64_t num_elems;      // num_windows * hd
  int32_t ranks;
  int32_t out_partial;    // 1: out is a partial (M | S | K)
  int32_t out_type;       // compress::kOutF32 / kOutBF16 (rows)
};

// Local input row of the row a WritePlan record persists, or -1: an invalid record, a ragged
// row past the batch, or a row another rank holds.
DSV4_HD int64_t persist_source(const WritePlan& w, const PartialsParams& p) {
  if (!is_valid(w) || int64_t(w.ragged_id) >= p.num_batch_rows) return -1;
  const int32_t local = p.input_rows[w.ragged_id];
  return local >= 0 && local < p.num_local_rows ? int64_t(local) : -1;
}

// Element i of a merge: the merged partial, or the normalised row value.
DSV4_HD void merge_element(const MergeParams& p, int64_t i) {
  const int64_t n = p.num_elems;
  const float floor = p.max_m != nullptr ? p.max_m[i] : -INFINITY;
  const SoftmaxState st = merge_partials(p.partials + i, 3 * n, n, p.ranks, floor);
  if (p.out_partial) {
    float* o = static_cast<float*>(p.out);
    o[i] = st.m;
    o[n + i] = st.s;
    o[2 * n + i] = st.a;
  } else {
    compress::store_out(p.out, p.out_type, i, compress::softmax_value(st));
  }
}

}  // namespace cp
}  // namespace dsv4
