// compress_forward GPU launch shapes (CUDA and HIP from the same source; docs/contract.md 3.4,
// 3.5): block sizes, the modes of the c128 pooling step, and the host functions that turn a
// pass's record count into records per block and a grid. The launching glue
// (csrc/compress/compress_cuda.cu) and the kernels read the same constants, so a grid always
// matches the block's loop. Torch-free; the kernel parameters themselves (Params) live in
// compress_math.h, shared with the CPU kernel.
#pragma once

#include "../compress_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

constexpr int kBlock = 256;  // online decode and row writes
constexpr int kWriteGroups = kBlock / kLaneGroup;  // row writes: records in flight per block
// Online decode: batch entries of one kBlock-thread block (hd / kVec threads each).
DSV4_HD int online_decode_per_block(int hd) { return kBlock / (hd / kVec); }

// What a c128 record pools into: an offline prefill window, a decode window, an online segment.
enum : int { kModePrefill = 0, kModeDecode = 1, kModeOnline = 2 };

constexpr int kC4Block = 128;                               // c4_kernel threads per block
constexpr int kC4MaxTurns = 32;  // c4 prefill: most record groups a block takes in turn
constexpr int kC128Ch = 64;                                 // c128 channels per block
constexpr int kC128Vec = 2;                                 // channels per c128 thread
constexpr int kC128Lanes = kC128Ch / kC128Vec;              // 32 threads across those channels
constexpr int kC128Rows = 8;                                // window rows per thread
constexpr int kC128RowGroups = 128 / kC128Rows;             // 16 partial states per channel
constexpr int kC128Block = kC128Lanes * kC128RowGroups;     // 512
constexpr int kC128MaxRecords = 512;  // c128: most records one block takes (shared memory)

// Resident blocks per multiprocessor the pooling kernels are compiled for (register budget):
// tuning knobs, measured on the H200 (benchmarks/bench_compress.py).
#ifndef DSV4_C4_MIN_BLOCKS
#define DSV4_C4_MIN_BLOCKS 4
#endif
#ifndef DSV4_C128_MIN_BLOCKS
#define DSV4_C128_MIN_BLOCKS 2
#endif

#if defined(DSV4_HIP)
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define DSV4_COMPRESS_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

// Grid of a prefill / online pooling launch whose blocks take their units (c128: records; c4:
// a block's group of records) in turn, strided by the grid. A padded (CUDA-graph,
// device-length) plan has num_q records, most of them invalid, and one block per unit (262144
// c128 blocks for 8 x 4096 tokens) spends a block launch and a plan-read round trip on each.
// Up to 16 waves of `wave` resident blocks, every unit has its own block(s); past that the
// grid is 8 waves (each unit spans blocks_per_unit blocks), and at least units / max_per_block
// unit groups. A trimmed plan of that size (a very large prefill) then pools its units in
// turn instead of in waves. Returns the number of unit groups (the stride).
inline int64_t strided_unit_groups(int64_t units, int64_t blocks_per_unit, int64_t wave,
                                   int64_t max_per_block) {
  if (units * blocks_per_unit <= 16 * wave) return units;
  const int64_t groups = (8 * wave + blocks_per_unit - 1) / blocks_per_unit;
  const int64_t floor_groups = (units + max_per_block - 1) / max_per_block;
  return groups > floor_groups ? groups : floor_groups;
}

// c4 prefill: resident blocks (DSV4_C4_MIN_BLOCKS per SM) taking their groups of
// kC4Block / (hd / kVec) records in turn.
inline int64_t c4_prefill_blocks(int64_t records, int hd, int64_t sms) {
  const int64_t per_group = kC4Block / (hd / kVec);
  return strided_unit_groups((records + per_group - 1) / per_group, 1, DSV4_C4_MIN_BLOCKS * sms,
                             kC4MaxTurns);
}

// Blocks of kBlock threads for one 32-lane group per record, grid-stride past max_blocks
// (2048: the offline prefill row writes; the fused cr 128 prefill's store, write_store_blocks).
inline int64_t lane_group_blocks(int64_t records, int64_t max_blocks = 2048) {
  const int64_t blocks = (records + kWriteGroups - 1) / kWriteGroups;
  return blocks < max_blocks ? blocks : max_blocks;
}

// c128 prefill / online (Params::records_per_block): a block of several records reads all
// their plan records at once into shared memory, writes the zeros of the invalid ones and
// pools the valid ones. Resident blocks: two 512-thread blocks per SM (DSV4_C128_MIN_BLOCKS).
inline int c128_records_per_block(int64_t records, int hd, int64_t sms) {
  const int64_t groups = strided_unit_groups(records, hd / kC128Ch, 2 * sms, kC128MaxRecords);
  return groups > 0 ? int((records + groups - 1) / groups) : 1;
}
inline int64_t c128_record_blocks(int64_t records, int hd, int records_per_block) {
  return (records + records_per_block - 1) / records_per_block * (hd / kC128Ch);
}

// c128 decode (Params::records_per_block, see c128_decode.cuh). Below four waves of blocks (two
// resident per SM), a block per request and 64-channel slice. From there, one wave: a block per
// slice and group of requests, which copies its slice of its requests' rows and pools its share
// of the step's closing requests. A decode step closes no window for most requests (a request
// closes one in 128 steps), and a block per request and slice then spends a block's round trip
// on each. Exactly slots / slices groups: fewer would leave multiprocessor slots idle in a step
// where every request closes. Below four waves the groups would hold 3 or fewer requests, and a
// step that closes many windows then pays for the rounding of its pools to whole rounds. In a
// step where every request closes, the fixed shares leave the blocks on slower multiprocessors
// last; claiming the last rounds' pools by compare-and-swap, so that finished blocks take over,
// measured slower (docs/design/c128_pooling.md).
inline int64_t c128_decode_groups(int64_t events, int hd, int64_t sms) {
  const int64_t slices = hd / kC128Ch, slots = DSV4_C128_MIN_BLOCKS * (sms > 0 ? sms : 1);
  if (events * slices < 4 * slots || events >= (int64_t(1) << 31))
    return 0;  // 0: a block per request and slice
  const int64_t groups = slots / slices > 0 ? slots / slices : 1,
                floor_groups = (events + kC128MaxRecords - 1) / kC128MaxRecords;
  const int64_t n = groups > floor_groups ? groups : floor_groups;
  return n < events ? n : 0;  // (several requests per grouped block)
}
// Records per block and grid of a decode launch with `groups` = c128_decode_groups(...).
inline int c128_decode_records_per_block(int64_t events, int64_t groups) {
  return groups > 0 ? int((events + groups - 1) / groups) : 1;
}
inline int64_t c128_decode_blocks(int64_t events, int hd, int64_t groups) {
  return (groups > 0 ? groups : events) * (hd / kC128Ch);
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
