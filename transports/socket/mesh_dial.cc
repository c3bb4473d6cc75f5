// The dialing half of the mesh (mesh.h): a connection to a peer is one attempt per address the
// peer published, tried Happy-Eyeballs style (RFC 8305; docs/topology.md, "Messy networks").
// The first starts at once, each next one kStaggerMs later, or at once when the one before it
// missed. An attempt misses on an answer that is final for that address (no route, network
// unreachable, refused, a listener that is not the rank dialed) and on a TCP handshake that goes
// unanswered for COMM_SOCKET_CONNECT_TIMEOUT_MS (a firewall that drops); the first attempt
// whose libcomm handshake completes wins and the others end. A peer fails only when every
// address missed, naming each with its interface and its error. What an attempt learned goes to
// the process's path memory (posix/path_memory.h), which orders the addresses of every later dial.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/arrivals.h"
#include "log.h"
#include "posix/path_memory.h"
#include "posix/path_probe.h"
#include "socket/mesh.h"
#include "socket/mesh_states.h"
#include "socket/wire.h"

namespace comm::transport::sock {
namespace {

// connect()'s answers that are final for one address: another address may still work.
bool final_for_address(int err) {
  return err == EHOSTUNREACH || err == ENETUNREACH || err == ENETDOWN || err == EHOSTDOWN || err == EADDRNOTAVAIL ||
         err == EAFNOSUPPORT || err == ETIMEDOUT || err == EACCES || err == EPERM;
}

std::string connect_error(int err) {
  return posix::probe_error_text(err, 0);
}

}  // namespace

std::string Mesh::context_for(int rank) const {
  const size_t r = static_cast<size_t>(rank);
  return proof_context(c_.label, rank, r < c_.host_of.size() ? c_.host_of[r] : 0);
}

void Mesh::want(int peer, int count) {
  if (peer < 0 || peer >= c_.size || peer == c_.rank) return;
  const std::string& text = addrs_[static_cast<size_t>(peer)];
  std::vector<posix::Endpoint> endpoints;
  const bool readable = posix::decode_endpoints(text, &endpoints);
  for (int index = 0; index < std::min(count, c_.nconns); ++index) {
    if (linked_[slot(peer, index)] != kNotLinked) continue;  // up, or the peer dials it
    bool under_way = false;
    for (const auto& o : outgoing_)
      under_way = under_way || (o.peer == peer && o.index == index && o.state != OutState::kDone);
    if (under_way) continue;
    const Clock::time_point now = Clock::now();
    if (!readable) {
      Outgoing o;
      o.peer = peer;
      o.index = index;
      o.where = text;
      o.retry_at = now;
      o.last_error = "published an unreadable socket address '" + text + "'";
      o.unusable = true;
      outgoing_.push_back(std::move(o));
      continue;
    }
    std::vector<Outgoing> attempts;
    for (const auto& e : endpoints) {
      Outgoing o;
      o.peer = peer;
      o.index = index;
      o.where = e.hostport;
      o.their_if = e.ifname;
      (void)parse_address(e.hostport, &o.addr);  // decode_endpoints parsed it
      (void)posix::route_toward(o.addr, &o.local_addr, &o.local_if);
      attempts.push_back(std::move(o));
    }
    // What earlier dials learned orders this one: paths to this host that worked first; then
    // paths not tried yet, those through a local interface that reached other hosts before those
    // through one that only failed elsewhere, each in the peer's order (its route to the store
    // first); then paths to this host that failed.
    auto rank_of = [](const Outgoing& o) {
      const posix::PathVerdict v = posix::path_verdict(o.local_if, posix::endpoint_host(o.where));
      if (v != posix::PathVerdict::kUnknown) return v == posix::PathVerdict::kWorks ? 0 : 4;
      const posix::PathVerdict i = posix::interface_verdict(o.local_if);
      return i == posix::PathVerdict::kWorks ? 1 : i == posix::PathVerdict::kUnknown ? 2 : 3;
    };
    std::stable_sort(attempts.begin(), attempts.end(),
                     [&](const Outgoing& a, const Outgoing& b) { return rank_of(a) < rank_of(b); });
    for (size_t k = 0; k < attempts.size(); ++k) {
      attempts[k].retry_at = now + std::chrono::milliseconds(kStaggerMs * static_cast<int>(k));
      COMM_INFO(kNet, "%s: connecting to rank %d (connection #%d) at %s%s, first needed now", me().c_str(), peer,
                index, attempts[k].where.c_str(),
                k == 0 ? "" : (" in " + std::to_string(kStaggerMs * static_cast<int>(k)) + " ms unless up by then").c_str());
      outgoing_.push_back(std::move(attempts[k]));
    }
  }
}

void Mesh::on_time(std::vector<MeshFailure>* failed) {
  Clock::time_point now = Clock::now();
  const auto deadline = std::chrono::milliseconds(c_.connect_timeout_ms);
  // By index: miss() may start a sibling, and give_up changes states, never the vector.
  for (size_t i = 0; i < outgoing_.size(); ++i) {
    Outgoing& o = outgoing_[i];
    if (o.state == OutState::kDone || o.state == OutState::kMissed) continue;
    // Only an address that cannot be dialed at all fails the peer at once.
    if (o.unusable) {
      give_up(o, o.last_error, false, failed);
      continue;
    }
    if (o.state == OutState::kConnecting && now - o.dial_started >= deadline) {
      miss(o, "no answer to the TCP handshake within " + std::to_string(c_.connect_timeout_ms) +
                  " ms (COMM_SOCKET_CONNECT_TIMEOUT_MS; a firewall that drops packets?)", failed);
      continue;
    }
    if (o.state == OutState::kWaitRetry && now >= o.retry_at) {
      Status st = start_connect(o, failed);
      if (!st.ok() && fatal_.ok()) fatal_ = st;
      if (o.state == OutState::kWaitRetry && o.refusals >= kRefusalsMeanGone)
        miss(o, "refused the connection (nothing listens there)", failed, true);
    }
  }
  std::erase_if(outgoing_, [](const Outgoing& o) { return o.state == OutState::kDone; });
}

Status Mesh::start_connect(Outgoing& o, std::vector<MeshFailure>* failed) {
  o.fd.reset(::socket(o.addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!o.fd.valid()) {
    if (posix::out_of_fds(errno))
      return SystemError(me() + ": socket transport " +
                         posix::out_of_fds_text(errno, "connecting to rank " + std::to_string(o.peer)));
    retry(o, "socket(): " + errno_string(errno));
    return Status::Ok();
  }
  // A fresh nonce per attempt: no two handshakes of this rank are alike.
  Status st = random_nonce(&o.nonce);
  if (!st.ok()) return st.prefixed(me() + ": socket transport: ");
  Hello h{kHelloMagic, kProtocolVersion, c_.rank, c_.size, static_cast<uint32_t>(o.index),
          static_cast<uint32_t>(c_.nconns), c_.tls != nullptr ? kHelloTls : 0, {}, o.peer, 0};
  std::memcpy(h.nonce, o.nonce.data(), sizeof h.nonce);
  o.out.assign(reinterpret_cast<const char*>(&h), sizeof h);
  o.proved = false;
  o.sent = 0;
  o.got = 0;
  o.started = true;
  o.dial_started = Clock::now();
  if (::connect(o.fd.get(), o.addr.get(), o.addr.len) == 0) {
    o.state = OutState::kSendHello;
  } else if (errno == EINPROGRESS || errno == EINTR) {
    o.state = OutState::kConnecting;
    o.last_error = "TCP handshake under way (not answered yet)";
  } else if (final_for_address(errno)) {
    miss(o, connect_error(errno), failed);
  } else {
    if (errno == ECONNREFUSED) ++o.refusals;
    retry(o, connect_error(errno));
  }
  return Status::Ok();
}

Status Mesh::on_outgoing(Outgoing& o, std::vector<MeshLink>* done, std::vector<MeshFailure>* failed) {
  if (o.state == OutState::kTls) return tls_connected(o, done);
  if (o.state == OutState::kConnecting) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(o.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      if (final_for_address(err)) {
        miss(o, connect_error(err), failed);
      } else if (err == ECONNREFUSED && ++o.refusals >= kRefusalsMeanGone) {
        miss(o, "refused the connection (nothing listens there)", failed, true);
      } else {
        retry(o, connect_error(err));
      }
      return Status::Ok();
    }
    o.state = OutState::kSendHello;
  }
  if (o.state == OutState::kSendHello) {
    while (o.sent < o.out.size()) {
      ssize_t n = ::send(o.fd.get(), o.out.data() + o.sent, o.out.size() - o.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) retry(o, "sending the handshake: " + errno_string(errno));
        return Status::Ok();
      }
      o.sent += static_cast<size_t>(n);
    }
    o.state = OutState::kAwaitReply;
    o.last_error = "connected, but no handshake reply came (is that rank stuck outside libcomm?)";
    return Status::Ok();
  }
  if (o.state != OutState::kAwaitReply) return Status::Ok();
  for (;;) {
    // The Reply, then what its code says follows it (reply_extra_bytes).
    const size_t want = sizeof o.reply + (o.got >= sizeof o.reply ? reply_extra_bytes(o.reply.code) : 0);
    if (o.got == want) break;
    char* dst = o.got < sizeof o.reply ? reinterpret_cast<char*>(&o.reply) + o.got
                                       : reinterpret_cast<char*>(o.extra) + (o.got - sizeof o.reply);
    const size_t room = o.got < sizeof o.reply ? sizeof o.reply - o.got : want - o.got;
    ssize_t n = ::recv(o.fd.get(), dst, room, MSG_DONTWAIT);
    if (n == 0) {
      // Shed under load, or the peer is restarting: try again until the deadline.
      retry(o, "the peer closed the connection during the handshake");
      return Status::Ok();
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) retry(o, "reading the handshake reply: " + errno_string(errno));
      return Status::Ok();
    }
    o.got += static_cast<size_t>(n);
  }
  if (o.reply.magic != kReplyMagic) {
    miss(o, "the listener there is not a libcomm peer (bad reply magic)", failed);
    return Status::Ok();
  }
  if (o.reply.code == static_cast<uint32_t>(ReplyCode::kChallenge) && !o.proved) {
    // Prove the secret over both nonces, bound to the rank dialed, then wait for the verdict.
    Nonce server_nonce;
    std::memcpy(server_nonce.data(), o.extra, server_nonce.size());
    Proof p{kProofMagic, {}};
    const Digest mine = proof_of_secret(c_.secret, context_for(o.peer), Prover::kClient, o.nonce, server_nonce);
    std::memcpy(p.proof, mine.data(), sizeof p.proof);
    std::memcpy(o.server_nonce.data(), server_nonce.data(), server_nonce.size());
    o.out.assign(reinterpret_cast<const char*>(&p), sizeof p);
    o.sent = 0;
    o.got = 0;
    o.proved = true;
    o.state = OutState::kSendHello;
    return Status::Ok();
  }
  if (o.reply.code == static_cast<uint32_t>(ReplyCode::kWrongRank)) {
    miss(o, "reached rank " + std::to_string(static_cast<int32_t>(o.reply.value)) + "'s listener, not rank " +
                std::to_string(o.peer) + "'s (an address that several hosts have?)", failed);
    return Status::Ok();
  }
  if (o.reply.code == static_cast<uint32_t>(ReplyCode::kBadSecret)) {
    // The secret binds the communicator, the rank and its host: another job's listener, or
    // another communicator's, answers so. Not the peer's failure.
    miss(o, "reached a listener that does not hold this job's secret for this communicator's rank " +
                std::to_string(o.peer) + " (another job's, or another host's: an address that several hosts have?)",
         failed);
    return Status::Ok();
  }
  if (o.reply.code == static_cast<uint32_t>(ReplyCode::kDuplicate) && sibling_alive(o) &&
      linked_[slot(o.peer, o.index)] != kLinked) {
    // Another attempt of this connection reached the peer first; its kOk is on its way.
    o.fd.reset();
    o.state = OutState::kDone;
    return Status::Ok();
  }
  if (o.reply.code == static_cast<uint32_t>(ReplyCode::kYield) ||
      (o.reply.code == static_cast<uint32_t>(ReplyCode::kDuplicate) && linked_[slot(o.peer, o.index)] == kLinked)) {
    // The peer's own dial wins (or already won): it arrives through the listener.
    if (!linked_[slot(o.peer, o.index)]) linked_[slot(o.peer, o.index)] = kPeerDials;
    note_path(o, true, "");
    o.fd.reset();
    o.state = OutState::kDone;
    linked_by(o);
    return Status::Ok();
  }
  if (o.reply.code != static_cast<uint32_t>(ReplyCode::kOk) || !o.proved) return refused(o);
  if (!check_proof(c_.secret, context_for(o.peer), Prover::kServer, o.nonce, o.server_nonce, o.extra)) {
    miss(o, "the listener there accepted but could not prove it is rank " + std::to_string(o.peer) +
                " of this communicator on its host", failed);
    return Status::Ok();
  }
  set_nodelay(o.fd.get());
  linked_[slot(o.peer, o.index)] = kLinked;
  ++connected_;
  note_path(o, true, "");
  linked_by(o);
  if (c_.tls) {
    COMM_RETURN_IF_ERROR(tls_start(&o.tls, o.fd.get(), true));
    o.state = OutState::kTls;
    o.last_error = "connected, but the TLS handshake did not finish";
    return tls_connected(o, done);
  }
  COMM_INFO(kNet, "%s: connected to rank %d (connection #%d, %s)", me().c_str(), o.peer, o.index, o.where.c_str());
  done->push_back(MeshLink{o.peer, o.index, std::move(o.fd), o.where, nullptr});
  o.state = OutState::kDone;
  return Status::Ok();
}

