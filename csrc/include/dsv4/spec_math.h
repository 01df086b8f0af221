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
  int32_t q0;  // chunk offset of the first verify token (seq % 128)
};

DSV4_HD StageEntry stage_entry(const WritePrefixParams& p, int64_t b) {
  StageEntry e;
  e.slot = load_index(p.req, p.req_type, b);
  e.seq = load_index(p.seq_lens, p.seq_type, b);
  e.active = e.slot >= 0 && e.slot < p.num_state_rows && e.seq >= 0;
  e.q0 = int32_t(e.seq & (kChunk - 1));
  return e;
}

// Chunk offset of verify token `step` (position seq + step).
DSV4_HD int32_t stage_q(const StageEntry& e, int64_t step) {
  return int32_t((e.q0 + step) & (kChunk - 1));
}

// Whether the state after a verify token at chunk offset q is stored in its bank slot (`slot`:
// the entry's slot + (step + 1) * slot_stride, step 0-based): not where the token closes its
// chunk (nothing is staged: the next token restarts), nor past the state.
DSV4_HD bool stages_at(const WritePrefixParams& p, int32_t q, int64_t slot) {
  return q != kChunk - 1 && slot < p.num_state_rows;
}

// Channel c of entry b: the D verify tokens folded one at a time into the committed state, as
// online decode does, the state after each token stored in its bank. Split into the start
// state, the token's inputs and the fold (stage_fold), so that a GPU thread can issue the loads
// of several tokens and channels before it folds them; stage_channel is the whole sequence.
template <typename TS>
DSV4_HD compress::SoftmaxState stage_start(const WritePrefixParams& p, const StageEntry& e,
                                           int c) {
  if (e.q0 == 0) return compress::softmax_empty();
  const int64_t hd = p.hd;
  const TS* r = static_cast<const TS*>(p.state) + e.slot * 3 * hd;
  return compress::from_online(load_as_f32(r, c), load_as_f32(r, hd + c),
                               load_as_f32(r, 2 * hd + c));
}

// kv and logit (score + ape at the token's chunk offset) of verify token `step`, channel c.
template <typename TI>
DSV4_HD void stage_input(const WritePrefixParams& p, const StageEntry& e, int64_t b,
                         int64_t step, int c, float& kv, float& z) {
  const int64_t hd = p.hd, q = stage_q(e, step);
  const TI* x = static_cast<const TI*>(p.input) + (b * p.verify + step) * p.in_row_stride;
  kv = load_as_f32(x, c);
  z = load_as_f32(x, hd + c) + compress::load_ape(p.ape, p.ape_type, q * hd + c);
}

// Fold the token at chunk offset q (kv, logit z) into s as online decode does (q == 0:
// restart): `row` is the state after it as its dtype TS stores it, s the state the next
// decode step reads back (after a token that closes its chunk neither is used: the next token
// restarts). Branch-free, so that a GPU thread's tokens fold back to back.
template <typename TS>
DSV4_HD void stage_fold(compress::SoftmaxState& s, int32_t q, float kv, float z,
                        compress::OnlineRow& row) {
  if (q == 0) s = compress::softmax_empty();
  compress::online_fold_token(s, z, kv);
  s = compress::online_reload<TS>(s, row);
}

template <typename TS, typename TI>
DSV4_HD void stage_channel(const WritePrefixParams& p, const StageEntry& e, int64_t b, int c) {
  const int64_t hd = p.hd;
  compress::SoftmaxState s = stage_start<TS>(p, e, c);
  int64_t slot = e.slot;
  for (int64_t step = 0; step < p.verify; ++step) {
    float kv, z;
    stage_input<TI>(p, e, b, step, c, kv, z);
    const int32_t q = stage_q(e, step);
    compress::OnlineRow o;
    stage_fold<TS>(s, q, kv, z, o);
    slot += p.slot_stride;
    if (!stages_at(p, q, slot)) continue;
    TS* w = static_cast<TS*>(p.state) + slot * 3 * hd;
    store_from_f32(w, c, o.m);
    store_from_f32(w, hd + c, o.S);
    store_from_f32(w, 2 * hd + c, o.K);
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
