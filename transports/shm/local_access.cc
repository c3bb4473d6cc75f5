// One-sided calls (LocalAccess): numbered calls, posted with their tag and buffers in this
// rank's control segment; mark counters that peers wait on; staging rings in the arena for
// buffers peers cannot read in place. See transport.h for the protocol.
#include <bit>
#include <cstring>

#include "common/arrivals.h"
#include "common/wire_check.h"
#include "shm/shm_transport_impl.h"

namespace comm::transport::shm {
namespace {

constexpr size_t kMinRing = size_t{1} << 20;

const char* mark_name(LocalAccess::Mark m) {
  switch (m) {
    case LocalAccess::Mark::kStaged: return "its input chunks of";
    case LocalAccess::Mark::kConsumed: return "its reduction of";
    case LocalAccess::Mark::kResult: return "its results of";
    default: return "its copies of the results of";
  }
}

}  // namespace

Status ShmTransport::begin(const OpTag& tag) {
  COMM_RETURN_IF_ERROR(usable());
  ++call_;
  tag_ = tag;
  small_call_ = true;
  my_lines_->desc[call_ % 2].tag = wire_tag(tag);  // the rest only for large calls (expose)
  return Status::Ok();
}

SlotHead* ShmTransport::slot_head(int i) {
  return reinterpret_cast<SlotHead*>(peers_[static_cast<size_t>(i)].slots + (call_ % 2) * geometry_.control.slot_stride());
}

char* ShmTransport::slot(int i) { return reinterpret_cast<char*>(slot_head(i)) + sizeof(SlotHead); }

Status ShmTransport::post() {
  my_lines_->posted.value.store(call_, std::memory_order_release);
  if (small_call_) {
    SlotHead* h = slot_head(me_);
    h->tag = wire_tag(tag_);
    h->call.store(call_, std::memory_order_release);
    // No fence: it would wait for these lines to leave for the peers' caches, which is most
    // of a small all-reduce's latency; the peers' reads overlap with it instead.
    ring_all(false);
    return Status::Ok();
  }
  ring_all();
  return Status::Ok();
}

// Per-peer waits: a wait for a peer's mark is a wait for it to move this call's data (its bytes
// in transit, as a socket's transfer wait), not for it to start the call (wait_posted's).
Status ShmTransport::wait_counter(int i, std::atomic<uint64_t>& c, uint64_t at_least, const char* what,
                                  bool flowing) {
  uint64_t last = c.load(std::memory_order_acquire);
  if (last >= at_least) return Status::Ok();
  Status st = await(tag_.order,
      [&](bool* done, bool* moved) {
        const uint64_t v = c.load(std::memory_order_acquire);
        *done = v >= at_least;
        *moved = v != last;
        last = v;
        return progress(moved);  // non-blocking sends/receives still in flight keep moving
      },
      [&](bool timed_out) {
        COMM_RETURN_IF_ERROR(check_alive(i, describe(tag_)));
        COMM_RETURN_IF_ERROR(check_silent(i, tag_));
        COMM_RETURN_IF_ERROR(channel_disagreement(i, tag_));
        if (!timed_out) return Status::Ok();
        return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                       std::to_string(rank()) + " waited on " + who(i) + " (" + what + " " + describe(tag_) +
                       " over shared memory); is that rank still running, and calling the same operation?");
      },
      [&](uint64_t ns) { charge(i, ns, flowing); });
  return st.ok() ? st : note_peer(st, i);
}