Status Mesh::refused(const Outgoing& o) {
  std::string who = me() + ": rank " + std::to_string(o.peer) + " at " + o.where;
  switch (static_cast<ReplyCode>(o.reply.code)) {
    case ReplyCode::kBadVersion:
      return InvalidUsage(who + " speaks wire protocol version " + std::to_string(o.reply.value) +
                          ", this rank " + std::to_string(kProtocolVersion) + "; use the same libcomm on every rank");
    case ReplyCode::kSizeMismatch:
      return InvalidUsage(who + " has world size " + std::to_string(o.reply.value) + " but this rank has " +
                          std::to_string(c_.size));
    case ReplyCode::kTlsMismatch:
      return InvalidUsage(who + (o.reply.value != 0 ? " requires TLS (COMM_TLS=1) but this rank runs without it"
                                                    : " runs without TLS (COMM_TLS=0) but this rank requires it") +
                          "; set the same COMM_TLS on every rank");
    case ReplyCode::kNconnsMismatch:
      return InvalidUsage(who + " uses COMM_SOCKET_NCONNS=" + std::to_string(o.reply.value) +
                          " but this rank uses " + std::to_string(c_.nconns) + "; set the same value on every rank");
    default:
      return Internal(who + " refused connection #" + std::to_string(o.index) + " (reply code " +
                      std::to_string(o.reply.code) + ")");
  }
}

