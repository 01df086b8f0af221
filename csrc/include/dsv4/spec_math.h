// Speculative decoding with the online cr = 128 state (docs/contract.md 10): staging the state
// after each verify token, marking the pending verify lengths, committing the accepted prefix.
// Torch-free, shared by the CPU kernel and the GPU kernels.
//
// A staged state is exactly the row an online decode of the same tokens stores (contract 3.5,
// compress_math.h: from_online, softmax_fold<1>, to_online, rounded to the state dtype after
// every token), so verify-then-commit leaves the committed slot bit for bit as token-by-token
// decode on the same backend leaves it.
#pragma once

#include <stdint.h>

#include "compress_math.h"

namespace dsv4 {
namespace spec {

// Element type of an index tensor (seq_lens, req_pool_indices): int32 or int64.
enum IndexType : int32_t { kIdx32 = 0, kIdx64 = 1 };

DSV4_HD int64_t load_index(const void* p, int32_t type, int64_t i) {
  return type == kIdx64 ? static_cast<const int64_t*>(p)[i]
                        : int64_t(static_cast<const int32_t*>(p)[i]);
}

// The chunk length of the online state.
constexpr int64_t kChunk = 128;

struct WritePrefixParams {
  const void* input;     // kv_score_input [>= B*D, 2*hd] (kv | score), row b*D + step
  const void* seq_lens;  // [>= B] committed length before the verify tokens
  const void* req;       // [>= B] request row = main state slot
  const void* ape;       // [128, hd], ape_type
  void* state;           // [num_state_rows, 3*hd] m | S | K
  int64_t num_state_rows;
  int64_t in_row_stride;  // elements between kv_score_input rows
  int64_t batch;          // B
  int64_t verify;         // D
  int64_t slot_stride;    // bank stride: token step's state goes to req + (step+1)*slot_stride
  int32_t hd;
  int32_t seq_type;
  int32_t req_type;
  int32_t ape_type;
};

struct MarkPendingParams {
  const void* seq_lens;
  const void* req;
  int64_t* pending;  // [>= num_req_slots]
  int64_t batch;
  int64_t num_req_slots;
  int32_t seq_type;
  int32_t req_type;
};

struct CommitPendingParams {
  const void* seq_lens;  // [>= B] committed length now
  const void* req;
  const int64_t* pending;
  void* state;
  int64_t num_state_rows;
  int64_t row_bytes;  // 3*hd * element size
  int64_t batch;
  int64_t verify;
  int64_t slot_stride;
  int64_t num_req_slots;
  int32_t seq_type;
  int32_t req_type;
};

// ---- write_prefix_states ----------------------------------------------------------------------

// Batch entry b of a staging call: its main slot and committed length, or active == false when
// it stages nothing (a request row outside the state, a negative length).
struct StageEntry {
  bool active;
  int64_t slot;
  int64_t seq;
};

DSV4_HD StageEntry stage_entry(const WritePrefixParams& p, int64_t b) {
  StageEntry e;
  e.slot = load_index(p.req, p.req_type, b);
  e.seq = load_index(p.seq_lens, p.seq_type, b);
  e.active = e.slot >= 0 && e.slot < p.num_state_rows && e.seq >= 0;
  return e;
}

// Slot of the state after verify token `step` (0-based), or -1 where that token closes its
// chunk (nothing is staged: the next token restarts) or the slot lies outside the state.
DSV4_HD int64_t staged_slot(const WritePrefixParams& p, const StageEntry& e, int64_t step) {
  if ((e.seq + step + 1) % kChunk == 0) return -1;
  const int64_t s = e.slot + (step + 1) * p.slot_stride;
  return s < p.num_state_rows ? s : -1;
}

// Channel c of entry b: the D verify tokens folded one at a time into the committed state, as
// online decode does, the state after each token stored in its bank. Split into the start
// state, the token's inputs and the fold, so that a GPU thread can issue the loads of several
// tokens before it folds them; stage_channel is the whole sequence.
template <typename TS>
DSV4_HD compress::SoftmaxState stage_start(const WritePrefixParams& p, const StageEntry& e,
                                           int c) {
  if (e.seq % kChunk == 0) return compress::softmax_empty();
  const int64_t hd = p.hd;
  const TS* r = static_cast<const TS*>(p.state) + e.slot * 3 * hd;
  return compress::from_online(load_as_f32(r, c), load_as_f32(r, hd + c),
                               load_as_f32(r, 2 * hd + c));
}

// kv and logit (score + ape at the token's chunk offset) of verify token `step`, channel c.
template <typename TI>
DSV4_HD void stage_input(const WritePrefixParams& p, const StageEntry& e, int64_t b,
                         int64_t step, int c, float& kv, float& z) {
  const int64_t hd = p.hd, q = (e.seq + step) % kChunk;
  const TI* x = static_cast<const TI*>(p.input) + (b * p.verify + step) * p.in_row_stride;
  kv = load_as_f32(x, c);
  z = load_as_f32(x, hd + c) + compress::load_ape(p.ape, p.ape_type, q * hd + c);
}

// Fold token `step` into s (restart at chunk offset 0) and stage the state after it.
template <typename TS>
DSV4_HD void stage_step(const WritePrefixParams& p, const StageEntry& e, int64_t step, int c,
                        float kv, float z, compress::SoftmaxState& s) {
  const int64_t hd = p.hd, q = (e.seq + step) % kChunk;
  if (q == 0) s = compress::softmax_empty();
  const float kvs[1] = {kv}, zs[1] = {z};
  const bool present[1] = {true};
  compress::softmax_fold<1>(s, zs, kvs, present);
  if (q == kChunk - 1) return;  // closes the chunk: no state; the next token restarts
  TS* st = static_cast<TS*>(p.state);
  const compress::OnlineRow o = compress::to_online(s);
  // The state as its dtype stores it: what the next decode step would read back.
  const float m = compress::round_to(st, o.m), S = compress::round_to(st, o.S),
              K = compress::round_to(st, o.K);
  const int64_t slot = staged_slot(p, e, step);
  if (slot >= 0) {
    TS* w = st + slot * 3 * hd;
    store_from_f32(w, c, m);
    store_from_f32(w, hd + c, S);
    store_from_f32(w, 2 * hd + c, K);
  }
  s = compress::from_online(m, S, K);
}

template <typename TS, typename TI>
DSV4_HD void stage_channel(const WritePrefixParams& p, const StageEntry& e, int64_t b, int c) {
  compress::SoftmaxState s = stage_start<TS>(p, e, c);
  for (int64_t step = 0; step < p.verify; ++step) {
    float kv, z;
    stage_input<TI>(p, e, b, step, c, kv, z);
    stage_step<TS>(p, e, step, c, kv, z, s);
  }
}

// ---- mark_pending -----------------------------------------------------------------------------

// The request row whose pending length entry b records, or -1 (outside [0, num_req_slots)).
DSV4_HD int64_t pending_row(const MarkPendingParams& p, int64_t b) {
  const int64_t r = load_index(p.req, p.req_type, b);
  return r >= 0 && r < p.num_req_slots ? r : -1;
}

// ---- commit_pending ---------------------------------------------------------------------------

// Accepted verify tokens of entry b and the bank to copy into its main slot: src < 0 when
// nothing is committed (no pending verify, nothing accepted, a committed length on a chunk
// boundary, a slot outside the state).
struct CommitMove {
  int64_t src;
  int64_t dst;
};

DSV4_HD CommitMove commit_move(const CommitPendingParams& p, int64_t b) {
  CommitMove m{-1, -1};
  const int64_t req = load_index(p.req, p.req_type, b);
  if (req < 0 || req >= p.num_req_slots) return m;
  const int64_t old_seq = p.pending[req];
  if (old_seq < 0) return m;
  const int64_t delta = load_index(p.seq_lens, p.seq_type, b) - old_seq;
  const int64_t accept = delta < 0 ? 0 : (delta < p.verify ? delta : p.verify);
  if (accept <= 0 || (old_seq + accept) % kChunk == 0) return m;
  const int64_t src = req + accept * p.slot_stride;
  if (req >= p.num_state_rows || src >= p.num_state_rows) return m;
  m.src = src;
  m.dst = req;
  return m;
}

}  // namespace spec
}  // namespace dsv4
