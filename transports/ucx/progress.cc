// Moving messages: posting UCP tag operations from the preallocated pool, the completion
// callbacks, waits that spin briefly and then block on the worker's event fd, the checks of
// each arrived header, and failure reports in both directions.
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "common/arrivals.h"
#include "common/wire_check.h"
#include "ucx/ucx_transport_impl.h"

namespace comm::transport::ucx {
namespace {

std::string ucs(ucs_status_t s) { return ucx_library().ucs_status_string(s); }

// At most 1 ms per block: UCX's event fd does not signal every step of a large transfer (with a
// 100 ms cap, 8 MiB all-reduces over UCX's tcp took 84-132 ms; with 1 ms, 18-28 ms), and UCX
// checks its peers (keepalive) from progress calls. Still a block, not a spin.
constexpr int kMaxBlockMs = 1;

OpTag tag_of(const WireHeader& h) {
  OpTag t;
  t.seq = h.seq;
  t.coll = static_cast<CollKind>(h.coll);
  t.dtype = h.dtype;
  t.op = h.op;
  t.root = h.root;
  t.count = h.count;
  return t;
}

}  // namespace

// ---- UCP callbacks (inside ucp_worker_progress, on the thread driving the transport) ---------

void UcxTransport::part_finished(uint32_t index) {
  Request& r = pool_[index];
  if (--r.parts_left == 0 && !r.any) moved_bytes(r.peer, r.is_send, r.bytes);
  ++completions_;
}

void UcxTransport::on_send(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Part*>(user_data);
  p->status = status;
  p->pending = false;
  p->ucp = nullptr;
  ucx_library().ucp_request_free(request);
  p->owner->part_finished(p->request);
}

void UcxTransport::on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* p = static_cast<Part*>(user_data);
  p->status = status;
  p->length = status == UCS_OK && info != nullptr ? info->length : 0;
  p->pending = false;
  p->ucp = nullptr;
  ucx_library().ucp_request_free(request);
  p->owner->part_finished(p->request);
}

void UcxTransport::on_error_report(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                                   void* user_data) {
  auto* p = static_cast<Part*>(user_data);
  p->status = status;
  p->length = status == UCS_OK && info != nullptr ? info->length : 0;
  p->pending = false;
  p->ucp = nullptr;
  ucx_library().ucp_request_free(request);
  if (status == UCS_OK) p->owner->report_arrived_ = true;
}

void UcxTransport::on_peer_failure(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failed) return;
  peer->failed = true;
  peer->reason = ucs(status);
  COMM_INFO(kNet, "%s: UCX reports the endpoint to rank %d broken (%s)", peer->owner->me().c_str(), peer->rank,
            peer->reason.c_str());
}

// ---- requests --------------------------------------------------------------------------------

Status UcxTransport::usable() {
  if (aborted_.load(std::memory_order_acquire) && failed_.code() != COMM_ERR_ABORTED)
    failed_ = Aborted(me() + ": the transport was aborted (comm_abort); make a new communicator");
  return failed_;
}

Status UcxTransport::start(Part& part, bool is_send, ucp_ep_h ep, void* buf, size_t bytes, uint64_t tag,
                          uint64_t mask) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.user_data = &part;
  part.pending = true;
  part.status = UCS_OK;
  part.length = 0;
  part.ucp = nullptr;
  void* req;
  if (is_send) {
    rp.cb.send = &UcxTransport::on_send;
    req = ucx_library().ucp_tag_send_nbx(ep, buf, bytes, tag, &rp);
  } else {
    // Receives always complete through the callback, which records the arrived length.
    rp.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    rp.cb.recv = &UcxTransport::on_recv;
    req = ucx_library().ucp_tag_recv_nbx(worker_, buf, bytes, tag, mask, &rp);
  }
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {  // done at once (small sends), or failed at once
    part.pending = false;
    part.status = req == nullptr ? UCS_OK : UCS_PTR_STATUS(req);
    part.length = bytes;
    part_finished(part.request);
    return Status::Ok();
  }
  part.ucp = req;
  return Status::Ok();
}