void Mesh::retry(Outgoing& o, const std::string& why) {
  o.fd.reset();
  o.last_error = why;
  o.state = OutState::kWaitRetry;
  o.retry_at = Clock::now() + std::chrono::milliseconds(o.backoff_ms);
  if (c_.arrivals) c_.arrivals->redialed(o.peer);
  COMM_INFO(kNet, "%s: connection #%d to rank %d at %s failed (%s); retrying in %d ms", me().c_str(), o.index, o.peer,
            o.where.c_str(), why.c_str(), o.backoff_ms);
  o.backoff_ms = std::min(o.backoff_ms * 2, kMaxBackoffMs);
}

void Mesh::give_up(Outgoing& o, const std::string& reason, bool is_exit, std::vector<MeshFailure>* failed) {
  o.fd.reset();
  o.state = OutState::kDone;
  COMM_WARN(kNet, "%s: rank %d %s", me().c_str(), o.peer, reason.c_str());
  failed->push_back(MeshFailure{o.peer, reason, is_exit});
}

bool Mesh::sibling_alive(const Outgoing& o) const {
  for (const auto& s : outgoing_)
    if (&s != &o && s.peer == o.peer && s.index == o.index && s.state != OutState::kDone &&
        s.state != OutState::kMissed)
      return true;
  return false;
}

