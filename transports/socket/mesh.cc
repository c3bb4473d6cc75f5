#include "socket/mesh.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "log.h"
#include "socket/mesh_states.h"
#include "socket/wire.h"

namespace comm::transport::sock {

Mesh::Mesh(MeshConfig config) : c_(std::move(config)) {
  linked_.assign(static_cast<size_t>(c_.size) * static_cast<size_t>(c_.nconns), 0);
}

Mesh::~Mesh() = default;

std::string Mesh::me() const { return c_.label + (c_.label.empty() ? "" : " ") + "rank " + std::to_string(c_.rank); }

Status Mesh::start() {
  std::vector<posix::Endpoint> published;
  std::string skipped;
  // The backlog covers every peer dialing at once (the kernel caps it at somaxconn).
  Status st = posix::listen_on_each(c_.listen, c_.size * c_.nconns + 16, &listeners_, &published, &skipped);
  if (!st.ok()) {
    if (posix::out_of_fds(errno)) st = SystemError(posix::out_of_fds_text(errno, "opening its listening socket"));
    st = st.prefixed(me() + ": socket transport: ");
    // Told through the table, every rank fails now naming this one instead of timing out.
    (void)c_.store->set("addr/" + std::to_string(c_.rank), "!" + st.message());
    return st;
  }
  if (!skipped.empty()) COMM_INFO(kNet, "%s: socket transport not listening on %s", me().c_str(), skipped.c_str());
  listen_text_ = posix::encode_endpoints(published);
  // Published before anything waits: a test (or an operator's probe) can find it here.
  COMM_RETURN_IF_ERROR(c_.store->set("addr/" + std::to_string(c_.rank), listen_text_));
  COMM_INFO(kNet, "%s: socket transport listening on %s", me().c_str(), listen_text_.c_str());
  return read_table();
}

Status Mesh::adopt(std::vector<Fd> listeners, std::vector<std::string> table) {
  if (listeners.empty() || static_cast<int>(table.size()) != c_.size)
    return Internal(me() + ": socket transport: the early listener's table has " + std::to_string(table.size()) +
                    " entries for " + std::to_string(c_.size) + " ranks");
  listeners_ = std::move(listeners);
  addrs_ = std::move(table);
  listen_text_ = addrs_[static_cast<size_t>(c_.rank)];
  COMM_INFO(kNet, "%s: socket transport listening on %s (address table from the init verdict)", me().c_str(),
            listen_text_.c_str());
  return Status::Ok();
}

// Rank 0 gathers "addr/<r>" into "addrs"; every other rank reads that one key.
Status Mesh::read_table() {
  Deadline deadline = Deadline::after_ms(c_.timeout_ms);
  addrs_.assign(static_cast<size_t>(c_.size), "");
  addrs_[static_cast<size_t>(c_.rank)] = listen_text_;
  if (c_.rank == 0) {
    std::string missing, table = listen_text_;
    for (int peer = 1; peer < c_.size; ++peer) {
      std::string text;
      // Past the deadline the rest are only looked at, so the message lists every missing rank.
      Deadline until = missing.empty() ? deadline : Deadline::after_ms(0);
      Status st = c_.store->get("addr/" + std::to_string(peer), &text, until);
      if (!st.ok() && st.code() != COMM_ERR_TIMEOUT) return give_up_table(st);  // a watched wait's verdict
      if (!st.ok()) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
        continue;
      }
      addrs_[static_cast<size_t>(peer)] = text;
      table += "\n" + text;
    }
    if (!missing.empty())
      return give_up_table(Timeout(me() + ": socket transport setup timed out after " + std::to_string(c_.timeout_ms) +
                                   " ms: rank(s) " + missing +
                                   " never published their socket address (did they start? are they stuck before "
                                   "their socket setup?)"));
    COMM_RETURN_IF_ERROR(c_.store->set("addrs", table));
  } else {
    std::string table;
    Status st = c_.store->get("addrs", &table, deadline);
    if (!st.ok())
      return Status(st.code(), me() + ": rank 0 never published the socket address table (did every rank start?): " +
                                   st.message());
    if (!table.empty() && table[0] == '!')
      return RemoteError(me() + ": socket transport setup: rank 0 gave it up: " + table.substr(1));
    size_t pos = 0;
    for (int peer = 0; peer < c_.size; ++peer) {
      size_t end = table.find('\n', pos);
      if (end == std::string::npos) end = table.size();
      if (pos > table.size()) return Internal(me() + ": the socket address table has fewer than " +
                                              std::to_string(c_.size) + " entries (different world sizes?)");
      if (peer != c_.rank) addrs_[static_cast<size_t>(peer)] = table.substr(pos, end - pos);
      pos = end + 1;
    }
  }
  for (int peer = 0; peer < c_.size; ++peer) {
    const std::string& text = addrs_[static_cast<size_t>(peer)];
    if (!text.empty() && text[0] == '!')
      return SystemError(me() + ": rank " + std::to_string(peer) + " could not set up its socket transport: " +
                         text.substr(1));
  }
  return Status::Ok();
}

