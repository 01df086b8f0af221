// Plan records (docs/contract.md 3.1): packed, little-endian, fixed-size structs that the
// planners write and every kernel reads. Plan tensors are uint8 [N, sizeof(record)].
#pragma once

#include "portability.h"

namespace dsv4 {

// One per batch entry of a decode step.
struct alignas(16) DecodePlan {
  uint32_t seq_len;     // length including the new token
  int32_t write_loc;    // state slot receiving the new token's row (-1: none)
  int32_t read_page_0;  // page of position max(seq_len-1-cr, 0) (online: the state slot)
  int32_t read_page_1;  // page of position seq_len-1 (online: -1)
};

// One per compress event of a prefill/extend (online: one per segment, in both lists).
struct alignas(16) CompressPlan {
  uint32_t seq_len;     // pos+1 of the closing token; 0xFFFFFFFF marks an invalid record
  uint16_t ragged_id;   // row of the closing token in the ragged input
  uint16_t buffer_len;  // leading window rows that come from the state buffer
  int32_t read_page_0;
  int32_t read_page_1;
};

// One per token whose raw row is persisted into the state buffer.
struct alignas(8) WritePlan {
  uint32_t ragged_id;  // 0xFFFFFFFF marks an invalid record
  int32_t write_loc;
};

static_assert(sizeof(DecodePlan) == 16, "DecodePlan is 16 bytes");
static_assert(sizeof(CompressPlan) == 16, "CompressPlan is 16 bytes");
static_assert(sizeof(WritePlan) == 8, "WritePlan is 8 bytes");

constexpr uint32_t kInvalidSeqLen = 0xFFFFFFFFu;
constexpr uint32_t kInvalidRaggedId = 0xFFFFFFFFu;

DSV4_HD CompressPlan invalid_compress_plan() { return CompressPlan{kInvalidSeqLen, 0, 0, -1, -1}; }
DSV4_HD WritePlan invalid_write_plan() { return WritePlan{kInvalidRaggedId, -1}; }
DSV4_HD bool is_valid(const CompressPlan& p) { return p.seq_len != kInvalidSeqLen; }
DSV4_HD bool is_valid(const WritePlan& p) { return p.ragged_id != kInvalidRaggedId; }

// Limits that keep ragged_id and the batch index inside 16 bits (contract 3.3).
constexpr int64_t kMaxQueryTokens = 65536;
constexpr int64_t kMaxBatch = 65535;

// Window length of one compressed token: 8 rows for the overlapping cr = 4, 128 for cr = 128.
DSV4_HD int window_of(int compress_ratio) { return compress_ratio == 4 ? 8 : 128; }

// State-slot addressing (contract 2.1).
enum class Addressing : int32_t {
  // slot = (swa / sps) * ring + swa % ring, swa = full_to_state[req_to_token[rid, pos]]
  kSwaPaged = 0,
  kReqRing = 1,   // slot = rid * ring + pos % ring
  kLegacy = 2,    // request ring of one window (ring = window), pages always real
  kOnline = 3,    // one running-state slot per request: rid + state_slot_offset
};

}  // namespace dsv4
