// Receives from any rank (transport.h's irecv_any), kept the same way by every transport that
// takes them: unmatched ones wait in a FIFO threaded through the transport's own requests (their
// `any_next`; no allocation per receive), and the oldest is matched first to the peer whose next
// plain send/recv message no posted receive claims (MPI's order: the core posts no receive after
// one from any rank until it completes). Which peer has such a message is the transport's own
// question (a stashed header, a ring slot, a UCX probe); the order in which peers are asked is
// shared: in turn, starting after the last one matched, so a chatty rank starves none.
#pragma once

#include <cstdint>

#include "status.h"

namespace comm::transport {

class AnySourceFifo {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  bool empty() const { return head_ == kNone; }

  template <class Pool>
  void push(Pool& pool, uint32_t index) {
    pool[index].any_next = kNone;
    if (tail_ == kNone)
      head_ = index;
    else
      pool[tail_].any_next = index;
    tail_ = index;
  }

  template <class Pool>
  uint32_t pop(Pool& pool) {
    const uint32_t index = head_;
    head_ = pool[index].any_next;
    if (head_ == kNone) tail_ = kNone;
    return index;
  }

 private:
  uint32_t head_ = kNone, tail_ = kNone;
};

// The first of peers 0..n-1, not `self`, for which has_message(peer) holds, asked from *turn on;
// *turn moves past it. -1 when none has.
template <class HasMessage>
int next_peer_in_turn(int n, int self, int* turn, HasMessage has_message) {
  for (int k = 0; k < n; ++k) {
    const int peer = (*turn + k) % n;
    if (peer == self || !has_message(peer)) continue;
    *turn = (peer + 1) % n;
    return peer;
  }
  return -1;
}

// Matches the oldest receives from any rank while find() names a peer with a message for one
// (-1: none). The receive is then an ordinary one from that peer, numbered as its next message
// (next_seq[peer]), its source reported; start(index) posts it as irecv() would (checking the
// header it will take as irecv() checks it).
template <class Pool, class Find, class Start>
Status match_any_source(AnySourceFifo& fifo, Pool& pool, Find find, Start start) {
  while (!fifo.empty()) {
    const int found = find();
    if (found < 0) return Status::Ok();
    const uint32_t index = fifo.pop(pool);
    auto& r = pool[index];
    r.any = false;
    r.peer = found;
    r.tag.seq = r.next_seq[found];
    *r.source = found;
    COMM_RETURN_IF_ERROR(start(index));
  }
  return Status::Ok();
}

}  // namespace comm::transport