Status UcxTransport::post_request(const Post& call, RequestId* id) {
  COMM_RETURN_IF_ERROR(usable());
  const auto [is_send, peer, tag, buf, bytes] = call;
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = is_send;
  r.peer = peer;
  r.tag = tag;
  r.buf = buf;
  r.bytes = bytes;
  r.any = false;
  return start_request(r);
}

Status UcxTransport::start_request(Request& r) {
  const bool is_send = r.is_send;
  const int peer = r.peer;
  const OpTag& tag = r.tag;
  const size_t bytes = r.bytes;
  r.parts_left = bytes > 0 ? 2 : 1;  // an empty message is its header alone
  r.awaited = false;
  Peer& p = peers_[static_cast<size_t>(peer)];
  const uint64_t number = is_send ? p.sent++ : p.received++;
  const uint64_t wire_tag = data_tag(is_send ? rank() : peer, number);
  if (is_send) {
    WireHeader& h = r.header;
    h = WireHeader{};
    h.key = key_;
    h.seq = tag.seq;
    h.count = tag.count;
    h.bytes = bytes;
    h.root = tag.root;
    h.source = rank();
    h.coll = static_cast<uint8_t>(tag.coll);
    h.dtype = tag.dtype;
    h.op = tag.op;
  }
  // A send/recv's header says so (kP2pBit); a directed receive takes either kind, so a
  // disagreement is still named by check_header instead of left unmatched.
  const uint64_t p2p = is_send && tag.coll == CollKind::kSendRecv ? kP2pBit : 0;
  COMM_RETURN_IF_ERROR(start(r.parts[0], is_send, p.ep, &r.header, sizeof r.header, wire_tag | kHeaderBit | p2p,
                             ~kP2pBit));
  if (bytes > 0) COMM_RETURN_IF_ERROR(start(r.parts[1], is_send, p.ep, r.buf, bytes, wire_tag));
  return Status::Ok();
}

Status UcxTransport::post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                             RequestId* id) {
  COMM_RETURN_IF_ERROR(usable());
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = false;
  r.peer = -1;
  r.tag = tag;
  r.buf = static_cast<char*>(buf);
  r.bytes = bytes;
  r.parts_left = 1;  // unfinished until it matched and its parts arrived
  for (Part& part : r.parts) {
    part.pending = false;
    part.ucp = nullptr;
  }
  r.any = true;
  r.source = source;
  r.next_seq = next_seq;
  any_recvs_.push(pool_, index);
  Status st = match_any();  // a message may be waiting already
  return st.ok() ? st : fail(st);
}

// Every receive posted before this one took its peer's messages by number, so peer p's message
// number `received` is the first no receive claims: when UCX holds its header (unexpected) and it
// is a send/recv's, the oldest receive from any rank takes that number (MPI's order: the core
// posts no receive after one from any rank until it completes). Peers are looked at in turn.
int UcxTransport::find_any() {
  return next_peer_in_turn(size(), rank(), &any_turn_, [this](int peer) {
    const Peer& p = peers_[static_cast<size_t>(peer)];
    if (p.ep == nullptr) return false;
    ucp_tag_recv_info_t info{};
    const uint64_t header = data_tag(peer, p.received) | kHeaderBit | kP2pBit;
    return ucx_library().ucp_tag_probe_nb(worker_, header, ~uint64_t{0}, 0, &info) != nullptr;
  });
}

Status UcxTransport::probe_any(int* source) {
  COMM_RETURN_IF_ERROR(usable());
  if (source == nullptr) return InvalidArgument("UCX transport: null source pointer for a probe");
  ucx_library().ucp_worker_progress(worker_);
  Status st = report_arrived_ ? take_report() : Status::Ok();
  if (st.ok()) st = report_for(kAnyOrder);  // a probe is for a receive from any rank: any report ends it
  if (!st.ok()) return fail(st);
  *source = find_any();
  return Status::Ok();
}

