// The six paged cache layouts of the V4.1 caches (docs/contract.md, "V4.1 cache layouts"):
// torch-free byte geometry shared by the CPU kernels, the GPU kernels and the checks. The
// Python twin is dsv4_ops.layout.KVLayout; tests/test_layout_v41.py holds the two equal.
#pragma once

#include "portability.h"

namespace dsv4 {

// The enumerators carry the reference engine's numbers.
enum KvLayout : int {
  kLayoutV4 = 0,          // fp8_ds_mla: 448 e4m3 + 64 bf16 rope dims, 7 UE8M0 (+1 unused)
  kLayoutV41 = 1,         // 512 e4m3, one UE8M0 per 32 dims
  kLayoutV41Fp4 = 2,      // 512 e2m1 nibbles, one e4m3 scale per 16 dims
  kLayoutUniformFp8 = 3,  // 512 e4m3, unit scale, no scale bytes
  kLayoutV41New = 4,      // V41 codes, interleaved page
  kLayoutV41Fp4New = 5,   // V41_FP4 codes, interleaved page
};
constexpr int kNumKvLayouts = 6;

// The row encoding of a layout: the block-split layout of the same codes.
DSV4_HD constexpr int layout_encoding(int layout) {
  return layout == kLayoutV41New ? kLayoutV41 : layout == kLayoutV41Fp4New ? kLayoutV41Fp4 : layout;
}
DSV4_HD constexpr bool layout_interleaved(int layout) {
  return layout == kLayoutV41New || layout == kLayoutV41Fp4New;
}
// D: bytes of one token's data.
DSV4_HD constexpr int64_t layout_data_bytes(int layout) {
  return layout_encoding(layout) == kLayoutV4 ? 576 : layout_encoding(layout) == kLayoutV41Fp4 ? 256 : 512;
}
// S: bytes of one token's scale row (V4: 8, of which 7 are written).
DSV4_HD constexpr int64_t layout_scale_bytes(int layout) {
  return layout_encoding(layout) == kLayoutV4         ? 8
         : layout_encoding(layout) == kLayoutV41      ? 16
         : layout_encoding(layout) == kLayoutV41Fp4   ? 32
                                                      : 0;
}
// Dims that share one scale.
DSV4_HD constexpr int layout_tile(int layout) {
  return layout_encoding(layout) == kLayoutV4         ? 64
         : layout_encoding(layout) == kLayoutV41      ? 32
         : layout_encoding(layout) == kLayoutV41Fp4   ? 16
                                                      : 512;
}
DSV4_HD constexpr int64_t layout_token_bytes(int layout) {
  return layout_data_bytes(layout) + layout_scale_bytes(layout);
}
// Pages are padded to a multiple of this: the data row stride when block-split, the token
// stride (no padding) when interleaved.
DSV4_HD constexpr int64_t layout_page_align(int layout) {
  return layout_interleaved(layout) ? layout_token_bytes(layout) : layout_data_bytes(layout);
}
DSV4_HD constexpr int64_t layout_page_bytes(int layout, int64_t page_size) {
  return (page_size * layout_token_bytes(layout) + layout_page_align(layout) - 1) /
         layout_page_align(layout) * layout_page_align(layout);
}
// Where a page puts token `off`'s bytes: its data at off * data_stride, its scales at
// scale_base + off * scale_stride. The GPU kernels take it resolved on the host: two products
// a row instead of the layout's selects.
struct LayoutRowAddressing {
  int64_t data_stride;
  int64_t scale_base;
  int64_t scale_stride;
};
DSV4_HD constexpr LayoutRowAddressing layout_row_addressing(int layout, int64_t page_size) {
  return layout_interleaved(layout)
             ? LayoutRowAddressing{layout_token_bytes(layout), layout_data_bytes(layout),
                                   layout_token_bytes(layout)}
             : LayoutRowAddressing{layout_data_bytes(layout),
                                   page_size * layout_data_bytes(layout),
                                   layout_scale_bytes(layout)};
}
// Byte offsets inside a page of token `off`'s data and scales.
DSV4_HD constexpr int64_t layout_data_offset(int layout, int64_t off) {
  return off * layout_row_addressing(layout, 0).data_stride;
}
DSV4_HD constexpr int64_t layout_scale_offset(int layout, int64_t page_size, int64_t off) {
  const LayoutRowAddressing a = layout_row_addressing(layout, page_size);
  return a.scale_base + off * a.scale_stride;
}
// Whether the layout stores the fp4 fake-quantised row of a ratio-1/2 latent (the fp8-style
// layouts) rather than the rotated row itself (the fp4 layouts).
DSV4_HD constexpr bool layout_fake_quantises(int layout) {
  return layout_encoding(layout) != kLayoutV41Fp4;
}

}  // namespace dsv4
