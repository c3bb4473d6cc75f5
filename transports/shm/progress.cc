// Two-sided messages over shared memory: one single-producer ring per (sender, receiver),
// in the sender's segment. Small messages are copied in and out in fragments; large ones
// (from 64 KiB) are read once, by the receiver, straight from the sender's buffer
// (its arena mapping, or process_vm_readv) -- the sender's request ends when the receiver
// has consumed that slot. Matching is by posting order per peer, and every slot carries the
// OpTag: a receiver whose posted tag differs fails with INVALID_USAGE naming both calls.
#include <algorithm>
#include <cstring>

#include "common/arrivals.h"
#include "common/wire_check.h"
#include "shm/shm_transport_impl.h"

namespace comm::transport::shm {

ChannelHead* ShmTransport::channel_out(int i) const {
  return reinterpret_cast<ChannelHead*>(peers_[static_cast<size_t>(me_)].channels +
                                        static_cast<size_t>(i) * geometry_.control.channel_stride());
}

ChannelHead* ShmTransport::channel_in(int i) const {
  return reinterpret_cast<ChannelHead*>(peers_[static_cast<size_t>(i)].channels +
                                        static_cast<size_t>(me_) * geometry_.control.channel_stride());
}

SlotHeader* ShmTransport::slot_of(ChannelHead* ch, uint64_t n) const {
  return reinterpret_cast<SlotHeader*>(reinterpret_cast<char*>(ch) + sizeof(ChannelHead) +
                                       (n % kChannelSlots) * geometry_.control.slot_record());
}

// ---- requests --------------------------------------------------------------------------------

void ShmTransport::push(Queue& q, uint32_t index) {
  pool_[index].next = kNil;
  if (q.tail == kNil)
    q.head = index;
  else
    pool_[q.tail].next = index;
  q.tail = index;
}

uint32_t ShmTransport::pop(Queue& q) {
  const uint32_t index = q.head;
  q.head = pool_[index].next;
  if (q.head == kNil) q.tail = kNil;
  return index;
}

Status ShmTransport::post_request(const Post& call, RequestId* id) {
  COMM_RETURN_IF_ERROR(usable());
  const auto [is_send, peer, tag, buf, bytes] = call;
  const int i = local_of(peer);
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = is_send;
  r.done = false;
  r.peer = i;
  r.tag = tag;
  r.buf = buf;
  r.bytes = bytes;
  r.moved = 0;
  r.until_tail = 0;
  r.awaited = false;
  r.any = false;
  ++active_;
  Peer& p = peers_[static_cast<size_t>(i)];
  if (is_send) {
    const bool idle = p.sends.empty();
    push(p.sends, index);
    if (idle) send_progress(i);  // eager: small messages leave before wait()
    return Status::Ok();
  }
  push(p.recvs, index);
  bool moved = false;
  Status st = recv_progress(i, &moved);  // it may be waiting already
  return st.ok() ? st : fail(st);
}

Status ShmTransport::post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                             RequestId* id) {
  COMM_RETURN_IF_ERROR(usable());
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = false;
  r.done = false;
  r.peer = -1;
  r.tag = tag;
  r.buf = static_cast<char*>(buf);
  r.bytes = bytes;
  r.moved = 0;
  r.until_tail = 0;
  r.awaited = false;
  r.any = true;
  r.source = source;
  r.next_seq = next_seq;
  ++active_;
  push(any_recvs_, index);
  bool moved = false;
  Status st = match_any(&moved);  // a message may be waiting already
  return st.ok() ? st : fail(st);
}

// A message at the head of channel i belongs to the oldest receive posted for i; only when
// there is none may a receive from any rank take it (the core posts no receive after one from
// any rank until it completes, so this is MPI's order). Peers are looked at in turn, starting
// after the last one matched, so a chatty rank does not starve the others.
int ShmTransport::find_any() {
  return next_peer_in_turn(static_cast<int>(peers_.size()), me_, &any_turn_, [this](int i) {
    if (!peers_[static_cast<size_t>(i)].recvs.empty()) return false;
    ChannelHead* ch = channel_in(i);
    const uint64_t tail = ch->tail.value.load(std::memory_order_relaxed);  // ours alone
    return tail < ch->head.value.load(std::memory_order_acquire) &&
           op_tag(slot_of(ch, tail)->tag).coll == CollKind::kSendRecv;  // never a collective's
  });
}

Status ShmTransport::probe_any(int* source) {
  COMM_RETURN_IF_ERROR(usable());
  if (source == nullptr) return InvalidArgument("shm transport: null source pointer for a probe");
  bool moved = false;
  Status st = progress(&moved);
  if (!st.ok()) return fail(st);
  const int i = find_any();
  *source = i < 0 ? -1 : peers_[static_cast<size_t>(i)].rank;
  return Status::Ok();
}

