// Moving bytes: poll() over every connection, frames out of the send queues, headers
// checked and matched against posted receives, ERROR frames in both directions.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"
#include "common/arrivals.h"
#include "common/wire_check.h"
#include "socket/socket_transport_impl.h"

namespace comm::transport::sock {

// ---- progress --------------------------------------------------------------------------------

// Every live data connection, watched for input (so ERROR frames and closes are seen even
// from peers this wait does not involve) -- except a stashed one, whose next bytes belong to a
// receive not posted yet -- and for output while it has something to send. true: a TLS session holds bytes it read
// already, which poll() cannot report: the caller polls without blocking.
bool SocketTransport::collect_polls(std::vector<pollfd>* pfds, std::vector<size_t>* conn_of) {
  bool buffered = false;
  for (size_t i = 0; i < conns_.size(); ++i) {
    Connection& c = conns_[i];
    if (c.closed || !c.fd.valid()) continue;
    buffered = buffered || (c.state != RecvState::kStashed && conn_buffered(c));
    short events = 0;
    if (c.state != RecvState::kStashed) events |= POLLIN;
    if (!c.sends.empty() || c.beat_left != 0) events |= POLLOUT;
    if (events == 0 && c.hup_seen) continue;
    pfds->push_back({c.fd.get(), events, 0});
    conn_of->push_back(i);
  }
  return buffered;
}

// Moves what poll() said is ready, for entries [from, to). Readiness is a hint: the progress
// thread polls without the lock, so a connection may have moved on (or closed) meanwhile;
// every read and write is non-blocking, and a connection whose descriptor changed is skipped.
Status SocketTransport::handle_polls(const std::vector<pollfd>& pfds, const std::vector<size_t>& conn_of, size_t from,
                                     size_t to) {
  for (size_t k = from; k < to; ++k) {
    Connection& c = conns_[conn_of[k]];
    short re = pfds[k].revents;
    if (c.state != RecvState::kStashed && conn_buffered(c)) re |= POLLIN;  // read already, by TLS
    if (re == 0) continue;
    if (c.closed || c.fd.get() != pfds[k].fd) continue;
    // Read before writing: a peer that failed sends an ERROR frame naming the cause, then exits,
    // and its kernel resets the connection if our data was still unread; the reset fails our
    // next write, but the frame before it is still readable, and it, not "rank N reset its
    // connection", must be what this rank learns (with sends queued ahead, as the ring does, our
    // data is often unread when the peer exits).
    if (c.state == RecvState::kStashed) {
      if (re & (POLLERR | POLLHUP)) c.hup_seen = true;
    } else if (re & (POLLIN | POLLERR | POLLHUP)) {
      COMM_RETURN_IF_ERROR(recv_progress(c));
    }
    if (c.closed) continue;
    if ((!c.sends.empty() || c.beat_left != 0) && (re & (POLLOUT | POLLERR | POLLHUP))) send_progress(c);
  }
  return Status::Ok();
}

Status SocketTransport::progress(int timeout_ms) {
  pfds_.clear();
  pfd_conn_.clear();
  pfds_.push_back({wake_.get(), POLLIN, 0});
  pfd_conn_.push_back(0);
  if (collect_polls(&pfds_, &pfd_conn_)) timeout_ms = 0;
  // The listener (peers connect on first use, for the job's life), handshakes and dials.
  const size_t first_mesh = pfds_.size();
  if (mesh_) {
    Clock::time_point now = Clock::now(), wake = now + std::chrono::milliseconds(timeout_ms);
    mesh_->add_polls(&pfds_, &wake);
    if (timeout_ms > 0) timeout_ms = wake <= now ? 0 : ProgressClock::ceil_ms(wake - now, timeout_ms);
  }
  int rc = ::poll(pfds_.data(), pfds_.size(), timeout_ms);
  if (rc < 0) {
    if (errno == EINTR) return Status::Ok();
    return SystemError(me() + ": poll() failed: " + errno_string(errno));
  }
  if (mesh_) {
    new_links_.clear();
    failures_.clear();
    if (rc > 0) COMM_RETURN_IF_ERROR(mesh_->on_poll(pfds_.data() + first_mesh, pfds_.size() - first_mesh,
                                                    &new_links_, &failures_));
    mesh_->on_time(&failures_);
    for (auto& link : new_links_) install(link);
    for (const auto& f : failures_) unreachable(f);
  }
  if (rc == 0 && timeout_ms != 0) return Status::Ok();
  if (pfds_[0].revents & POLLIN) {
    // Drain wake()'s signal so the next poll blocks again (abort is also kept in aborted_).
    uint64_t count = 0;
    ssize_t ignored = ::read(wake_.get(), &count, sizeof count);
    (void)ignored;
  }
  return handle_polls(pfds_, pfd_conn_, 1, first_mesh);
}

void SocketTransport::send_progress(Connection& c) {
  if (c.beat_left != 0 && !flush_beat(c)) return;  // a heartbeat's rest goes before the next frame
  while (!c.sends.empty() && !c.closed)
    if (!write_head_frame(c)) return;
}

bool SocketTransport::write_head_frame(Connection& c) {
  for (;;) {
    Part& p = part(c.sends.head);
    Request& r = owner(c.sends.head);
    if (p.done == 0) {
      FrameHeader& h = c.send_hdr;
      h = FrameHeader{};
      h.magic = kFrameMagic;
      h.kind = static_cast<uint8_t>(FrameKind::kData);
      h.coll = static_cast<uint8_t>(r.tag.coll);
      h.dtype = r.tag.dtype;
      h.op = r.tag.op;
      h.root = r.tag.root;
      h.seq = r.tag.seq;
      h.count = r.tag.count;
      h.total_bytes = r.bytes;
      h.offset = p.offset;
      h.length = p.length;
    }
    iovec iov[2];
    int niov = 0;
    if (p.done < kHeaderBytes)
      iov[niov++] = {reinterpret_cast<char*>(&c.send_hdr) + p.done, static_cast<size_t>(kHeaderBytes - p.done)};
    uint64_t payload_done = p.done > kHeaderBytes ? p.done - kHeaderBytes : 0;
    if (payload_done < p.length)
      iov[niov++] = {r.buf + p.offset + payload_done, static_cast<size_t>(p.length - payload_done)};
    ssize_t n = conn_send(c, iov, niov);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (!would_block(errno)) close_after_send_error(c, errno);
      return false;
    }
    moved_ += static_cast<uint64_t>(n);
    p.done += static_cast<uint64_t>(n);
    if (p.done < kHeaderBytes + p.length) return false;  // the socket buffer is full
    pop(c.sends);
    p.finished = true;
    part_done(r);
    return true;
  }
}