// Rank 0 tells the others why there is no table, so they fail now instead of at their timeout.
Status Mesh::give_up_table(Status why) {
  (void)c_.store->set("addrs", "!" + why.message());
  return why;
}

Status Mesh::connect_all(std::vector<MeshLink>* done) {
  // The higher rank dials (the rule that wins anyway): nobody's dial is answered kYield.
  for (int peer = 0; peer < c_.rank; ++peer) want(peer, c_.nconns);
  const size_t expected = static_cast<size_t>(c_.size - 1) * static_cast<size_t>(c_.nconns);
  Deadline deadline = Deadline::after_ms(c_.timeout_ms);
  std::vector<pollfd> pfds;
  std::vector<MeshFailure> failed;
  while (connected_ < expected) {
    if (!failed.empty())
      return SystemError(me() + ": socket transport setup: rank " + std::to_string(failed[0].peer) + " " +
                         failed[0].reason);
    Clock::time_point now = Clock::now();
    if (now >= deadline.at()) {
      std::string missing;
      for (int peer = c_.rank + 1; peer < c_.size; ++peer)
        if (linked_[slot(peer, 0)] != kLinked || linked_[slot(peer, c_.nconns - 1)] != kLinked)
          missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
      std::string text = me() + ": socket transport setup timed out after " + std::to_string(c_.timeout_ms) +
                         " ms (listening on " + listen_text_ + ")";
      if (!missing.empty()) text += ": rank(s) " + missing + " never connected to this rank";
      int last_peer = -1;
      for (const auto& o : outgoing_) {
        if (o.state == OutState::kDone || o.peer == last_peer) continue;
        last_peer = o.peer;
        text += "; could not connect to rank " + std::to_string(o.peer) + " (" + attempts_text(o.peer) + ")";
      }
      return Timeout(text);
    }
    pfds.clear();
    Clock::time_point wake = std::min(deadline.at(), now + std::chrono::seconds(1));
    add_polls(&pfds, &wake);
    int timeout_ms = static_cast<int>(std::clamp<int64_t>(
        std::chrono::ceil<std::chrono::milliseconds>(wake - now).count(), 0, 1000));
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) return SystemError(me() + ": poll() failed during setup: " + errno_string(errno));
    if (rc > 0) COMM_RETURN_IF_ERROR(on_poll(pfds.data(), pfds.size(), done, &failed));
    on_time(&failed);
  }
  COMM_INFO(kNet, "%s: socket mesh complete (%d ranks, %d connections per peer)", me().c_str(), c_.size, c_.nconns);
  return Status::Ok();
}

void Mesh::add_polls(std::vector<pollfd>* pfds, Clock::time_point* wake) {
  for (const auto& l : listeners_) pfds->push_back({l.get(), POLLIN, 0});
  for (auto& in : incoming_) pfds->push_back({in.fd.get(), in.tls.session ? in.tls.events : short{POLLIN}, 0});
  for (auto& o : outgoing_) {
    short events = 0;
    if (o.state == OutState::kWaitRetry) *wake = std::min(*wake, std::max(o.retry_at, Clock::now()));
    // An unanswered TCP handshake is a miss at its deadline (mesh_dial.cc).
    if (o.state == OutState::kConnecting)
      *wake = std::min(*wake, o.dial_started + std::chrono::milliseconds(c_.connect_timeout_ms));
    if (o.state == OutState::kConnecting || o.state == OutState::kSendHello) events = POLLOUT;
    if (o.state == OutState::kAwaitReply) events = POLLIN;
    if (o.state == OutState::kTls) events = o.tls.events;
    // Every outgoing gets an entry (events 0 while it waits to retry): on_poll maps by position.
    pfds->push_back({events != 0 ? o.fd.get() : -1, events, 0});
  }
}