Status ShmTransport::match_any(bool* moved) {
  while (!any_recvs_.empty()) {
    const int found = find_any();
    if (found < 0) return Status::Ok();
    const uint32_t index = pop(any_recvs_);
    Request& r = pool_[index];
    const int source = peers_[static_cast<size_t>(found)].rank;
    r.peer = found;
    r.any = false;
    r.tag.seq = r.next_seq[source];
    *r.source = source;
    push(peers_[static_cast<size_t>(found)].recvs, index);
    COMM_RETURN_IF_ERROR(recv_progress(found, moved));  // checks the tag as irecv() does
  }
  return Status::Ok();
}

// ---- moving bytes ----------------------------------------------------------------------------

Status ShmTransport::progress(bool* moved) {
  if (active_ == 0) return Status::Ok();
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i == me_) continue;
    Peer& p = peers_[static_cast<size_t>(i)];
    if (!p.sends.empty() && send_progress(i)) *moved = true;
    if (!p.acks.empty() && ack_progress(i)) *moved = true;
    if (!p.recvs.empty()) COMM_RETURN_IF_ERROR(recv_progress(i, moved));
  }
  if (!any_recvs_.empty()) COMM_RETURN_IF_ERROR(match_any(moved));
  return Status::Ok();
}

bool ShmTransport::send_progress(int i) {
  Peer& p = peers_[static_cast<size_t>(i)];
  ChannelHead* ch = channel_out(i);
  uint64_t head = ch->head.value.load(std::memory_order_relaxed);
  uint64_t tail = ch->tail.value.load(std::memory_order_acquire);
  const size_t frag = geometry_.control.fragment_bytes;
  bool moved = false;
  while (!p.sends.empty()) {
    if (head - tail >= kChannelSlots) {
      tail = ch->tail.value.load(std::memory_order_acquire);
      if (head - tail >= kChannelSlots) break;
    }
    const uint32_t index = p.sends.head;
    Request& r = pool_[index];
    SlotHeader* sh = slot_of(ch, head);
    sh->tag = wire_tag(r.tag);
    sh->total_bytes = r.bytes;
    sh->reach = static_cast<uint32_t>(Reach::kNone);
    uint64_t offset = 0;
    if (r.moved == 0 && r.bytes >= geometry_.zero_copy_min) {
      if (domain_->locate(r.buf, r.bytes, &offset)) {
        sh->reach = static_cast<uint32_t>(Reach::kArena);
        sh->where = offset;
      } else if (cma()) {
        sh->reach = static_cast<uint32_t>(Reach::kCma);
        sh->where = reinterpret_cast<uint64_t>(r.buf);
      }
    }
    if (sh->reach != static_cast<uint32_t>(Reach::kNone)) {
      sh->offset = 0;
      sh->length = 0;
      ch->head.value.store(++head, std::memory_order_release);
      r.until_tail = head;
      pop(p.sends);
      push(p.acks, index);
    } else {
      const size_t len = std::min(frag, r.bytes - r.moved);
      if (len > 0) std::memcpy(sh + 1, r.buf + r.moved, len);
      sh->offset = r.moved;
      sh->length = len;
      r.moved += len;
      ch->head.value.store(++head, std::memory_order_release);
      if (r.moved == r.bytes) {
        r.done = true;
        moved_bytes(p.rank, true, r.bytes);
        pop(p.sends);
      }
    }
    moved = true;
  }
  if (moved) ring(i);
  return moved;
}

bool ShmTransport::ack_progress(int i) {
  Peer& p = peers_[static_cast<size_t>(i)];
  const uint64_t tail = channel_out(i)->tail.value.load(std::memory_order_acquire);
  bool moved = false;
  while (!p.acks.empty() && pool_[p.acks.head].until_tail <= tail) {
    Request& r = pool_[pop(p.acks)];
    r.done = true;
    moved_bytes(p.rank, true, r.bytes);
    moved = true;
  }
  return moved;
}

