// Who gets into rank 0's store: accepting, the hello and its proof, and what goes when room runs
// out (the descriptor cap, the stranger limit).
//
// A launcher starts a job's ranks at once (Slurm, torchrun, a loop of `&`), so a burst of
// hundreds of connections is normal, and on a busy host some of those ranks are slow to speak.
// A flood (a port scanner, a misconfigured client) looks like a burst that never says hello.
// What tells them apart:
//   - A rank sends its hello right after connecting, so each new connection is read as soon as
//     it is accepted: most of a burst is greeted (or, with a token, challenged) before the next
//     connection is even looked at.
//   - The stranger limit scales with the world size the store serves (stranger_limit()): a job
//     alone never reaches it, since each rank has one connection in its hello at a time.
//   - When room runs out, only a *silent* stranger (connected, nothing sent) is closed for a
//     newcomer, oldest first. A stranger that spoke the protocol is a rank, or shows it is not
//     by its hello deadline (hello_timeout_ms, counted again from the challenge for the proof);
//     newcomers then wait in the listen backlog until a stranger has been greeted or has gone.
//   - A connection closed before its hello is told why (Reply::kBusy), and its client retries
//     with backoff inside its deadline (tcp_store.cc): a rank that was taken for a stranger
//     costs a reconnect, never the job.
// The guards stay: a stranger may send only hello-sized frames, must say hello within the
// deadline, and with a token must prove it (tcp_store_wire.h). Memory stays bounded: at most
// max(stranger limit, descriptor cap) strangers of one hello (a few KiB) each.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "store/tcp_store_server.h"

namespace comm::tcp_store {
namespace {

// Descriptors rank 0 keeps for everything but the store (its transports, files, libraries).
constexpr size_t kReservedFds = 64;
constexpr auto kLimitWarningEvery = std::chrono::seconds(5);
// Connections accepted per round of the poll loop: a backlog of ranks (shed ones come back at
// once) must not keep the server from serving the requests of those it let in.
constexpr int kAcceptsPerRound = 64;

}  // namespace

// How many clients the server holds at once: its soft descriptor limit less the reserve. Past
// it, a new client costs an idle or waiting one its connection (shed(); the client reconnects,
// tcp_store.cc), so 512 ranks start under ulimit -n 256 instead of filling rank 0's table.
size_t connection_cap() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  size_t soft = static_cast<size_t>(lim.rlim_cur);
  return soft > 2 * kReservedFds ? soft - kReservedFds : std::max<size_t>(soft / 2, 8);
}

size_t stranger_limit(const TcpStoreOptions& options) {
  const size_t floor = static_cast<size_t>(std::max(1, options.max_unauthenticated));
  return std::max(floor, static_cast<size_t>(std::max(0, options.world_size)));
}