void Mesh::linked_by(const Outgoing& winner) {
  for (auto& s : outgoing_) {
    if (&s == &winner || s.peer != winner.peer || s.index != winner.index || s.state == OutState::kDone) continue;
    // An address dialed first whose TCP handshake is still unanswered while a later one got
    // through: a path that drops packets, tried last from now on.
    if (s.state == OutState::kConnecting && s.dial_started < winner.dial_started)
      note_path(s, false, "TCP handshake unanswered after " +
                              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 Clock::now() - s.dial_started).count()) +
                              " ms while " + winner.where + " connected");
    s.fd.reset();
    s.state = OutState::kDone;
  }
}

void Mesh::miss(Outgoing& o, const std::string& why, std::vector<MeshFailure>* failed, bool refusal) {
  o.fd.reset();
  o.state = OutState::kMissed;
  o.last_error = why;
  o.refused = refusal;
  note_path(o, false, why);
  // The next address of this connection need not wait for its turn.
  bool all_missed = true;
  bool pulled = false;
  bool all_refused = true;
  for (auto& s : outgoing_) {
    if (s.peer != o.peer || s.index != o.index || s.state == OutState::kDone) continue;
    if (s.state != OutState::kMissed) all_missed = false;
    if (s.state == OutState::kMissed && !s.refused) all_refused = false;
    if (!pulled && !s.started && s.state == OutState::kWaitRetry) {
      s.retry_at = Clock::now();
      pulled = true;
    }
  }
  if (!all_missed) return;
  // Every address missed: the peer cannot be reached from here.
  const std::string text = all_refused
                               ? "refused the connection at " + addresses_of(o.peer, o.index) +
                                     " (nothing listens there any more)"
                               : unreachable_text(o.peer, o.index);
  for (auto& s : outgoing_)
    if (s.peer == o.peer && s.index == o.index && &s != &o) s.state = OutState::kDone;
  give_up(o, text, all_refused, failed);
  failed->back().unreachable = !all_refused;
}