Status UcxTransport::match_any() {
  // start_request(): its header is then checked as irecv()'s is.
  return match_any_source(any_recvs_, pool_, [this] { return find_any(); },
                          [this](uint32_t index) { return start_request(pool_[index]); });
}

// ---- checks ----------------------------------------------------------------------------------

// The header that arrived for a receive, against the call posted here. Everything in it came
// from the wire: checked before it is believed.
static Status check_header(const Request& r, uint64_t key, int me_rank) {
  const Part& hp = r.parts[0];
  const WireHeader& h = r.header;
  const OpTag got = tag_of(h);
  // The common case first, with nothing allocated: messages are only built on failure.
  if (hp.length == sizeof(WireHeader) && h.magic == kMagic && h.key == key && got == r.tag && h.bytes == r.bytes)
    return Status::Ok();
  const std::string them = "rank " + std::to_string(r.peer);
  if (hp.length != sizeof(WireHeader))
    return RemoteError(them + " sent a malformed UCX header (" + std::to_string(hp.length) + " bytes) for " +
                       describe(r.tag) + "; is it running the same libcomm version?");
  if (h.magic != kMagic || h.key != key)
    return RemoteError("a message from " + them + " for " + describe(r.tag) +
                       " does not carry this job's key (another job, or a stray sender?); refused");
  const std::string us = "rank " + std::to_string(me_rank) + " (this rank)";
  return check_arrival(them, got, h.bytes, us, r.tag, r.bytes);
}

Status UcxTransport::check(Request& r) {
  const int nparts = r.bytes > 0 ? 2 : 1;
  if (!r.is_send && r.parts[0].status == UCS_OK) {
    COMM_RETURN_IF_ERROR(check_header(r, key_, rank()));
    arrived(r.peer, r.tag);
  }
  for (int k = 0; k < nparts; ++k) {
    const Part& p = r.parts[k];
    if (p.status == UCS_OK) continue;
    const std::string them = "rank " + std::to_string(r.peer);
    if (p.status == UCS_ERR_MESSAGE_TRUNCATED)
      return InvalidUsage(them + " sent more than the " + std::to_string(k == 0 ? sizeof(WireHeader) : r.bytes) +
                          " bytes rank " + std::to_string(rank()) + " (this rank) expects for " + describe(r.tag));
    if (p.status == UCS_ERR_CANCELED) return usable().ok() ? Aborted(me() + ": UCX request cancelled") : usable();
    const Peer& peer = peers_[static_cast<size_t>(r.peer)];
    return RemoteError(them + (peer.failed ? " failed (UCX: " + peer.reason + ")" : " is unreachable") + " during " +
                       describe(r.tag) + ": UCX " + (r.is_send ? "send" : "receive") + " failed with '" +
                       ucs(p.status) + "' (did it exit or crash?)");
  }
  if (!r.is_send && r.bytes > 0 && r.parts[1].length != r.bytes)
    return InvalidUsage("rank " + std::to_string(r.peer) + " sent " + std::to_string(r.parts[1].length) + " bytes for " + describe(r.tag) +
                        " but rank " + std::to_string(rank()) + " (this rank) expects " + std::to_string(r.bytes));
  return Status::Ok();
}

Status UcxTransport::check_pending(Request& r) {
  if (r.any) return Status::Ok();  // not matched yet: only the deadline ends it
  // A receive whose header is in: a disagreement shows now, not after the timeout.
  if (!r.is_send && !r.parts[0].pending && r.parts[0].status == UCS_OK)
    COMM_RETURN_IF_ERROR(check_header(r, key_, rank()));
  Peer& peer = peers_[static_cast<size_t>(r.peer)];
  if (!peer.failed) return Status::Ok();
  // What the peer sent before it went may still be in UCX's queues: drain them first.
  for (int i = 0; i < 64 && r.parts_left > 0; ++i)
    if (ucx_library().ucp_worker_progress(worker_) == 0) break;
  if (r.parts_left == 0) return Status::Ok();
  return RemoteError("rank " + std::to_string(r.peer) + " failed (UCX: " + peer.reason + ") during " +
                     describe(r.tag) + " (did it exit or crash?)");
}

