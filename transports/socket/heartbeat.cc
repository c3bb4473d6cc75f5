// Idle detection on sockets (docs/design/core.md, "Idle detection"): between calls the
// communicator's watcher reads what peers sent, beats on connection 0 of every connected
// peer, and fails when a peer closed a connection without GOODBYE (it died) or sent nothing
// for the timeout (it is stopped). comm_destroy says GOODBYE (teardown.cc), so a peer that
// finished first is not taken for a dead one.
#include <sys/socket.h>

#include "common/silence.h"
#include "socket/socket_transport_impl.h"

namespace comm::transport::sock {

namespace {
// Whether the peer sent bytes this rank has not read: heard_ moves only when this rank reads, so
// a rank that was itself stalled (stopped, descheduled) would take every live peer for silent. Not
// a peer that hung up after them: it spoke, and died (find_lost's closes, the silence rule).
bool bytes_waiting(int fd) {
  pollfd pfd{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN) != 0 &&
         (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0;
}
}  // namespace

bool SocketTransport::flush_beat(Connection& c) {
  while (c.beat_left != 0) {
    const char* from = reinterpret_cast<const char*>(&c.beat_hdr) + (kHeaderBytes - c.beat_left);
    iovec iov{const_cast<char*>(from), c.beat_left};
    ssize_t n = conn_send(c, &iov, 1);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (!would_block(errno)) close_after_send_error(c, errno);
      return false;
    }
    c.beat_left = static_cast<uint8_t>(c.beat_left - static_cast<size_t>(n));  // not progress (moved_)
  }
  return true;
}

void SocketTransport::beat(Clock::time_point now) {
  next_beat_ = now + heartbeat_;
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    Connection& c = conn(p, 0);
    // Only between frames; a frame on its way says as much as a heartbeat.
    if (c.closed || !c.fd.valid() || !c.sends.empty() || c.beat_left != 0) continue;
    c.beat_hdr = FrameHeader{};
    c.beat_hdr.magic = kFrameMagic;
    c.beat_hdr.kind = static_cast<uint8_t>(FrameKind::kHeartbeat);
    c.beat_hdr.coll = static_cast<uint8_t>(CollKind::kInternal);
    c.beat_hdr.root = rank();
    c.beat_left = static_cast<uint8_t>(kHeaderBytes);
    flush_beat(c);  // the rest, if any, goes first at the next POLLOUT (progress)
  }
}

// The watcher calls this every heartbeat_, also while a call runs. A wait inside the transport
// beats itself (drive), so only a thread that finds no one inside sends the beat. That is the
// routed transport's rank waiting in its shared-memory part (a wait on local peers only, or the
// hierarchical all-reduce's one-sided steps through local()): before, its socket peers heard
// nothing for as long as it waited there, and a SIGSTOPped rank's host neighbour, waiting on it
// for the whole timeout, looked stopped too; another host's hang trace named the neighbour
// (tests/abi/test_processes.cc, several ranks per host).
void SocketTransport::beat() {
  if (heartbeat_.count() == 0) return;
  Entry entry(*this, std::try_to_lock);
  if (!entry.inside() || !usable().ok()) return;
  const Clock::time_point now = Clock::now();
  if (now >= next_beat_) beat(now);
}

// A peer beats every heartbeat_ from its watcher, or from a wait whose poll() blocks up to
// kMaxBlockMs: the rule every beating transport shares (common/silence.h).
int64_t SocketTransport::silence_limit_ms() const {
  static_assert(kMaxBlockMs <= kBeatLateMs, "a blocked poll may delay a beat longer than the silence rule allows");
  return transport::silence_limit_ms(options_.timeout_ms, heartbeat_.count());
}

Status SocketTransport::check_idle() {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  if (Status st = take_thread_failure(); !st.ok()) return fail(st);
  Status st = progress(0);  // failure reports (ERROR frames), heartbeats, GOODBYEs and closes
  if (st.ok()) st = report_for(kAnyOrder);  // no call runs: the next one is later than any report
  if (!st.ok()) return fail(st);
  const Clock::time_point now = Clock::now();
  if (heartbeat_.count() != 0 && now >= next_beat_) beat(now);
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    for (int k = 0; k < nconns_; ++k) {
      const Connection& c = conn(p, k);
      if (!c.closed || c.said_goodbye) continue;
      return fail(RemoteError("rank " + std::to_string(p) + " " + c.close_reason + " (connection #" +
                              std::to_string(k) + ") while the communicator was idle, without comm_destroy: did it "
                              "exit or crash?"));
    }
    const int64_t silent = silence_of(p, now);
    if (silent >= silence_limit_ms())
      return fail(silence_verdict("rank " + std::to_string(p), "sent nothing, not even a heartbeat", silent,
                                  heartbeat_.count(), options_.timeout_ms));
  }
  return Status::Ok();
}