void SocketTransport::close_after_send_error(Connection& c, int err) {
  // A peer that failed wrote an ERROR frame naming the cause, then exited, and its kernel reset
  // the connection because our data was unread. The frame is still readable before the reset:
  // read it, so that this rank's next wait reports it (through thread_failed_, which every wait
  // and test take first) rather than "rank N reset its connection", which blames a healthy rank.
  // With sends queued ahead (the ring) our data is often unread when such a peer exits.
  if (c.state != RecvState::kStashed) {
    Status st = recv_progress(c);
    if (!st.ok() && thread_failed_.ok()) thread_failed_ = st;
  }
  if (!c.closed) close_connection(c, "reset its connection (" + errno_string(err) + ")", true);
}

// false: stop reading this connection for now (would block, or it closed).
bool SocketTransport::handle_recv_result(Connection& c, ssize_t n) {
  if (n > 0) {
    moved_ += static_cast<uint64_t>(n);
    if (heartbeat_.count() != 0) heard_[static_cast<size_t>(c.peer)] = Clock::now();
    return true;
  }
  if (n == 0) {
    bool clean = c.state == RecvState::kHeader && c.hdr_got == 0;
    close_connection(c, clean ? "closed its connection" : "closed its connection in the middle of a frame", true);
    return false;
  }
  if (errno == EINTR) return true;
  if (errno == EPROTO && c.tls)  // a record that does not authenticate, or the peer's TLS alert
    close_connection(c, "broke TLS on its connection (" + c.tls->why() + ")", false);
  else if (!would_block(errno))
    close_connection(c, "reset its connection (" + errno_string(errno) + ")", true);
  return false;
}

Status SocketTransport::recv_progress(Connection& c) {
  for (;;) {
    if (c.closed) return Status::Ok();
    switch (c.state) {
      case RecvState::kStashed:
        return Status::Ok();
      case RecvState::kHeader: {
        // Only the header: the payload goes straight into the matching receive's buffer.
        ssize_t n = conn_recv(c, reinterpret_cast<char*>(&c.recv_hdr) + c.hdr_got, kHeaderBytes - c.hdr_got);
        if (!handle_recv_result(c, n)) return Status::Ok();
        if (n < 0) continue;
        c.hdr_got += static_cast<size_t>(n);
        if (c.hdr_got < kHeaderBytes) continue;
        c.hdr_got = 0;
        COMM_RETURN_IF_ERROR(on_header(c));
        break;
      }
      case RecvState::kPayload: {
        Part& p = part(c.receives.head);
        Request& r = owner(c.receives.head);
        ssize_t n = conn_recv(c, r.buf + p.offset + p.done, static_cast<size_t>(p.length - p.done));
        if (!handle_recv_result(c, n)) return Status::Ok();
        if (n < 0) continue;
        p.done += static_cast<uint64_t>(n);
        if (p.done < p.length) continue;
        pop(c.receives);
        p.finished = true;
        part_done(r);
        c.state = RecvState::kHeader;
        break;
      }
      case RecvState::kErrorText: {
        size_t need = static_cast<size_t>(c.recv_hdr.length);
        ssize_t n = conn_recv(c, c.error_text + c.text_got, need - c.text_got);
        if (!handle_recv_result(c, n)) return Status::Ok();
        if (n < 0) continue;
        c.text_got += static_cast<size_t>(n);
        if (c.text_got == need) return peer_reported(c);
        break;
      }
    }
  }
}