// Small calls: the peer's slot head carries its call number and tag in one cache line.
Status ShmTransport::wait_slot(int i) {
  SlotHead* h = slot_head(i);
  const bool waited = h->call.load(std::memory_order_acquire) < call_;
  if (waited) {
    Status st = await(tag_.order,
        [&](bool* done, bool* moved) {
          *done = h->call.load(std::memory_order_acquire) >= call_;
          return *done ? Status::Ok() : progress(moved);
        },
        [&](bool timed_out) {
          COMM_RETURN_IF_ERROR(check_alive(i, describe(tag_)));
          COMM_RETURN_IF_ERROR(check_silent(i, tag_));
          COMM_RETURN_IF_ERROR(channel_disagreement(i, tag_));
          // A peer that posted this call number through its descriptor only runs another call.
          const ControlLines* l = peers_[static_cast<size_t>(i)].lines;
          if (l->posted.value.load(std::memory_order_acquire) >= call_) {
            const OpTag theirs = op_tag(l->desc[call_ % 2].tag);
            if (!(theirs == tag_))
              return call_mismatch(who(i), theirs, "rank " + std::to_string(rank()) + " (this rank)", tag_);
          }
          if (!timed_out) return Status::Ok();
          return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                         std::to_string(rank()) + " waited on " + who(i) + " (its part of " + describe(tag_) +
                         " over shared memory); is that rank still running, and calling the same operation?");
        },
        [&](uint64_t ns) { charge(i, ns, false); });
    if (!st.ok()) return note_peer(st, i);
  }
  const OpTag theirs = op_tag(h->tag);
  if (!(theirs == tag_))
    return fail(call_mismatch(who(i), theirs, "rank " + std::to_string(rank()) + " (this rank)", tag_));
  arrived(peers_[static_cast<size_t>(i)].rank, tag_, waited);
  return Status::Ok();
}

Status ShmTransport::wait_posted(int i) {
  if (i == me_) return Status::Ok();
  if (small_call_) return wait_slot(i);
  Peer& p = peers_[static_cast<size_t>(i)];
  const bool waited = p.lines->posted.value.load(std::memory_order_acquire) < call_;
  COMM_RETURN_IF_ERROR(wait_counter(i, p.lines->posted.value, call_, "its part of", false));
  // It is at most one call ahead: this call's descriptor is not rewritten before we finish.
  std::memcpy(static_cast<void*>(&p.desc), &p.lines->desc[call_ % 2], sizeof p.desc);
  const OpTag theirs = op_tag(p.desc.tag);
  auto us = [&] { return "rank " + std::to_string(rank()) + " (this rank)"; };  // error messages only
  if (!(theirs == tag_))
    return fail(call_mismatch(who(i), theirs, us(), tag_));
  arrived(p.rank, tag_, waited);
  const CallDesc& mine = my_lines_->desc[call_ % 2];
  if (p.desc.chunk_bytes != mine.chunk_bytes || p.desc.bytes != mine.bytes)
    return fail(InvalidUsage(who(i) + " pipelines " + describe(tag_) + " in chunks of " +
                             std::to_string(p.desc.chunk_bytes) + " bytes but " + us() + " in chunks of " +
                             std::to_string(mine.chunk_bytes) + ": start every rank with the same COMM_SHM_CHUNK_BYTES"));
  // Where its buffers and ring are, checked against its arena once here.
  const size_t arena = domain_->arena_bytes(p.dom);
  auto inside = [&](uint64_t where, uint64_t len) { return where <= arena && len <= arena - where; };
  const size_t n = peers_.size();
  const uint64_t ring_len = kRingDepth * (n + 1) * p.desc.chunk_bytes;
  p.mapped_in = p.mapped_out = nullptr;
  p.ring = nullptr;
  for (const RegionDesc* rd : {&p.desc.in, &p.desc.out}) {
    const auto reach = static_cast<Reach>(rd->reach);
    const bool ok = reach == Reach::kArena ? inside(rd->where, p.desc.bytes)
                                           : reach == Reach::kStaged && inside(rd->where, ring_len);
    if (!ok) return fail(Internal(who(i) + " exposed a buffer outside its arena for " + describe(tag_)));
    const char* at = domain_->arena(p.dom) + rd->where;
    if (reach == Reach::kStaged) p.ring = const_cast<char*>(at);
    (rd == &p.desc.in ? p.mapped_in : p.mapped_out) = reach == Reach::kArena ? at : nullptr;
  }
  return Status::Ok();
}

