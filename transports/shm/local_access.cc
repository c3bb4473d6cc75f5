// One-sided calls (LocalAccess): numbered calls, posted with their tag and buffers in this
// rank's control segment; counters that peers wait on. See transport.h for the protocol.
#include <bit>
#include <cstring>

#include "transports/shm/shm_transport_impl.h"

namespace comm::transport::shm {
namespace {

enum Which : size_t { kPosted, kProgress, kFinished };

std::atomic<uint64_t>& counter(ControlLines* l, size_t which) {
  switch (which) {
    case kPosted: return l->posted.value;
    case kProgress: return l->progress.value;
    default: return l->finished.value;
  }
}

constexpr size_t kMinStage = size_t{1} << 20;

}  // namespace

Status ShmTransport::begin(const OpTag& tag) {
  COMM_RETURN_IF_ERROR(usable());
  ++call_;
  tag_ = tag;
  small_call_ = true;
  in_ = nullptr;
  out_work_ = nullptr;
  CallDesc& d = my_lines_->desc[call_ % 2];
  d.tag = wire_tag(tag);
  d.bytes = 0;
  d.in = RegionDesc{};
  d.out = RegionDesc{};
  progress_base_ = my_lines_->progress.value.load(std::memory_order_relaxed);
  d.progress_base = progress_base_;
  return Status::Ok();
}

SlotHead* ShmTransport::slot_head(int i) {
  return reinterpret_cast<SlotHead*>(peers_[static_cast<size_t>(i)].slots + (call_ % 2) * geometry_.control.slot_stride());
}

char* ShmTransport::slot(int i) { return reinterpret_cast<char*>(slot_head(i)) + sizeof(SlotHead); }

Status ShmTransport::post() {
  if (small_call_) {
    SlotHead* h = slot_head(me_);
    h->tag = wire_tag(tag_);
    h->call.store(call_, std::memory_order_release);
  }
  my_lines_->posted.value.store(call_, std::memory_order_release);
  ring_all();
  return Status::Ok();
}

Status ShmTransport::wait_counter(int i, size_t which, uint64_t at_least, const char* what) {
  std::atomic<uint64_t>& c = counter(peers_[static_cast<size_t>(i)].lines, which);
  uint64_t last = c.load(std::memory_order_acquire);
  if (last >= at_least) return Status::Ok();
  return await(
      [&](bool* done, bool* moved) {
        const uint64_t v = c.load(std::memory_order_acquire);
        *done = v >= at_least;
        *moved = v != last;
        last = v;
        return progress(moved);  // non-blocking sends/receives still in flight keep moving
      },
      [&](bool timed_out) {
        COMM_RETURN_IF_ERROR(check_alive(i, describe(tag_)));
        COMM_RETURN_IF_ERROR(channel_disagreement(i, tag_));
        if (!timed_out) return Status::Ok();
        return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                       std::to_string(rank()) + " waited on " + who(i) + " (" + what + " " + describe(tag_) +
                       " over shared memory); is that rank still running, and calling the same operation?");
      });
}

// Small calls: the peer's slot head carries its call number and tag in one cache line.
Status ShmTransport::wait_slot(int i) {
  SlotHead* h = slot_head(i);
  if (h->call.load(std::memory_order_acquire) < call_) {
    COMM_RETURN_IF_ERROR(await(
        [&](bool* done, bool* moved) {
          *done = h->call.load(std::memory_order_acquire) >= call_;
          return *done ? Status::Ok() : progress(moved);
        },
        [&](bool timed_out) {
          COMM_RETURN_IF_ERROR(check_alive(i, describe(tag_)));
          COMM_RETURN_IF_ERROR(channel_disagreement(i, tag_));
          // A peer that posted this call number through its descriptor only runs another call.
          const ControlLines* l = peers_[static_cast<size_t>(i)].lines;
          if (l->posted.value.load(std::memory_order_acquire) >= call_) {
            const OpTag theirs = op_tag(l->desc[call_ % 2].tag);
            if (!(theirs == tag_))
              return InvalidUsage(who(i) + " called " + describe(theirs) + " but rank " + std::to_string(rank()) +
                                  " (this rank) called " + describe(tag_));
          }
          if (!timed_out) return Status::Ok();
          return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                         std::to_string(rank()) + " waited on " + who(i) + " (its part of " + describe(tag_) +
                         " over shared memory); is that rank still running, and calling the same operation?");
        }));
  }
  const OpTag theirs = op_tag(h->tag);
  if (!(theirs == tag_))
    return fail(InvalidUsage(who(i) + " called " + describe(theirs) + " but rank " + std::to_string(rank()) +
                             " (this rank) called " + describe(tag_)));
  return Status::Ok();
}

Status ShmTransport::wait_posted(int i) {
  if (i == me_) return Status::Ok();
  if (small_call_) return wait_slot(i);
  COMM_RETURN_IF_ERROR(wait_counter(i, kPosted, call_, "its part of"));
  Peer& p = peers_[static_cast<size_t>(i)];
  // It is at most one call ahead: this call's descriptor is not rewritten before we finish.
  std::memcpy(static_cast<void*>(&p.desc), &p.lines->desc[call_ % 2], sizeof p.desc);
  const OpTag theirs = op_tag(p.desc.tag);
  if (!(theirs == tag_))
    return fail(InvalidUsage(who(i) + " called " + describe(theirs) + " but rank " + std::to_string(rank()) +
                             " (this rank) called " + describe(tag_)));
  return Status::Ok();
}