void UcxTransport::check_pids() {
  for (Peer& p : peers_) {
    if (!p.watch_pid || p.failed) continue;
    pollfd exited{p.pidfd, POLLIN, 0};
    if (p.pidfd >= 0 ? ::poll(&exited, 1, 0) > 0 : ::kill(p.pid, 0) != 0 && errno == ESRCH) {
      p.failed = true;
      p.reason = "its process " + std::to_string(p.pid) + " is gone";
    }
  }
}

// ---- waits -----------------------------------------------------------------------------------

Status UcxTransport::block(int timeout_ms) {
  if (worker_fd_ < 0) {
    timespec ts{0, 50 * 1000};
    nanosleep(&ts, nullptr);
    return Status::Ok();
  }
  ucs_status_t s = ucx_library().ucp_worker_arm(worker_);
  if (s == UCS_ERR_BUSY) return Status::Ok();  // events arrived meanwhile: progress again
  if (s != UCS_OK) return Internal(me() + ": UCX transport: ucp_worker_arm failed: " + ucs(s));
  pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  int rc = ::poll(fds, 2, timeout_ms);
  if (rc < 0 && errno != EINTR) return SystemError(me() + ": poll() failed: " + errno_string(errno));
  if (rc > 0 && (fds[1].revents & POLLIN)) {
    // Drain the signal so the next poll blocks again (abort is also kept in aborted_).
    uint64_t count = 0;
    ssize_t ignored = ::read(wake_fd_, &count, sizeof count);
    (void)ignored;
  }
  return Status::Ok();
}

Status UcxTransport::drive(const RequestId* ids, size_t n, bool any) {
  COMM_RETURN_IF_ERROR(usable());
  COMM_RETURN_IF_ERROR(pool_.lookup_all(ids, n));
  // A failure names the peers this wait still needed (Transport::wait_failure).
  auto fail = [&](const Status& st) {
    for (size_t i = 0; i < n; ++i) {
      const Request& r = pool_.of(ids[i]);
      if (r.parts_left > 0 && !r.any) note_awaited(st, r.peer, r.tag);
    }
    seal_wait_failure(st);
    return this->fail(st);
  };
  ProgressClock clock(options_.timeout_ms, kSpin);
  // Per-peer waits over the whole call (docs/observability.md, "Per-peer waits over the whole
  // call"), as the socket transport's drive: the stretch between two looks (this loop reads its
  // clock anyway) goes to the receives the earlier look found unfinished; in transit once the
  // header part had come.
  Arrivals* const charge = arrivals();
  Clock::time_point last_look{};
  bool charging = false;
  for (;;) {
    Clock::time_point now{};
    if (charging) {
      now = Clock::now();
      const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_look).count());
      for (size_t i = 0; i < n; ++i) {
        const Request& r = pool_.of(ids[i]);
        if (r.awaited) charge->waited(r.peer, ns, r.bytes > 0 && !r.parts[0].pending);
      }
    }
    bool all_done = true, some_done = false;
    for (size_t i = 0; i < n; ++i) {
      Request& r = pool_.of(ids[i]);
      Status st = r.parts_left == 0 ? check(r) : check_pending(r);
      if (st.ok()) st = report_for(r.any ? kAnyOrder : r.tag.order);  // also where its part is done
      if (!st.ok()) return fail(st);
      if (r.parts_left == 0) {
        some_done = true;
      } else {
        all_done = false;
      }
    }
    if (all_done && !any) break;
    if (any && (some_done || n == 0 || woken_.exchange(false, std::memory_order_acq_rel))) return Status::Ok();
    if (report_arrived_) {
      Status st = take_report();
      if (!st.ok()) return fail(st);
    }
    if (aborted_.load(std::memory_order_acquire)) return usable();
    if (!charging) now = Clock::now();
    if (charge != nullptr) {
      charging = false;
      for (size_t i = 0; i < n; ++i) {
        Request& r = pool_.of(ids[i]);
        r.awaited = r.parts_left > 0 && !r.is_send && !r.any;
        charging = charging || r.awaited;
      }
      last_look = now;
    }
    if (clock.expired(now)) return fail(Timeout(timeout_message(ids, n)));
    const uint64_t before = completions_;
    const unsigned events = ucx_library().ucp_worker_progress(worker_);
    if (!any_recvs_.empty()) {
      Status st = match_any();
      if (!st.ok()) return fail(st);
    }
    if (completions_ != before) {
      clock.moved();
      continue;
    }
    if (events > 0 || clock.spinning(now)) continue;
    if (now >= next_pid_check_) {  // only while blocked, and a few times a second
      check_pids();
      next_pid_check_ = now + std::chrono::milliseconds(100);
    }
    COMM_RETURN_IF_ERROR(block(clock.block_ms(now, kMaxBlockMs)));
  }
  pool_.release_all(ids, n);
  return Status::Ok();
}

