// Argument checks shared by the CPU and CUDA glue. Every message names the op and the
// argument, so a bad call reads "dsv4.compress_forward: kv_score_buffer must ...".
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

#include "include/dsv4/dcp.h"

namespace dsv4 {

#define DSV4_CHECK(cond, op, arg, ...) \
  TORCH_CHECK((cond), "dsv4.", op, ": ", arg, " ", __VA_ARGS__)

inline std::string dtype_list(std::initializer_list<at::ScalarType> dts) {
  std::string s;
  for (auto d : dts) s += (s.empty() ? "" : "/") + std::string(c10::toString(d));
  return s;
}

inline void check_dtype(const at::Tensor& t, const char* op, const char* arg,
                        std::initializer_list<at::ScalarType> allowed) {
  bool ok = false;
  for (auto d : allowed) ok = ok || t.scalar_type() == d;
  DSV4_CHECK(ok, op, arg, "must have dtype ", dtype_list(allowed), ", got ", t.scalar_type());
}

inline void check_dim(const at::Tensor& t, const char* op, const char* arg, int64_t dim) {
  DSV4_CHECK(t.dim() == dim, op, arg, "must be ", dim, "-D, got shape ", t.sizes());
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* arg) {
  DSV4_CHECK(t.is_contiguous(), op, arg, "must be contiguous (got strides ", t.strides(), ")");
}

// A 2-D tensor of rows, each contiguous, any stride apart that keeps them from overlapping (a
// column slice of a wider tensor, or a padded row pitch).
inline void check_strided_rows(const at::Tensor& t, const char* op, const char* arg) {
  DSV4_CHECK(t.size(1) <= 1 || t.stride(1) == 1, op, arg,
             "must have contiguous rows (column stride 1), got strides ", t.strides());
  DSV4_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), op, arg,
             "must have a row stride of at least its row width ", t.size(1),
             " (rows must not overlap), got strides ", t.strides());
}

// Elements from one row of such a tensor to the next (a single row: its width).
inline int64_t row_stride_of(const at::Tensor& t) {
  return t.size(0) > 1 ? t.stride(0) : t.size(1);
}

inline void check_device(const at::Tensor& t, const at::Device& dev, const char* op,
                         const char* arg) {
  DSV4_CHECK(t.device() == dev, op, arg, "must be on ", dev, ", got ", t.device());
}

// The ops have no autograd formula: a tensor that would need a gradient is an error rather than
// a silently detached result (parameters under torch.no_grad / inference_mode are fine).
inline void check_no_grad(const at::Tensor& t, const char* op, const char* arg) {
  DSV4_CHECK(!(t.requires_grad() && c10::GradMode::is_enabled()), op, arg,
             "requires grad, but dsv4 ops have no autograd (no backward): call them under "
             "torch.no_grad() or torch.inference_mode(), or pass a detached tensor");
}

// A tensor the op writes must not share memory with another argument (host pointer arithmetic,
// both contiguous).
inline void check_no_overlap(const at::Tensor& written, const char* written_arg,
                             const at::Tensor& other, const char* other_arg, const char* op) {
  const at::MemOverlapStatus s = at::get_overlap_status(written, other);
  DSV4_CHECK(s != at::MemOverlapStatus::Full && s != at::MemOverlapStatus::Partial, op,
             written_arg, "must not share memory with ", other_arg);
}

// The same where `other` is a 2-D tensor of strided rows (check_strided_rows): only its rows'
// bytes count, not the gaps between them. `written` is contiguous.
inline void check_no_overlap_rows(const at::Tensor& written, const char* written_arg,
                                  const at::Tensor& rows, const char* rows_arg, const char* op) {
  if (written.numel() == 0 || rows.numel() == 0) return;
  const int64_t a0 = int64_t(reinterpret_cast<uintptr_t>(written.data_ptr()));
  const int64_t a1 = a0 + written.numel() * int64_t(written.element_size());
  const int64_t r0 = int64_t(reinterpret_cast<uintptr_t>(rows.data_ptr()));
  const int64_t len = rows.size(1) * int64_t(rows.element_size());
  const int64_t pitch = row_stride_of(rows) * int64_t(rows.element_size());
  // Rows lie at rising addresses: the first one that ends after a0 overlaps [a0, a1) iff it
  // starts before a1.
  const int64_t i = a0 - r0 - len < 0 ? 0 : (a0 - r0 - len) / pitch + 1;
  DSV4_CHECK(!(i < rows.size(0) && r0 + i * pitch < a1), op, written_arg,
             "must not share memory with ", rows_arg);
}

inline void check_ratio(int64_t cr, const char* op) {
  DSV4_CHECK(cr == 4 || cr == 128, op, "compress_ratio", "must be 4 or 128, got ", cr);
}

inline void check_plan_tensor(const at::Tensor& t, const char* op, const char* arg,
                              int64_t record_bytes) {
  check_dtype(t, op, arg, {at::kByte});
  check_dim(t, op, arg, 2);
  DSV4_CHECK(t.size(1) == record_bytes, op, arg, "must have ", record_bytes,
             " bytes per record, got shape ", t.sizes());
  check_contiguous(t, op, arg);
}

// The decode-context-parallel arguments of a store (dcp.h): W >= 1, 0 <= rank < W, I >= 1.
inline const Dcp& check_dcp(const Dcp& d, const char* op) {
  DSV4_CHECK(d.world_size >= 1, op, "dcp_world_size", "must be >= 1, got ", d.world_size);
  DSV4_CHECK(d.rank >= 0 && d.rank < d.world_size, op, "dcp_rank",
             "must be in [0, dcp_world_size = ", d.world_size, "), got ", d.rank);
  DSV4_CHECK(d.interleave >= 1, op, "dcp_interleave", "must be >= 1, got ", d.interleave);
  return d;
}

}  // namespace dsv4