// Everything in the header came from the wire: check it before it indexes anything.
Status SocketTransport::on_header(Connection& c) {
  const FrameHeader& h = c.recv_hdr;
  auto garbage = [&](const std::string& what) {
    close_connection(c, "sent a malformed frame (" + what + ") and its connection was closed", false);
    return Status::Ok();
  };
  const std::string problem = frame_problem(h);
  if (!problem.empty()) return garbage(problem);
  if (h.kind == static_cast<uint8_t>(FrameKind::kError)) {
    c.text_got = 0;
    if (h.length == 0) return peer_reported(c);
    c.state = RecvState::kErrorText;
    return Status::Ok();
  }
  if (h.kind == static_cast<uint8_t>(FrameKind::kHeartbeat) || h.kind == static_cast<uint8_t>(FrameKind::kGoodbye)) {
    if (h.kind == static_cast<uint8_t>(FrameKind::kGoodbye)) c.said_goodbye = true;
    moved_ -= kHeaderBytes;  // not progress: a peer that only beats still times out a wait on it
    return Status::Ok();  // a bare header: the next frame follows
  }
  OpTag arrival;  // straggler detection counts arrivals, also before their receive is posted
  arrival.seq = h.seq;
  arrival.coll = static_cast<CollKind>(h.coll);
  arrived(c.peer, arrival);
  c.state = RecvState::kStashed;
  c.hup_seen = false;
  if (c.receives.empty()) return c.index == 0 && !any_recvs_.empty() ? match_any() : Status::Ok();
  return match(c);
}

// The stashed header against the oldest receive expected on this connection.
Status SocketTransport::match(Connection& c) {
  const FrameHeader& h = c.recv_hdr;
  Part& p = part(c.receives.head);
  Request& r = owner(c.receives.head);
  OpTag got;
  got.seq = h.seq;
  got.coll = static_cast<CollKind>(h.coll);
  got.dtype = h.dtype;
  got.op = h.op;
  got.root = h.root;
  got.count = h.count;
  std::string them = "rank " + std::to_string(r.peer);
  std::string us = "rank " + std::to_string(rank()) + " (this rank)";
  COMM_RETURN_IF_ERROR(check_arrival(them, got, h.total_bytes, us, r.tag, r.bytes));
  if (h.offset != p.offset || h.length != p.length)
    return InvalidUsage(them + " sent bytes [" + std::to_string(h.offset) + ", +" + std::to_string(h.length) +
                        ") of " + describe(got) + " on connection #" + std::to_string(c.index) + " but " + us +
                        " expects [" + std::to_string(p.offset) + ", +" + std::to_string(p.length) +
                        ") there (different COMM_SOCKET_NCONNS?)");
  c.hup_seen = false;
  r.flowing = true;
  if (p.length > 0) {
    c.state = RecvState::kPayload;
    return Status::Ok();
  }
  pop(c.receives);
  p.finished = true;
  part_done(r);
  c.state = RecvState::kHeader;
  return Status::Ok();
}

Status SocketTransport::peer_reported(Connection& c) {
  std::string text(c.error_text, c.text_got);
  for (auto& ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f) ch = '?';
  c.state = RecvState::kHeader;
  // INVALID_USAGE stays INVALID_USAGE: every rank then reports the disagreement itself.
  comm_status_t code = c.recv_hdr.status == COMM_ERR_INVALID_USAGE ? COMM_ERR_INVALID_USAGE : COMM_ERR_REMOTE;
  // Kept, not returned: the peer's data of operations before the one it names (the header's seq:
  // OpTag::order) may still be on its way on other connections, or a third rank's, and the waits
  // on those operations still complete (drive() and test() take the report when it concerns them).
  // A hang (a timeout report) is marked for the core's trace when a wait takes it.
  keep_report(Status(code, "rank " + std::to_string(c.peer) + " reported: " + text), c.recv_hdr.seq,
              c.recv_hdr.status == COMM_ERR_TIMEOUT);
  return Status::Ok();
}