Status UcxTransport::test(RequestId id, bool* done) {
  COMM_RETURN_IF_ERROR(usable());
  if (done == nullptr) return InvalidArgument("UCX transport: null done pointer");
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.lookup(id, &index));
  Request& r = pool_[index];
  if (r.parts_left > 0) ucx_library().ucp_worker_progress(worker_);
  if (!any_recvs_.empty()) {
    Status st = match_any();
    if (!st.ok()) return fail(st);
  }
  Status st = r.parts_left == 0 ? check(r) : check_pending(r);
  if (!st.ok()) return fail(st);
  if (r.parts_left > 0 && report_arrived_) st = take_report();
  if (st.ok()) st = report_for(r.any ? kAnyOrder : r.tag.order);
  if (!st.ok()) return fail(st);
  *done = r.parts_left == 0;
  if (*done) pool_.release(index);
  return Status::Ok();
}

std::string UcxTransport::timeout_message(const RequestId* ids, size_t n) {
  std::string text = "no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                     std::to_string(rank()) + " waited on ";
  std::string parts;
  for (size_t i = 0; i < n; ++i) {
    const Request& r = pool_.of(ids[i]);
    if (r.parts_left == 0) continue;
    std::string one = r.any ? "any rank (receive from any source, COMM_ANY_SOURCE, of " + std::to_string(r.bytes) +
                                  " bytes, UCX: no rank sent a message)"
                            : "rank " + std::to_string(r.peer) + " (" + (r.is_send ? "send of " : "receive of ") +
                                  describe(r.tag) + ", " + std::to_string(r.bytes) + " bytes, UCX)";
    if (parts.find(one) != std::string::npos) continue;
    parts += (parts.empty() ? "" : "; ") + one;
  }
  return text + parts + "; is that rank still running, and calling the same operation?";
}

// ---- failure propagation ---------------------------------------------------------------------

Status UcxTransport::peer_report() {
  const WireHeader& h = report_.header;
  if (report_part_.length < sizeof(WireHeader) || h.magic != kMagic || h.key != key_)
    return RemoteError(me() + ": a failure report without this job's key arrived (another job, or a stray "
                       "sender?); this transport stops");
  size_t len = std::min<size_t>({static_cast<size_t>(h.bytes), kMaxErrorText, report_part_.length - sizeof(WireHeader)});
  std::string text(report_.text, len);
  for (auto& ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f) ch = '?';
  // INVALID_USAGE stays INVALID_USAGE: every rank then reports the disagreement itself.
  comm_status_t code = h.status == COMM_ERR_INVALID_USAGE ? COMM_ERR_INVALID_USAGE : COMM_ERR_REMOTE;
  // Kept until a wait on the operation it names (seq: OpTag::order) or a later one takes it
  // (report_for); the peer's data of earlier operations still completes their waits. A hang (a
  // timeout report) is marked for the core's trace then.
  keep_report(Status(code, "rank " + std::to_string(h.source) + " reported: " + text), h.seq,
              h.status == COMM_ERR_TIMEOUT);
  report_arrived_ = false;
  return post_report_receive();
}