Status Mesh::on_poll(const pollfd* pfds, size_t n, std::vector<MeshLink>* done, std::vector<MeshFailure>* failed) {
  COMM_RETURN_IF_ERROR(fatal_);
  size_t k = 0;
  bool accept_ready = false;
  for (size_t l = 0; l < listeners_.size() && k < n; ++l) accept_ready = (pfds[k++].revents & POLLIN) != 0 || accept_ready;
  const size_t n_in = incoming_.size(), n_out = outgoing_.size();
  for (size_t i = 0; i < n_in && k < n; ++i, ++k)
    if (pfds[k].revents != 0 && incoming_[i].fd.valid()) COMM_RETURN_IF_ERROR(on_incoming(incoming_[i], done));
  for (size_t i = 0; i < n_out && k < n; ++i, ++k)
    if (pfds[k].revents != 0 && outgoing_[i].state != OutState::kDone && outgoing_[i].state != OutState::kMissed)
      COMM_RETURN_IF_ERROR(on_outgoing(outgoing_[i], done, failed));
  std::erase_if(incoming_, [](const Incoming& in) { return !in.fd.valid(); });
  std::erase_if(outgoing_, [](const Outgoing& o) { return o.state == OutState::kDone; });
  if (accept_ready) COMM_RETURN_IF_ERROR(accept_all());
  return Status::Ok();
}

Status Mesh::accept_all() {
  for (const auto& listener : listeners_) {
    for (;;) {
      int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (posix::out_of_fds(errno)) {
          fatal_ = SystemError(me() + ": socket transport " +
                               posix::out_of_fds_text(errno, "accepting a peer's connection"));
          return fatal_;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          COMM_WARN(kNet, "%s: accept() failed: %s", me().c_str(), errno_string(errno).c_str());
        break;
      }
      Incoming in;
      in.fd.reset(fd);
      in.remote = peer_address(fd);
      if (incoming_.size() >= kMaxPendingAccepts) {
        drop(incoming_.front(), "too many unfinished handshakes; shedding the oldest");
        incoming_.erase(incoming_.begin());
      }
      incoming_.push_back(std::move(in));
    }
  }
  return Status::Ok();
}

Status Mesh::on_incoming(Incoming& in, std::vector<MeshLink>* done) {
  if (in.tls.session) return tls_accepted(in, done);
  for (;;) {
    // First the Hello, then (after the challenge) the Proof.
    const size_t want = in.challenged ? sizeof(Proof) : sizeof(Hello);
    if (in.got == want) {
      if (in.challenged) return validate(in, done);
      if (!challenge(in)) return Status::Ok();
      continue;
    }
    char* dst = (in.challenged ? reinterpret_cast<char*>(&in.proof) : reinterpret_cast<char*>(&in.hello)) + in.got;
    ssize_t n = ::recv(in.fd.get(), dst, want - in.got, MSG_DONTWAIT);
    if (n == 0) {
      // Quiet: a dial that lost to the peer's own (see validate) ends this way, and so does
      // init's reachability probe (libcomm/src/reachability.cc) and a dial attempt whose sibling
      // connected first (mesh_dial.cc), before any byte.
      drop(in, in.got == 0 && !in.challenged
                   ? "closed the connection before sending a handshake (as init's reachability probe does, "
                     "and a dial whose other address connected first)"
                   : "closed the connection before completing the handshake",
           true);
      return Status::Ok();
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      // A reset: a dialer whose other attempt (or whose peer's crossing dial) won closed this one.
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        drop(in, "handshake read failed: " + errno_string(errno), errno == ECONNRESET);
      return Status::Ok();
    }
    in.got += static_cast<size_t>(n);
    if (in.challenged) continue;
    if (in.got >= sizeof(uint64_t) && in.hello.magic != kHelloMagic) {
      drop(in, "sent garbage (bad handshake magic; not a libcomm peer?)");
      return Status::Ok();
    }
    // The version as soon as it arrives: an older peer's Hello may be shorter than ours.
    if (in.got >= offsetof(Hello, rank) && in.hello.version != kProtocolVersion) {
      // A peer of another version is told ours, so its message can say which.
      reply(in, static_cast<uint32_t>(ReplyCode::kBadVersion), kProtocolVersion);
      drop(in, hello_problem(in.hello));
      return Status::Ok();
    }
  }
}