Status ShmTransport::recv_progress(int i, bool* moved) {
  Peer& p = peers_[static_cast<size_t>(i)];
  ChannelHead* ch = channel_in(i);
  uint64_t tail = ch->tail.value.load(std::memory_order_relaxed);  // ours alone
  const uint64_t head = ch->head.value.load(std::memory_order_acquire);
  const size_t frag = geometry_.control.fragment_bytes;
  auto us = [&] { return "rank " + std::to_string(rank()) + " (this rank)"; };  // error messages only
  bool any = false;
  while (!p.recvs.empty() && tail < head) {
    Request& r = pool_[p.recvs.head];
    const SlotHeader* sh = slot_of(ch, tail);
    const OpTag got = op_tag(sh->tag);
    if (!(got == r.tag))
      return fail(call_mismatch(who(i), got, us(), r.tag));
    if (sh->total_bytes != r.bytes)
      return fail(InvalidUsage(who(i) + " sent " + std::to_string(sh->total_bytes) + " bytes for " + describe(got) +
                               " but " + us() + " expects " + std::to_string(r.bytes) + " bytes for it"));
    arrived(p.rank, r.tag);
    const auto reach = static_cast<Reach>(sh->reach);
    if (reach == Reach::kNone) {
      if (sh->offset != r.moved || sh->length > frag || sh->length > r.bytes - r.moved)
        return fail(Internal(who(i) + " wrote a malformed fragment of " + describe(got) + " (offset " +
                             std::to_string(sh->offset) + ", " + std::to_string(sh->length) + " bytes)"));
      if (sh->length > 0) std::memcpy(r.buf + r.moved, sh + 1, sh->length);
      r.moved += sh->length;
    } else if (reach == Reach::kArena && r.moved == 0) {
      const int dom = p.dom;
      const size_t arena = domain_->arena_bytes(dom);
      if (sh->where > arena || r.bytes > arena - sh->where)
        return fail(Internal(who(i) + " pointed outside its arena for " + describe(got)));
      std::memcpy(r.buf, domain_->arena(dom) + sh->where, r.bytes);
      r.moved = r.bytes;
    } else if (reach == Reach::kCma && r.moved == 0) {
      Status st = domain_->cma_read(p.dom, sh->where, r.buf, r.bytes);
      if (!st.ok()) return fail(st.prefixed(who(i) + ": " + describe(got) + ": "));
      r.moved = r.bytes;
    } else {
      return fail(Internal(who(i) + " wrote a slot of unknown kind " + std::to_string(sh->reach)));
    }
    ch->tail.value.store(++tail, std::memory_order_release);
    any = true;
    if (r.moved == r.bytes) {
      r.done = true;
      moved_bytes(p.rank, false, r.bytes);
      pop(p.recvs);
    }
  }
  if (any) {
    *moved = true;
    ring(i);  // the sender may wait for room, or for a zero-copy read to end
  }
  return Status::Ok();
}

// ---- what a stuck wait looks at --------------------------------------------------------------

Status ShmTransport::one_sided_disagreement(int i, const OpTag& mine) {
  if (mine.coll == CollKind::kSendRecv) return Status::Ok();
  const ControlLines* l = peers_[static_cast<size_t>(i)].lines;
  const uint64_t posted = l->posted.value.load(std::memory_order_acquire);
  if (posted == 0) return Status::Ok();
  WireTag w;
  std::memcpy(&w, &l->desc[posted % 2].tag, sizeof w);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (l->posted.value.load(std::memory_order_relaxed) != posted) return Status::Ok();  // moving on: look again later
  const OpTag theirs = op_tag(w);
  if (theirs.seq != mine.seq) return Status::Ok();
  const std::string us = "rank " + std::to_string(rank()) + " (this rank)";
  if (theirs == mine)
    return InvalidUsage(who(i) + " runs " + describe(mine) + " with a one-sided shared-memory algorithm but " + us +
                        " expects a message from it: do the ranks force different algorithms (COMM_ALGO)?");
  return call_mismatch(who(i), theirs, us, mine);
}

Status ShmTransport::channel_disagreement(int i, const OpTag& mine) {
  ChannelHead* ch = channel_in(i);
  const uint64_t tail = ch->tail.value.load(std::memory_order_relaxed);
  const uint64_t head = ch->head.value.load(std::memory_order_acquire);
  if (tail >= head) return Status::Ok();
  const OpTag got = op_tag(slot_of(ch, tail)->tag);
  if (got.coll == CollKind::kSendRecv || got.seq != mine.seq || got == mine) return Status::Ok();
  return call_mismatch(who(i), got, "rank " + std::to_string(rank()) + " (this rank)", mine);
}

Status ShmTransport::request_stuck(const Request& r, bool timed_out, std::string* text) {
  if (r.any) {  // no message came from any local rank: only the deadline ends it
    const std::string one = "any rank (receive from any source, COMM_ANY_SOURCE, of " + std::to_string(r.bytes) +
                            " bytes: no rank sent a message)";
    if (timed_out && text->find(one) == std::string::npos) *text += (text->empty() ? "" : "; ") + one;
    return Status::Ok();
  }
  COMM_RETURN_IF_ERROR(check_alive(r.peer, describe(r.tag)));
  // A peer silent past the silence rule is stopped or hung: the wait fails now, as the one-sided
  // waits do (local_access.cc) and the socket transport's (silent_awaited), not at its own timeout
  // (a comm_recv that began after the peer was stopped would otherwise wait all of it).
  COMM_RETURN_IF_ERROR(check_silent(r.peer, r.tag));
  COMM_RETURN_IF_ERROR(one_sided_disagreement(r.peer, r.tag));
  if (!timed_out) return Status::Ok();
  const std::string one = who(r.peer) + " (" + (r.is_send ? "send of " : "receive of ") + describe(r.tag) + ": " +
                          std::to_string(r.moved) + " of " + std::to_string(r.bytes) + " bytes)";
  if (text->find(one) == std::string::npos) *text += (text->empty() ? "" : "; ") + one;
  return Status::Ok();
}

}  // namespace comm::transport::shm