Status UcxTransport::take_report() {
  const WireHeader& h = report_.header;
  if (report_part_.length < sizeof(WireHeader) || h.magic != kMagic || h.key != key_ || h.status != kGoodbye ||
      h.source < 0 || h.source >= size())
    return peer_report();
  Peer& p = peers_[static_cast<size_t>(h.source)];
  p.left = true;
  COMM_INFO(kNet, "%s: rank %d said GOODBYE (comm_destroy)", me().c_str(), h.source);
  report_arrived_ = false;
  return post_report_receive();
}

// Between calls (the watcher, while no thread drives the transport): UCX runs its callbacks (an
// endpoint failed, a report arrived) only inside ucp_worker_progress, so progress here, never
// blocking. A peer failed without GOODBYE on two checks in a row is dead: the second check lets a
// GOODBYE that UCX delivers after the endpoint's failure still count.
Status UcxTransport::check_idle() {
  COMM_RETURN_IF_ERROR(usable());
  for (int i = 0; i < 64; ++i) {
    while (report_arrived_) {
      Status st = take_report();
      if (!st.ok()) return fail(st);
    }
    if (ucx_library().ucp_worker_progress(worker_) == 0 && !report_arrived_) break;
  }
  if (Status st = report_for(kAnyOrder); !st.ok()) return fail(st);  // no call runs: the next is later
  check_pids();  // peers reached over shared memory alone (no UCX failure handling)
  for (Peer& p : peers_) {
    if (!p.failed || p.left || ++p.idle_failed < 2) continue;
    return fail(RemoteError("rank " + std::to_string(p.rank) + " failed (UCX: " + p.reason +
                            ") while the communicator was idle, without comm_destroy: did it exit or crash?"));
  }
  return Status::Ok();
}

void UcxTransport::notify_peers(const Status& failure, uint64_t order) {
  Status reason = failure.ok() ? Internal(me() + ": notify_peers called without a failure") : failure;
  const std::string text = reason.message().substr(0, kMaxErrorText);
  outgoing_.header = WireHeader{};
  outgoing_.header.key = key_;
  outgoing_.header.status = static_cast<uint32_t>(reason.code());
  outgoing_.header.bytes = text.size();
  outgoing_.header.source = rank();
  outgoing_.header.seq = order;  // the operation it concerns (OpTag::order); 0 concerns every one
  memcpy(outgoing_.text, text.data(), text.size());
  const size_t total = sizeof(WireHeader) + text.size();
  std::vector<void*> sends;
  int told = 0;
  for (Peer& p : peers_) {
    if (p.ep == nullptr || p.failed) continue;
    ucp_request_param_t rp{};
    void* req = ucx_library().ucp_tag_send_nbx(p.ep, &outgoing_, total, kErrorBit | (static_cast<uint64_t>(rank()) << kRankShift), &rp);
    if (UCS_PTR_IS_ERR(req)) continue;
    ++told;
    if (req != nullptr) sends.push_back(req);
  }
  // Best effort, bounded: a peer that does not progress does not hold this rank.
  const Deadline deadline(Clock::now() + kNotifyBudget);
  for (void* req : sends) {
    while (ucx_library().ucp_request_check_status(req) == UCS_INPROGRESS && !deadline.expired()) ucx_library().ucp_worker_progress(worker_);
    ucx_library().ucp_request_free(req);  // UCX releases one still in flight once it completes
  }
  COMM_INFO(kNet, "%s: told %d peer(s) over UCX that it failed: %s", me().c_str(), told, text.c_str());
  (void)fail(reason);
}

}  // namespace comm::transport::ucx