// Staging in this rank's arena (peers map it): grown by powers of two, touched when allocated.
Status ShmTransport::staging(int which, size_t bytes, char** out, uint64_t* offset) {
  if (stage_bytes_[which] < bytes) {
    if (stage_[which] != nullptr) domain_->free(stage_[which]);
    stage_[which] = nullptr;
    stage_bytes_[which] = 0;
    const size_t want = std::bit_ceil(bytes < kMinStage ? kMinStage : bytes);
    Status st = domain_->alloc(want, &stage_[which]);
    if (!st.ok()) return fail(st.prefixed(me() + ": shared staging for " + describe(tag_) + ": "));
    stage_bytes_[which] = want;
  }
  *out = stage_[which];
  if (!domain_->locate(*out, bytes, offset)) return fail(Internal(me() + ": staging outside the arena"));
  return Status::Ok();
}

Status ShmTransport::expose(const void* in, void* out, size_t bytes, char** out_work) {
  COMM_RETURN_IF_ERROR(usable());
  small_call_ = false;
  CallDesc& d = my_lines_->desc[call_ % 2];
  d.bytes = bytes;
  in_ = static_cast<const char*>(in);
  uint64_t offset = 0;
  char* stage = nullptr;
  // Where peers find the input: in place (comm_mem_alloc), by process_vm_readv, or a copy.
  if (domain_->locate(in, bytes, &offset)) {
    d.in = RegionDesc{static_cast<uint32_t>(Reach::kArena), 0, offset};
  } else if (cma()) {
    d.in = RegionDesc{static_cast<uint32_t>(Reach::kCma), 0, reinterpret_cast<uint64_t>(in)};
  } else {
    COMM_RETURN_IF_ERROR(staging(0, bytes, &stage, &offset));
    std::memcpy(stage, in, bytes);
    d.in = RegionDesc{static_cast<uint32_t>(Reach::kArena), 0, offset};
  }
  if (domain_->locate(out, bytes, &offset)) {
    d.out = RegionDesc{static_cast<uint32_t>(Reach::kArena), 0, offset};
    out_work_ = static_cast<char*>(out);
  } else if (cma()) {
    d.out = RegionDesc{static_cast<uint32_t>(Reach::kCma), 0, reinterpret_cast<uint64_t>(out)};
    out_work_ = static_cast<char*>(out);
  } else {
    COMM_RETURN_IF_ERROR(staging(1, bytes, &stage, &offset));
    d.out = RegionDesc{static_cast<uint32_t>(Reach::kArena), 0, offset};
    out_work_ = stage;
  }
  *out_work = out_work_;
  return post();
}

const char* ShmTransport::peer_addr(int i, Region region, size_t off, size_t len) {
  if (i == me_) return (region == Region::kInput ? in_ : out_work_) + off;
  const Peer& p = peers_[static_cast<size_t>(i)];
  const RegionDesc& rd = region == Region::kInput ? p.desc.in : p.desc.out;
  if (rd.reach != static_cast<uint32_t>(Reach::kArena)) return nullptr;
  const size_t arena = domain_->arena_bytes(p.dom);
  if (off > p.desc.bytes || len > p.desc.bytes - off || rd.where > arena || off + len > arena - rd.where)
    return nullptr;
  return domain_->arena(p.dom) + rd.where + off;
}

Status ShmTransport::read(int i, Region region, size_t off, void* dst, size_t len) {
  if (len == 0) return Status::Ok();
  if (const char* src = peer_addr(i, region, off, len)) {
    std::memcpy(dst, src, len);
    return Status::Ok();
  }
  const Peer& p = peers_[static_cast<size_t>(i)];
  const RegionDesc& rd = region == Region::kInput ? p.desc.in : p.desc.out;
  if (rd.reach != static_cast<uint32_t>(Reach::kCma) || off > p.desc.bytes || len > p.desc.bytes - off)
    return fail(Internal(who(i) + " exposed no readable " + (region == Region::kInput ? "input" : "output") +
                         " of " + std::to_string(len) + " bytes at " + std::to_string(off) + " for " +
                         describe(tag_)));
  Status st = domain_->cma_read(p.dom, rd.where + off, dst, len);
  return st.ok() ? st : fail(st.prefixed(who(i) + ": " + describe(tag_) + ": "));
}

void ShmTransport::publish_progress(uint64_t value) {
  my_lines_->progress.value.store(progress_base_ + value, std::memory_order_release);
  ring_all();
}

Status ShmTransport::wait_progress(int i, uint64_t value) {
  if (i == me_) return Status::Ok();
  return wait_counter(i, kProgress, peers_[static_cast<size_t>(i)].desc.progress_base + value, "its results of");
}

Status ShmTransport::finish() {
  my_lines_->finished.value.store(call_, std::memory_order_release);
  ring_all();
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i)
    if (i != me_) COMM_RETURN_IF_ERROR(wait_counter(i, kFinished, call_, "the end of"));
  return Status::Ok();
}

}  // namespace comm::transport::shm