// A connection that closed as a death (not garbage) or whose peer hung up without the GOODBYE of
// comm_destroy: poll() sees a FIN or a reset at once, also on a failed transport that reads no more.
// Also a connected peer silent past the silence rule (check_idle's): stopped or hung. A
// communicator that carries no calls (the DDP wrapper's, python/libcomm/fault_tolerance.py, agrees
// on its own) has no hang trace, and without this its agreement waited one more timeout for a
// SIGSTOPped rank that its heartbeats had already shown silent.
// closed_peers (Silence::kAsOfFailure) leaves out the silence of a transport that has not failed
// (transports/transport.h); a failed one judges it as of its failure, as lost_peers does: the
// silence that failed it (the watcher's idle detection) was read while someone read.
void SocketTransport::find_lost(std::vector<int>* out, Silence silence) {
  Entry entry(*this);
  // A failed transport reads no heartbeats: a peer's silence counts until the failure only. Else
  // a live peer of a communicator that failed (idle detection) and then sat unused for a timeout
  // (a DDP whose admission of a joiner waited out a dead member's comm_dup) was taken for a
  // stopped one, and the agreement left the survivors no majority (python/libcomm/fault_tolerance.py).
  const Clock::time_point now = failed_.ok() ? Clock::now() : failed_at_;
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    const bool judged = silence == Silence::kNow || (silence == Silence::kAsOfFailure && !failed_.ok());
    if (judged && silence_of(p, now) >= silence_limit_ms() &&
        (!failed_.ok() || !bytes_waiting(conn(p, 0).fd.get()))) {  // unread bytes: it spoke, this rank did not read
      out->push_back(p);
      continue;
    }
    bool lost = false;
    for (int k = 0; k < nconns_ && !lost; ++k) {
      Connection& c = conn(p, k);
      if (c.said_goodbye) break;
      if (c.closed) {
        lost = c.close_is_exit;
        continue;
      }
      if (!c.fd.valid()) continue;
      pollfd pfd{c.fd.get(), POLLRDHUP, 0};
      lost = ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }
    if (lost) out->push_back(p);
  }
}

// Judged on connection 0, as of the failure once failed (as find_lost judges it), except that
// unread bytes count as heard, also on a failed transport: heard_ moves only when this rank reads,
// and a routed rank whose call waited in the shared-memory part read none of its sockets meanwhile
// (its watcher only beats). Its hang trace took a socket peer that beat all along for the stalled
// rank (abi-process, several ranks per host: rank 0, 2.8 s without a poll, named rank 5 for the
// stopped rank 3; 4 runs in 40). With nothing unread, nothing came since the last read and the
// silence stands; a peer taken for heard is waited for, and named if it does not report.
int64_t SocketTransport::silent_ms(int peer) {
  Entry entry(*this);
  if (peer < 0 || peer >= size() || peer == rank()) return -1;
  if (bytes_waiting(conn(peer, 0).fd.get())) return 0;  // as find_lost asks it (poll skips a closed fd)
  return silence_of(peer, failed_.ok() ? Clock::now() : failed_at_);
}

// The one silence rule's reading (idle detection, a wait, the agreement, the hang trace): judged on
// connection 0, where heartbeats travel; not past a stashed frame, which hides what follows it (its
// receive is not posted yet); not without heartbeats, nor on a connection closed or said goodbye.
int64_t SocketTransport::silence_of(int peer, Clock::time_point now) {
  const Connection& c0 = conn(peer, 0);
  if (heartbeat_.count() == 0 || c0.closed || !c0.fd.valid() || c0.said_goodbye || c0.state == RecvState::kStashed)
    return -1;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - heard_[static_cast<size_t>(peer)]).count();
}

}  // namespace comm::transport::sock