Status ShmTransport::expose(const void* in, void* out, size_t bytes, size_t chunk_bytes) {
  COMM_RETURN_IF_ERROR(usable());
  small_call_ = false;
  chunk_bytes_ = chunk_bytes;
  CallDesc& d = my_lines_->desc[call_ % 2];
  d.bytes = bytes;
  d.chunk_bytes = chunk_bytes;
  for (int m = 0; m < kMarks; ++m) {
    mark_base_[m] = my_lines_->marks[m].value.load(std::memory_order_relaxed);
    d.mark_base[m] = mark_base_[m];
  }
  Peer& self = peers_[static_cast<size_t>(me_)];
  uint64_t in_at = 0, out_at = 0;
  const bool in_mapped = domain_->locate(in, bytes, &in_at);
  const bool out_mapped = domain_->locate(out, bytes, &out_at);
  self.mapped_in = in_mapped ? static_cast<const char*>(in) : nullptr;
  self.mapped_out = out_mapped ? static_cast<const char*>(out) : nullptr;
  self.ring = nullptr;
  if (!in_mapped || !out_mapped) {
    // The ring: kRingDepth steps of one chunk per local rank (input), then of one (output).
    // Grown by powers of two at first use of a size, touched then, reused afterwards.
    const size_t want = kRingDepth * (peers_.size() + 1) * chunk_bytes;
    if (ring_bytes_ < want) {
      if (ring_ != nullptr) domain_->free(ring_);
      ring_ = nullptr;
      ring_bytes_ = 0;
      const size_t size = std::bit_ceil(want < kMinRing ? kMinRing : want);
      Status st = domain_->alloc(size, &ring_);
      if (!st.ok()) return fail(st.prefixed(me() + ": shared staging for " + describe(tag_) + ": "));
      ring_bytes_ = size;
    }
    uint64_t ring_at = 0;
    if (!domain_->locate(ring_, want, &ring_at)) return fail(Internal(me() + ": staging ring outside the arena"));
    self.ring = ring_;
    if (!in_mapped) in_at = ring_at;
    if (!out_mapped) out_at = ring_at;
  }
  d.in = RegionDesc{static_cast<uint32_t>(in_mapped ? Reach::kArena : Reach::kStaged), 0, in_at};
  d.out = RegionDesc{static_cast<uint32_t>(out_mapped ? Reach::kArena : Reach::kStaged), 0, out_at};
  return post();
}

const char* ShmTransport::mapped_input(int i) { return peers_[static_cast<size_t>(i)].mapped_in; }
const char* ShmTransport::mapped_output(int i) { return peers_[static_cast<size_t>(i)].mapped_out; }

char* ShmTransport::in_slot(int i, uint64_t step, int owner) {
  const size_t n = peers_.size();
  return peers_[static_cast<size_t>(i)].ring + ((step % kRingDepth) * n + static_cast<size_t>(owner)) * chunk_bytes_;
}

char* ShmTransport::out_slot(int i, uint64_t step) {
  const size_t n = peers_.size();
  return peers_[static_cast<size_t>(i)].ring + (kRingDepth * n + step % kRingDepth) * chunk_bytes_;
}

void ShmTransport::publish(Mark mark, uint64_t steps) {
  const int m = static_cast<int>(mark);
  my_lines_->marks[m].value.store(mark_base_[m] + steps, std::memory_order_release);
  ring_all();
}

Status ShmTransport::wait_mark(int i, Mark mark, uint64_t steps) {
  if (i == me_) return Status::Ok();
  Peer& p = peers_[static_cast<size_t>(i)];
  const int m = static_cast<int>(mark);
  return wait_counter(i, p.lines->marks[m].value, p.desc.mark_base[m] + steps, mark_name(mark), true);
}

Status ShmTransport::finish() {
  my_lines_->finished.value.store(call_, std::memory_order_release);
  ring_all();
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i)
    if (i != me_) COMM_RETURN_IF_ERROR(wait_counter(i, peers_[static_cast<size_t>(i)].lines->finished.value, call_, "the end of", true));
  return Status::Ok();
}

void ShmTransport::count_bytes(int i, uint64_t sent, uint64_t received) {
  if (i == me_ || arrivals() == nullptr) return;
  const int peer = peers_[static_cast<size_t>(i)].rank;
  moved_bytes(peer, true, sent);
  moved_bytes(peer, false, received);
}

}  // namespace comm::transport::shm
