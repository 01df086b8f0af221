// Decode-context-parallel (DCP) ownership of compressed cache entries (docs/contract.md,
// "DCP stores"): torch-free, shared by the CPU kernels, the GPU kernels and the checks.
//
// Compressed entry g (a global cache slot, as in out_loc) belongs to rank (g / I) % W and lives
// at that rank's local slot (g / (I * W)) * I + g % I. I = 1 is the reference engine's
// round-robin (owner g % W, local g / W); W = 1 maps every g to itself.
#pragma once

#include "portability.h"

namespace dsv4 {

struct Dcp {
  int64_t world_size = 1;  // W >= 1
  int64_t rank = 0;        // 0 <= rank < W
  int64_t interleave = 1;  // I >= 1
};

DSV4_HD bool dcp_is_identity(const Dcp& d) { return d.world_size == 1; }

// The local slot of global entry g (g >= 0) on this rank, or -1 when another rank owns it.
// Unsigned, two divisions (the remainders by multiply-subtract): on the GPU half the machine
// code of the signed division and modulo pairs (docs/design/dcp_store.md).
DSV4_HD int64_t dcp_local_slot(const Dcp& d, int64_t g) {
  if (d.world_size == 1) return g;
  const uint64_t u = uint64_t(g), i = uint64_t(d.interleave), w = uint64_t(d.world_size);
  const uint64_t block = u / i;
  const uint64_t round = block / w;
  if (block - round * w != uint64_t(d.rank)) return -1;
  return int64_t(round * i + (u - block * i));
}

}  // namespace dsv4