void Server::accept_all() {
  for (int accepted = 0; accepted < kAcceptsPerRound; ++accepted) {
    if (!make_room()) {
      accept_resume_ = Clock::now() + std::chrono::milliseconds(10);
      return;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (posix::out_of_fds(errno) &&
          (shed() || evict_silent_stranger("rank 0 ran out of descriptors for new connections")))
        continue;
      // Out of descriptors or memory: pause accepting instead of spinning on a readable socket.
      const std::string why = posix::out_of_fds(errno)
                                  ? "rank 0 " + posix::out_of_fds_text(errno, "accepting a rank's store connection")
                                  : errno_string(errno);
      COMM_WARN(kStore, "store server %s: accept failed: %s; pausing new connections for 100 ms", where_.c_str(),
                why.c_str());
      accept_resume_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->fd.reset(fd);
    c->peer = posix::format_address(reinterpret_cast<sockaddr*>(&addr), len);
    COMM_TRACE(kStore, "store server %s: connection from %s", where_.c_str(), c->peer.c_str());
    c->hello_by = Clock::now() + hello_timeout_;
    conns_.push_back(std::move(c));
    read_some(*conns_.back());  // a rank's hello is usually here already: greet it before the next
  }
}

// Room for one more connection. Under the descriptor cap: an idle or waiting rank's connection
// is shed (its client reconnects), else a silent stranger goes. Under the stranger limit: a
// silent stranger goes. false: nobody may go now, newcomers wait in the listen backlog.
bool Server::make_room() {
  if (live_connections() >= cap_ && !shed() &&
      !evict_silent_stranger("rank 0's store holds " + std::to_string(cap_) +
                             " connections, its descriptor limit (ulimit -n) less a reserve"))
    return false;
  if (strangers() >= max_strangers_ &&
      !evict_silent_stranger(std::to_string(max_strangers_) + " connections were already waiting to say hello"))
    return false;
  return true;
}

// Closes one connection with no request in progress (an idle one first, else the oldest
// parked get): its client retries on a new connection. One just greeted is spared until its
// first request has come (it is about to: closing it would only make it come back), so a full
// server makes progress instead of trading newcomers for newcomers. false: none can go.
bool Server::shed() {
  Conn* victim = nullptr;
  for (auto& c : conns_) {
    if (c->dead || c->pending_out() || c->in.size() > c->in_done || !c->greeted || !c->asked) continue;
    if (!c->parked) {
      victim = c.get();
      break;
    }
    if (victim == nullptr) victim = c.get();
  }
  if (victim == nullptr) return false;
  COMM_TRACE(kStore, "store server %s: at its connection limit (%zu); closing the %s connection from %s",
             where_.c_str(), cap_, victim->parked ? "waiting" : "idle", victim->peer.c_str());
  victim->fd.reset();
  victim->dead = true;
  ++shed_;
  return true;
}

// The oldest stranger that has sent nothing (connections are kept in accept order) is closed,
// told why first (a rank's client retries on that answer, tcp_store.cc). false: none is silent.
bool Server::evict_silent_stranger(const std::string& why) {
  for (auto& c : conns_) {
    if (!c->silent()) continue;
    warn_limited("closed the connection from " + c->peer + " for a newer one: " + why +
                 " and it had said nothing (a port scanner, or a flood?)");
    reply(*c, Reply::kBusy, std::string(kBusyPrefix) + " before its hello: " + why);
    flush(*c);  // best effort: a few bytes into an empty socket buffer
    c->fd.reset();  // now, not at the end of this round: the descriptor is what runs out
    c->dead = true;
    return true;
  }
  return false;
}

// A burst's drops are one story: the first is a WARN, the next ones within kLimitWarningEvery
// are counted into the following WARN (and traced), so 500 ranks do not log 500 lines.
void Server::warn_limited(const std::string& what) {
  const Clock::time_point now = Clock::now();
  if (now < next_limit_warning_) {
    ++limited_since_warning_;
    COMM_TRACE(kStore, "store server %s: %s", where_.c_str(), what.c_str());
    return;
  }
  const std::string more = limited_since_warning_ == 0
                               ? ""
                               : " (and " + std::to_string(limited_since_warning_) + " more since the last warning)";
  COMM_WARN(kStore, "store server %s: %s%s", where_.c_str(), what.c_str(), more.c_str());
  limited_since_warning_ = 0;
  next_limit_warning_ = now + kLimitWarningEvery;
}

size_t Server::strangers() const {
  size_t n = 0;
  for (const auto& c : conns_) n += c->stranger();
  return n;
}

Clock::time_point Server::first_hello_deadline() const {
  Clock::time_point first = Clock::time_point::max();
  for (const auto& c : conns_)
    if (c->stranger()) first = std::min(first, c->hello_by);
  return first;
}

void Server::drop_late_strangers() {
  const Clock::time_point now = Clock::now();
  for (auto& c : conns_) {
    if (!c->stranger() || now < c->hello_by) continue;
    const std::string why = c->challenged ? "no proof of COMM_AUTH_TOKEN" : "no hello";
    warn_limited("dropping connection from " + c->peer + ": " + why + " within " +
                 std::to_string(hello_timeout_.count()) +
                 " ms (not a libcomm rank, or one stuck before its hello?)");
    reply(*c, Reply::kBusy, std::string(kBusyPrefix) + ": " + why + " within " +
                                std::to_string(hello_timeout_.count()) + " ms");
    flush(*c);
    c->dead = true;
  }
}

void Server::hello(Conn& c, const std::string& nonce, uint32_t version, uint32_t flags) {
  if (c.greeted || c.challenged) return drop(c, "sent a second hello");
  if (version != kProtocolVersion) {
    COMM_WARN(kStore,
              "store server %s: refused connection from %s: it speaks store protocol %u, this server %u "
              "(mixed libcomm versions in one job?)",
              where_.c_str(), c.peer.c_str(), version, kProtocolVersion);
    reply(c, Reply::kVersionMismatch, "store protocol version " + std::to_string(kProtocolVersion));
    flush(c);  // best effort: a few bytes into an empty socket buffer
    c.dead = true;
    return;
  }
  if (((flags & kHelloTls) != 0) != (tls_ != nullptr)) {
    COMM_WARN(kStore, "store server %s: refused connection from %s: it runs %s TLS, this store %s (COMM_TLS differs)",
              where_.c_str(), c.peer.c_str(), tls_ != nullptr ? "without" : "with",
              tls_ != nullptr ? "requires it" : "does not");
    reply(c, Reply::kTlsMismatch, tls_ != nullptr ? "1" : "0");
    flush(c);
    c.dead = true;
    return;
  }
  if (nonce.size() != 0 && nonce.size() != kNonceBytes)
    return drop(c, "its hello carries a " + std::to_string(nonce.size()) + "-byte nonce, not 0 or " +
                       std::to_string(kNonceBytes));
  if (token_.empty()) {
    // No token, nothing to prove; a client with one gives up on its own (tcp_store.cc).
    c.greeted = true;
    c.tls_next = tls_ != nullptr;
    return reply(c, Reply::kOk, "");
  }
  if (nonce.empty()) return refuse(c, "it presented no COMM_AUTH_TOKEN (a rank started without the job's token?)");
  Status st = random_nonce(&c.server_nonce);
  if (!st.ok()) return drop(c, st.message());
  std::memcpy(c.client_nonce.data(), nonce.data(), kNonceBytes);
  c.challenged = true;
  // The proof has a deadline of its own: on a busy host the client may wait for a CPU before
  // it can answer, and the hello it sent at once already showed it speaks the protocol.
  c.hello_by = Clock::now() + hello_timeout_;
  reply(c, Reply::kChallenge,
        std::string_view(reinterpret_cast<const char*>(c.server_nonce.data()), c.server_nonce.size()));
}

// The answer to the challenge: the client proved the token first, so a stranger never gets a
// value computed with it.
void Server::proof(Conn& c, const std::string& presented) {
  if (c.greeted || !c.challenged) return drop(c, "sent a proof it was not asked for");
  if (!check_proof(token_, kProofContext, Prover::kClient, c.client_nonce, c.server_nonce,
                   reinterpret_cast<const uint8_t*>(presented.data())))
    return refuse(c, "its proof of COMM_AUTH_TOKEN is wrong (a rank with another token, or not a rank of this job)");
  c.greeted = true;
  c.tls_next = tls_ != nullptr;
  const Digest mine = proof_of_secret(token_, kProofContext, Prover::kServer, c.client_nonce, c.server_nonce);
  reply(c, Reply::kOk, std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size()));
}

void Server::refuse(Conn& c, const std::string& why) {
  COMM_WARN(kStore, "store server %s: refused connection from %s: %s", where_.c_str(), c.peer.c_str(), why.c_str());
  reply(c, Reply::kAuthRefused, "");
  flush(c);
  c.dead = true;
}

}  // namespace comm::tcp_store