bool Mesh::challenge(Incoming& in) {
  const std::string problem = hello_problem(in.hello);
  if (!problem.empty()) {
    drop(in, problem);
    return false;
  }
  if (in.hello.target != c_.rank) {
    // A dial meant for another rank: an address that several hosts have led it here. The
    // dialer moves on to the peer's next address (mesh_dial.cc); nothing is wrong with this rank.
    reply(in, static_cast<uint32_t>(ReplyCode::kWrongRank), static_cast<uint32_t>(c_.rank));
    drop(in, "dialed rank " + std::to_string(in.hello.target) + " (claims rank " + std::to_string(in.hello.rank) +
                 "); told it this is rank " + std::to_string(c_.rank), true);
    return false;
  }
  Status st = random_nonce(&in.server_nonce);
  if (!st.ok()) {
    drop(in, st.message());
    return false;
  }
  if (!reply(in, static_cast<uint32_t>(ReplyCode::kChallenge), 0, in.server_nonce.data(), in.server_nonce.size())) {
    drop(in, "could not be sent the handshake challenge: " + errno_string(errno));
    return false;
  }
  in.challenged = true;
  in.got = 0;
  return true;
}

Status Mesh::validate(Incoming& in, std::vector<MeshLink>* done) {
  const Hello& h = in.hello;
  Nonce client_nonce;
  std::memcpy(client_nonce.data(), h.nonce, client_nonce.size());
  if (in.proof.magic != kProofMagic ||
      !check_proof(c_.secret, context_for(c_.rank), Prover::kClient, client_nonce, in.server_nonce, in.proof.proof)) {
    reply(in, static_cast<uint32_t>(ReplyCode::kBadSecret), 0);
    drop(in, "could not prove it holds this job's secret (claimed rank " + std::to_string(h.rank) + ")");
    return Status::Ok();
  }
  // From here on the peer holds this job's secret: a disagreement is the job's misconfiguration.
  std::string who = "rank " + std::to_string(h.rank) + " at " + in.remote;
  if (h.size != c_.size) {
    reply(in, static_cast<uint32_t>(ReplyCode::kSizeMismatch), static_cast<uint32_t>(c_.size));
    drop(in, "has world size " + std::to_string(h.size));
    return InvalidUsage(me() + ": " + who + " has world size " + std::to_string(h.size) + " but this rank has " +
                        std::to_string(c_.size));
  }
  if (h.nconns != static_cast<uint32_t>(c_.nconns)) {
    reply(in, static_cast<uint32_t>(ReplyCode::kNconnsMismatch), static_cast<uint32_t>(c_.nconns));
    drop(in, "uses " + std::to_string(h.nconns) + " connections per peer");
    return InvalidUsage(me() + ": " + who + " uses COMM_SOCKET_NCONNS=" + std::to_string(h.nconns) +
                        " but this rank uses " + std::to_string(c_.nconns) + "; set the same value on every rank");
  }
  if (((h.flags & kHelloTls) != 0) != (c_.tls != nullptr)) {
    reply(in, static_cast<uint32_t>(ReplyCode::kTlsMismatch), c_.tls != nullptr ? 1 : 0);
    drop(in, c_.tls != nullptr ? "does not run TLS (COMM_TLS=0)" : "runs TLS (COMM_TLS=1)");
    return InvalidUsage(me() + ": " + who + (c_.tls != nullptr ? " runs without TLS (COMM_TLS=0) but this rank requires it"
                                                              : " runs TLS (COMM_TLS=1) but this rank does not") +
                        "; set the same COMM_TLS on every rank");
  }
  if (h.rank < 0 || h.rank == c_.rank || h.rank >= c_.size || h.conn_index >= h.nconns) {
    reply(in, static_cast<uint32_t>(ReplyCode::kBadRank), 0);
    drop(in, "claimed rank " + std::to_string(h.rank) + " connection #" + std::to_string(h.conn_index) +
                 ", which never connects to this rank");
    return Status::Ok();
  }
  const int index = static_cast<int>(h.conn_index);
  if (linked_[slot(h.rank, index)] == kLinked) {
    // A dial that crossed ours and lost: quiet, it is part of the protocol.
    reply(in, static_cast<uint32_t>(ReplyCode::kDuplicate), 0);
    drop(in, "claimed rank " + std::to_string(h.rank) + " connection #" + std::to_string(index) +
                 ", which is already connected", true);
    return Status::Ok();
  }
  for (auto& o : outgoing_) {
    if (o.peer != h.rank || o.index != index || o.state == OutState::kDone) continue;
    if (h.rank < c_.rank) {
      // Both dialed: the higher rank's dial (ours) wins; the peer waits for it.
      reply(in, static_cast<uint32_t>(ReplyCode::kYield), 0);
      drop(in, "dialed connection #" + std::to_string(index) + " while this rank dials it (this dial wins)", true);
      return Status::Ok();
    }
    o.fd.reset();  // the peer's dial wins: ours is abandoned
    o.state = OutState::kDone;
  }
  // The acceptor's own proof goes with the kOk: the connector checks it (on_outgoing).
  const Digest mine = proof_of_secret(c_.secret, context_for(c_.rank), Prover::kServer, client_nonce, in.server_nonce);
  if (!reply(in, static_cast<uint32_t>(ReplyCode::kOk), 0, mine.data(), mine.size())) {
    drop(in, "could not be sent the handshake reply: " + errno_string(errno));
    return Status::Ok();
  }
  set_nodelay(in.fd.get());
  linked_[slot(h.rank, index)] = kLinked;
  ++connected_;
  if (c_.tls) {
    COMM_RETURN_IF_ERROR(tls_start(&in.tls, in.fd.get(), false));
    return tls_accepted(in, done);
  }
  COMM_INFO(kNet, "%s: rank %d connected (connection #%d, %s)", me().c_str(), h.rank, index, in.remote.c_str());
  done->push_back(MeshLink{h.rank, index, std::move(in.fd), in.remote, nullptr});
  return Status::Ok();
}

