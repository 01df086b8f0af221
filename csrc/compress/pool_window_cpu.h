// The CPU fold of one pooling window (docs/contract.md 1.2), shared by compress_forward
// (compress_cpu.cpp) and the context-parallel partials (cp/cp_cpu.cpp): one summation order for
// both, built from the per-value math of include/dsv4/compress_math.h.
#pragma once

#include <vector>

#include "include/dsv4/compress_math.h"

namespace dsv4 {
namespace compress {

// cr = 128 windows fold as kC128Groups groups of kC128GroupRows rows, each in chunks of kChunk
// rows per softmax rescale, merged in group order (cr = 4: one group of 8 rows).
constexpr int kChunk = 4;
constexpr int kC128Groups = 8;
constexpr int kC128GroupRows = 16;
static_assert(kC128Groups * kC128GroupRows == 128, "groups tile the 128-row window");
static_assert(kC128GroupRows % kChunk == 0 && 8 % kChunk == 0, "chunks tile a group");
static_assert(kChunk == 4, "fold_window_rows skips a chunk of 4 rows that folds nothing");

// ape [win, hd] of any element type as fp32.
inline std::vector<float> ape_as_f32(const void* ape, int32_t ape_type, int cr, int hd) {
  const int64_t n = int64_t(window_of(cr)) * hd;
  std::vector<float> a(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[size_t(i)] = load_ape(ape, ape_type, i);
  return a;
}

// Fold the rows of one window into res[0..hd) (softmax states); scratch holds hd states.
// source(r) is the RowSource of window row r: kFromState (index: flat state row of st),
// kFromInput (index: row of in), kAbsent (folded as the GPU kernels fold an absent row, kv 0 and
// logit kAbsentScore + ape: weight 0 unless the ape entry is NaN or +inf, compress_math.h), or
// any other kind (not folded at all). st_row / in_row: elements from one state / input row to
// the next.
template <typename TS, typename TI, typename Source>
void fold_window_rows(const TS* st, int64_t st_row, const TI* in, int64_t in_row,
                      const float* ape, int cr, int hd, const Source& source, SoftmaxState* res,
                      SoftmaxState* scratch) {
  const int groups = cr == 4 ? 1 : kC128Groups;
  const int group_rows = cr == 4 ? 8 : kC128GroupRows;
  for (int g = 0; g < groups; ++g) {
    SoftmaxState* gs = g == 0 ? res : scratch;
    for (int ch = 0; ch < hd; ++ch) gs[ch] = softmax_empty();
    for (int r0 = g * group_rows; r0 < (g + 1) * group_rows; r0 += kChunk) {
      const TS* skv[kChunk];
      const TI* ikv[kChunk];
      int64_t soff[kChunk];
      int kind[kChunk];
      bool folded[kChunk];
      for (int u = 0; u < kChunk; ++u) {
        const int r = r0 + u;
        const RowSource s = source(r);
        kind[u] = s.kind;
        folded[u] = s.kind == kAbsent || s.kind == kFromState || s.kind == kFromInput;
        soff[u] = score_offset(cr, hd, r) - kv_offset(cr, hd, r);
        skv[u] = s.kind == kFromState ? st + s.index * st_row + kv_offset(cr, hd, r) : nullptr;
        ikv[u] = s.kind == kFromInput ? in + s.index * in_row + kv_offset(cr, hd, r) : nullptr;
      }
      if (!(folded[0] || folded[1] || folded[2] || folded[3])) continue;  // the identity
      for (int ch = 0; ch < hd; ++ch) {
        float z[kChunk], kv[kChunk];
        for (int u = 0; u < kChunk; ++u) {
          float k = 0.0f, sc = kAbsentScore;
          if (kind[u] == kFromState) {
            k = load_as_f32(skv[u], ch);
            sc = load_as_f32(skv[u], soff[u] + ch);
          } else if (kind[u] == kFromInput) {
            k = load_as_f32(ikv[u], ch);
            sc = load_as_f32(ikv[u], soff[u] + ch);
          }
          kv[u] = k;
          z[u] = sc + ape[size_t((r0 + u) * hd + ch)];
        }
        softmax_fold<kChunk>(gs[ch], z, kv, folded);
      }
    }
    if (g > 0)
      for (int ch = 0; ch < hd; ++ch) softmax_merge(res[ch], gs[ch]);
  }
}

}  // namespace compress
}  // namespace dsv4