void SocketTransport::close_connection(Connection& c, const std::string& reason, bool is_exit) {
  if (c.closed) return;
  c.closed = true;
  c.close_reason = reason;
  c.close_is_exit = is_exit;
  bool quiet = is_exit && reason == "closed its connection";  // a peer that finished and left
  if (quiet)
    COMM_INFO(kNet, "%s: rank %d %s (connection #%d, %s)", me().c_str(), c.peer, reason.c_str(), c.index,
              c.remote.c_str());
  else
    COMM_WARN(kNet, "%s: rank %d %s (connection #%d, %s)", me().c_str(), c.peer, reason.c_str(), c.index,
              c.remote.c_str());
  c.fd.reset();
}

// ---- failure propagation ---------------------------------------------------------------------

void SocketTransport::notify_peers(const Status& failure, uint64_t order) {
  Entry entry(*this);
  Status reason = failure.ok() ? Internal(me() + ": notify_peers called without a failure") : failure;
  std::string text = reason.message().substr(0, kMaxNotifyText);
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = static_cast<uint8_t>(FrameKind::kError);
  h.coll = static_cast<uint8_t>(CollKind::kInternal);
  h.root = rank();
  h.seq = order;  // the operation it concerns (OpTag::order); 0, as before, concerns every one
  h.status = static_cast<uint32_t>(reason.code());
  h.total_bytes = text.size();
  h.length = text.size();
  const size_t total = kHeaderBytes + text.size();

  // Peers dialing this rank right now are waiting on it: finish their handshakes so they hear
  // the reason too; then stop listening, so later dialers are refused at once.
  if (mesh_) {
    pfds_.clear();
    Clock::time_point wake = Clock::now();
    mesh_->add_polls(&pfds_, &wake);
    new_links_.clear();
    failures_.clear();
    if (::poll(pfds_.data(), pfds_.size(), 0) > 0 &&
        mesh_->on_poll(pfds_.data(), pfds_.size(), &new_links_, &failures_).ok()) {
      pfds_.clear();
      mesh_->add_polls(&pfds_, &wake);  // the handshakes just accepted
      if (::poll(pfds_.data(), pfds_.size(), 10) > 0)
        (void)mesh_->on_poll(pfds_.data(), pfds_.size(), &new_links_, &failures_);
    }
    for (auto& link : new_links_) install(link);
    mesh_->stop_listening();
  }
  // Every connection: one in the middle of a frame first finishes that frame (its buffer is the
  // failing call's, still valid), else its receiver, reading that frame, would see the close cut
  // it and blame this rank; with sends queued ahead (the ring) a connection is mid-frame most of
  // the time. A receiver stalled on one connection (a stashed header) may still see the others.
  struct Out {
    Connection* c;
    size_t sent;
    bool gone;  // the peer is gone: nothing to tell
  };
  std::vector<Out> outs;
  for (auto& c : conns_) {
    if (c.closed || !c.fd.valid()) continue;
    outs.push_back({&c, 0, false});
  }
  const Clock::time_point deadline = Clock::now() + kNotifyBudget;
  std::vector<pollfd> pending;
  size_t told = 0;
  for (;;) {
    pending.clear();
    told = 0;
    for (auto& o : outs) {
      Connection& c = *o.c;
      if (o.sent == 0 && !c.closed && mid_frame(c)) {
        if (c.beat_left != 0) (void)flush_beat(c);
        else (void)write_head_frame(c);
        if (c.closed) {
          o.sent = total;
          o.gone = true;
        } else if (mid_frame(c)) {
          pending.push_back({c.fd.get(), POLLOUT, 0});
          continue;
        }
      }
      const int fd = c.fd.get();
      while (o.sent < total) {
        iovec iov[2];
        int niov = 0;
        if (o.sent < kHeaderBytes) iov[niov++] = {reinterpret_cast<char*>(&h) + o.sent, kHeaderBytes - o.sent};
        size_t text_done = o.sent > kHeaderBytes ? o.sent - kHeaderBytes : 0;
        if (text_done < text.size()) iov[niov++] = {text.data() + text_done, text.size() - text_done};
        ssize_t n = conn_send(c, iov, niov);
        if (n > 0) {
          o.sent += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          if (n < 0 && !would_block(errno)) {
            o.sent = total;
            o.gone = true;
          }
          break;
        }
      }
      if (o.sent < total) pending.push_back({fd, POLLOUT, 0});
      else if (!o.gone) ++told;
    }
    Clock::time_point now = Clock::now();
    if (pending.empty() || now >= deadline) break;
    if (::poll(pending.data(), pending.size(), ProgressClock::ceil_ms(deadline - now, kMaxBlockMs)) < 0 && errno != EINTR) break;
  }
  COMM_INFO(kNet, "%s: told %zu of %zu connection(s) of its peers that it failed: %s", me().c_str(), told,
            outs.size(), text.c_str());
  (void)fail(reason);
}

}  // namespace comm::transport::sock