void Mesh::stop_listening() {
  listeners_.clear();
  incoming_.clear();
}

std::string Mesh::why_not_connected(int peer) const {
  for (const auto& o : outgoing_)
    if (o.peer == peer && o.state != OutState::kDone) return "dialing it: " + attempts_text(peer);
  if (linked_[slot(peer, 0)] == kPeerDials) return "it dials this rank (both dialed; its dial wins), not arrived yet";
  return "it never dialed this rank";
}

// The socket is fresh and its send buffer empty (the connector waits for each answer before it
// sends again): at most 48 bytes go out at once or not at all.
bool Mesh::reply(Incoming& in, uint32_t code, uint32_t value, const uint8_t* extra, size_t extra_bytes) {
  Reply r{kReplyMagic, code, value};
  std::string bytes(reinterpret_cast<const char*>(&r), sizeof r);
  bytes.append(reinterpret_cast<const char*>(extra), extra_bytes);
  return ::send(in.fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(bytes.size());
}

void Mesh::drop(Incoming& in, const std::string& why, bool quiet) {
  if (quiet)
    COMM_INFO(kNet, "%s: closed connection from %s: %s", me().c_str(), in.remote.c_str(), why.c_str());
  else
    COMM_WARN(kNet, "%s: dropped connection from %s: %s", me().c_str(), in.remote.c_str(), why.c_str());
  in.fd.reset();
}

}  // namespace comm::transport::sock