// "10.77.0.2:41000 (its eth1, from eth1 10.77.0.1)"
std::string Mesh::describe(const Outgoing& o) const {
  std::string text = o.where;
  std::string via;
  if (!o.their_if.empty()) via = "its " + o.their_if;
  if (!o.local_if.empty()) via += (via.empty() ? "" : ", ") + ("from " + o.local_if + " " + o.local_addr);
  else if (!o.unusable) via += (via.empty() ? "" : ", ") + std::string("no route from this host");
  return via.empty() ? text : text + " (" + via + ")";
}

std::string Mesh::addresses_of(int peer, int index) const {
  std::string text;
  for (const auto& s : outgoing_)
    if (s.peer == peer && s.index == index && s.state != OutState::kDone) text += (text.empty() ? "" : ", ") + s.where;
  return text;
}

std::string Mesh::attempts_text(int peer) const {
  std::string text;
  int index = -1;
  for (const auto& s : outgoing_) {
    if (s.peer != peer || s.state == OutState::kDone) continue;
    if (index < 0) index = s.index;
    if (s.index != index) continue;  // connection #0's story tells the others'
    text += (text.empty() ? "" : "; ") + describe(s) + ": " + s.last_error;
  }
  return text;
}

std::string Mesh::unreachable_text(int peer, int index) const {
  std::string text = "cannot be reached at any of its addresses: ";
  bool first = true;
  for (const auto& s : outgoing_) {
    if (s.peer != peer || s.index != index || s.state == OutState::kDone) continue;
    text += (first ? "" : "; ") + describe(s) + ": " + s.last_error;
    first = false;
  }
  std::vector<std::string> works = posix::interfaces_that_work();
  if (works.empty() && !c_.route_ifname.empty()) works.push_back(c_.route_ifname);
  std::string names;
  for (const auto& w : works) names += (names.empty() ? "" : ",") + w;
  text += "; set NCCL_SOCKET_IFNAME (or COMM_SOCKET_IFNAME) to interfaces that reach every host";
  if (!names.empty())
    text += " (from this host " + names + " reached " +
            (posix::interfaces_that_work().empty() ? std::string("the store's host") : std::string("other ranks")) +
            ": NCCL_SOCKET_IFNAME=" + names + ")";
  return text;
}

// Once per (local interface, peer host) and outcome, at INFO: which interface reaches which
// peer, and why another was dropped for it.
void Mesh::note_path(const Outgoing& o, bool works, const std::string& why) const {
  const std::string host = posix::endpoint_host(o.where);
  if (!posix::note_path(o.local_if, host, works, why)) return;
  const std::string from = o.local_if.empty() ? std::string("this host") : o.local_if + " " + o.local_addr;
  if (works)
    COMM_INFO(kNet, "%s: %s reaches rank %d at %s%s", me().c_str(), from.c_str(), o.peer, o.where.c_str(),
              o.their_if.empty() ? "" : (" (its " + o.their_if + ")").c_str());
  else
    COMM_INFO(kNet, "%s: %s: cannot reach rank %d at %s%s: %s; that address is tried last from now on", me().c_str(),
              from.c_str(), o.peer, o.where.c_str(), o.their_if.empty() ? "" : (" (its " + o.their_if + ")").c_str(),
              why.c_str());
}

}  // namespace comm::transport::sock
