// The TCP store as ranks other than 0 see it: a client that connects with retry and
// backoff, proves the job's auth token (without sending it), and bounds every request by a
// deadline.
//
// Each request takes an idle connection from a small pool (or opens one), so threads that
// share this store never wait behind each other's blocking get. A connection whose request
// timed out may still receive the late reply, so it is closed, never reused. release_idle()
// empties the pool once a communicator is up. A connection the server closed before it
// answered (a pooled one gone stale, or one the server shed at its descriptor limit, see
// tcp_store_admission.cc) is retried on a new connection, with backoff, within the request's
// deadline: the server closes only connections with no request in progress, so nothing ran
// twice, and a burst of ranks at a full server gets in as room frees. Only a refused connection
// (nobody listens on the port any more: rank 0 is gone) ends the request at once.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "log.h"
#include "params.h"
#include "posix/net_util.h"
#include "store/tcp_store_wire.h"

namespace comm {
namespace tcp_store {
namespace {

constexpr size_t kMaxIdleConnections = 4;
constexpr int kFirstBackoffMs = 10;
constexpr int kMaxBackoffMs = 1000;

class Client final : public Store {
 public:
  explicit Client(const TcpStoreOptions& options)
      : options_(options), where_(host_port_string(options.host, options.port)) {}

  // Connects once (with retry until timeout_ms), so an unreachable rank 0 or a refused
  // token is reported when the store is made, not at its first use.
  Status connect_first() {
    Channel fd;
    COMM_RETURN_IF_ERROR(connect(Deadline::after_ms(options_.timeout_ms), options_.timeout_ms, &fd));
    reach_address_ = local_host(fd.get());
    release(std::move(fd));
    return Status::Ok();
  }

  Status set(const std::string& key, const std::string& value) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, value.size()));
    std::string payload;
    return call(Op::kSet, key, value, Deadline::after_ms(options_.timeout_ms), &payload);
  }

  bool dies_with_rank0() const override { return !options_.external; }
  std::string reach_address() const override { return reach_address_; }

  Status set(const std::string& key, const std::string& value, Deadline deadline) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, value.size()));
    std::string payload;
    return call(Op::kSet, key, value, deadline, &payload);
  }

  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, 0));
    return call(Op::kGet, key, "", deadline, value);
  }

  Status add(const std::string& key, int64_t delta, int64_t* result) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, 0));
    std::string delta_bytes;
    put_u64(&delta_bytes, static_cast<uint64_t>(delta));
    std::string payload;
    COMM_RETURN_IF_ERROR(call(Op::kAdd, key, delta_bytes, Deadline::after_ms(options_.timeout_ms), &payload));
    if (payload.size() != 8)
      return SystemError("store at " + where_ + " answered add on key '" + key + "' with " +
                         std::to_string(payload.size()) + " bytes, not 8");
    *result = static_cast<int64_t>(get_u64(payload.data()));
    return Status::Ok();
  }

 private:
  static const char* op_name(Op op) {
    switch (op) {
      case Op::kSet: return "set";
      case Op::kGet: return "get";
      case Op::kAdd: return "add";
      case Op::kHello: return "hello";
      case Op::kProof: return "proof";
    }
    return "?";
  }

  int ms_left(Deadline deadline) const {
    return deadline.remaining_ms(options_.timeout_ms > 0 ? options_.timeout_ms : 1);
  }

  // Half to all of backoff_ms, at random: ranks a full server turned away together do not all
  // come back in the same millisecond.
  void sleep_backoff(int backoff_ms, Deadline deadline) {
    thread_local std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                                         static_cast<unsigned>(Clock::now().time_since_epoch().count()));
    const int ms = backoff_ms / 2 + static_cast<int>(jitter() % static_cast<unsigned>(backoff_ms / 2 + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, ms_left(deadline))));
  }

  void release_idle() override {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.clear();
  }

  Status call(Op op, const std::string& key, const std::string& value, Deadline deadline, std::string* payload) {
    Channel fd = take_idle();
    if (!fd.valid()) {
      Deadline limit = Deadline::after_ms(options_.timeout_ms);
      Status st = connect(deadline.at() < limit.at() ? deadline : limit, options_.timeout_ms, &fd);
      if (!st.ok()) return st.prefixed(std::string("store ") + op_name(op) + " of key '" + key + "': ");
    }
    for (;;) {
      bool closed_early = false;
      Status st = call_on(fd, op, key, value, deadline, payload, &closed_early);
      if (!closed_early || deadline.expired()) return st;
      // Closed before any answer: shed at rank 0's connection limit, or stale. Back in with
      // the same backoff as the first connection, until the deadline; refused means rank 0 is
      // gone, and the caller hears that now.
      COMM_TRACE(kStore, "store %s of key '%s': the server closed the connection before answering; retrying on a "
                 "new one", op_name(op), key.c_str());
      fd = Channel();
      Status again = connect(deadline, options_.timeout_ms, &fd, Rejoin::kRefusedIsFinal);
      if (!again.ok())
        return again.prefixed(std::string("store ") + op_name(op) + " of key '" + key + "': rank 0's store closed " +
                              "the connection before answering, and getting back in failed: ");
    }
  }

  // One request on fd. *closed_early: the server closed it before a byte of the answer came.
  Status call_on(Channel& fd, Op op, const std::string& key, const std::string& value, Deadline deadline,
                 std::string* payload, bool* closed_early) {
    auto failed = [&](Io io, int err, const char* stage) {
      std::string what = std::string("store ") + op_name(op) + " of key '" + key + "' at " + where_ + ": ";
      switch (io) {
        case Io::kTimeout:
          if (op == Op::kGet)
            return Timeout("timed out waiting for key '" + key + "' in the store at " + where_ +
                           ": no rank set it in time (did every rank start, with the same init_method?)");
          return Timeout(what + "no answer in time while " + stage + " (is rank 0 overloaded or stopped?)");
        case Io::kClosed:
          return SystemError(what + "rank 0 closed the connection (did rank 0 exit or fail?)");
        default:
          return SystemError(what + stage + " failed: " + errno_string(err));
      }
    };
    int err = 0;
    auto gone = [&](Io io) {
      return io == Io::kClosed || (io == Io::kError && (err == EPIPE || err == ECONNRESET));
    };
    Io io = send_all(fd.get(), fd.tls.get(), encode_request(op, key, value), deadline, &err);
    if (io != Io::kOk) {
      *closed_early = gone(io);
      return failed(io, err, "sending");
    }
    char header[kResponseHeaderBytes];
    io = recv_exact(fd.get(), fd.tls.get(), header, sizeof header, deadline, &err);
    if (io != Io::kOk) {
      // recv_exact reports kClosed only before the first byte of an answer when none came.
      *closed_early = gone(io);
      return failed(io, err, "waiting for the reply");
    }
    uint32_t len = get_u32(header + 8);
    if (get_u32(header) != kMagic || len > kMaxValueBytes)
      return SystemError("store " + std::string(op_name(op)) + " at " + where_ +
                         ": malformed reply (is MASTER_PORT the port of a libcomm store?)");
    std::string body(len, '\0');
    io = recv_exact(fd.get(), fd.tls.get(), body.data(), len, deadline, &err);
    if (io != Io::kOk) return failed(io, err, "receiving the reply");
    auto reply = static_cast<Reply>(static_cast<uint8_t>(header[4]));
    if (reply == Reply::kError) {
      release(std::move(fd));
      return InvalidUsage(body);
    }
    if (reply != Reply::kOk)
      return SystemError("store " + std::string(op_name(op)) + " at " + where_ + ": unexpected reply " +
                         std::to_string(static_cast<int>(reply)));
    release(std::move(fd));
    *payload = std::move(body);
    return Status::Ok();
  }

  Channel take_idle() {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.empty()) return Channel();
    Channel fd = std::move(idle_.back());
    idle_.pop_back();
    return fd;
  }

  void release(Channel fd) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(fd));
  }

  // kRefusedIsFinal: this client was in before, so a refused connection means rank 0 is gone;
  // at the first connection it means rank 0 has not started yet.
  enum class Rejoin { kRefusedIsRetried, kRefusedIsFinal };

  // Retries with exponential backoff until the deadline: rank 0 may start after us, or its
  // store may close a connection before the hello when it is full (Reply::kBusy).
  Status connect(Deadline deadline, int timeout_ms, Channel* out, Rejoin rejoin = Rejoin::kRefusedIsRetried) {
    int backoff_ms = kFirstBackoffMs;
    std::string last_error = "no attempt finished";
    for (;;) {
      bool final = false;
      Status st = connect_once(deadline, out, &final, rejoin);
      if (st.ok() || final) return st;
      last_error = st.message();
      if (deadline.expired()) break;
      if (st.message().rfind(kBusyPrefix, 0) == 0 && !told_busy_.exchange(true))
        COMM_INFO(kStore, "%s; retrying with backoff until the deadline", st.message().c_str());
      sleep_backoff(backoff_ms, deadline);
      backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
      if (deadline.expired()) break;
    }
    return Timeout("could not reach the store at " + where_ + " within " + std::to_string(timeout_ms) +
                   " ms (last error: " + last_error +
                   "); check that MASTER_ADDR/MASTER_PORT (or init_method tcp://HOST:PORT) name rank 0's host and "
                   "port, that rank 0 is running, and that no firewall blocks the port");
  }

  // One attempt over every address the host resolves to. *final: retrying cannot help.
  Status connect_once(Deadline deadline, Channel* out, bool* final, Rejoin rejoin) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    std::string port_text = std::to_string(options_.port);
    int rc = getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &found);
    if (rc != 0) return SystemError("cannot resolve '" + options_.host + "': " + gai_strerror(rc));
    Status last = SystemError("'" + options_.host + "' resolved to no address");
    bool all_refused = found != nullptr;
    // A name with several addresses (an unreachable one first): an address whose SYN goes
    // unanswered has COMM_SOCKET_CONNECT_TIMEOUT_MS, then the next one is tried
    // (docs/topology.md, "Messy networks"); the last one has the whole deadline.
    int per_address_ms = 0;
    (void)params::socket_connect_timeout_ms(&per_address_ms);  // bad: the default (the socket transport refuses it)
    for (addrinfo* ai = found; ai != nullptr && !deadline.expired(); ai = ai->ai_next) {
      posix::Fd fd;
      bool refused = false;
      Deadline address_deadline = deadline;
      if (ai->ai_next != nullptr) {
        const Deadline bound = Deadline::after_ms(per_address_ms);
        if (bound.at() < deadline.at()) address_deadline = bound;
      }
      last = connect_address(ai->ai_addr, ai->ai_addrlen, address_deadline, &fd, final, &refused);
      all_refused = all_refused && refused;
      if (*final) break;
      if (!last.ok()) continue;
      last = handshake(fd.get(), deadline, final);
      std::unique_ptr<tls::Session> session;
      if (last.ok() && options_.tls) last = start_tls(fd.get(), deadline, final, &session);
      if (last.ok()) {
        out->fd = std::move(fd);
        out->tls = std::move(session);
        break;
      }
      if (*final) break;
    }
    freeaddrinfo(found);
    if (!last.ok() && all_refused && rejoin == Rejoin::kRefusedIsFinal) {
      *final = true;  // nothing listens at any of rank 0's addresses any more
      return SystemError("rank 0 refuses connections now (did rank 0 exit or fail?)");
    }
    return last;
  }

  // *refused: the address answered the connect with a refusal (nothing listens on it).
  static Status connect_address(const sockaddr* sa, socklen_t len, Deadline deadline, posix::Fd* out, bool* final,
                                bool* refused) {
    posix::Fd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid() && posix::out_of_fds(errno)) {
      *final = true;  // waiting does not free descriptors: say so now
      return SystemError("this rank " + posix::out_of_fds_text(errno, "connecting to the store"));
    }
    if (!fd.valid()) return SystemError("socket: " + errno_string(errno));
    auto failed = [&](int err) {
      *refused = err == ECONNREFUSED;
      return SystemError("connect: " + errno_string(err));
    };
    if (::connect(fd.get(), sa, len) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) return failed(errno);
      // Non-blocking connect bounded by the deadline: an address that drops SYNs ends in time.
      for (;;) {
        if (deadline.expired()) return Timeout("connect: no answer");
        pollfd p{fd.get(), POLLOUT, 0};
        int n = ::poll(&p, 1, deadline.remaining_ms());
        if (n > 0) break;
        if (n < 0 && errno != EINTR) return SystemError("poll: " + errno_string(errno));
      }
      int soerr = 0;
      socklen_t soerr_len = sizeof soerr;
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &soerr_len) != 0) soerr = errno;
      if (soerr != 0) return failed(soerr);
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = std::move(fd);
    return Status::Ok();
  }

  // The hello, and with an auth token the challenge-response that proves it both ways without
  // sending it (tcp_store_wire.h, crypto/proof.h).
  Status handshake(int fd, Deadline deadline, bool* final) {
    const std::string& token = options_.auth_token;
    Nonce mine{};
    if (!token.empty()) {
      Status st = random_nonce(&mine);
      if (!st.ok()) {
        *final = true;
        return st.prefixed("store hello: ");
      }
    }
    std::string version;
    put_u32(&version, kProtocolVersion);
    if (options_.tls) put_u32(&version, kHelloTls);  // the server checks that it agrees
    const std::string nonce = token.empty() ? "" : std::string(reinterpret_cast<const char*>(mine.data()), mine.size());
    Reply reply = Reply::kError;
    std::string body;
    COMM_RETURN_IF_ERROR(exchange(fd, encode_request(Op::kHello, nonce, version), deadline, final, &reply, &body));
    Nonce theirs{};
    if (reply == Reply::kChallenge && !token.empty() && body.size() == kNonceBytes) {
      std::memcpy(theirs.data(), body.data(), theirs.size());
      const Digest proof = proof_of_secret(token, kProofContext, Prover::kClient, mine, theirs);
      COMM_RETURN_IF_ERROR(exchange(fd, encode_request(Op::kProof, "", std::string(proof.begin(), proof.end())),
                                    deadline, final, &reply, &body));
      if (reply == Reply::kOk) {
        // Only the failure is final: after a good proof comes the TLS handshake, whose timeout
        // connect() must still retry.
        if (body.size() != kDigestBytes ||
            !check_proof(token, kProofContext, Prover::kServer, mine, theirs,
                         reinterpret_cast<const uint8_t*>(body.data()))) {
          *final = true;
          return InvalidUsage("the store at " + where_ +
                              " accepted this process's proof of COMM_AUTH_TOKEN but could not prove the token "
                              "itself: it is not this job's store; check MASTER_ADDR/MASTER_PORT and set the same "
                              "COMM_AUTH_TOKEN on every rank");
        }
        return Status::Ok();
      }
    } else if (reply == Reply::kOk && body.empty()) {
      if (token.empty()) return Status::Ok();
      *final = true;
      return InvalidUsage("the store at " + where_ +
                          " runs without COMM_AUTH_TOKEN, so it cannot prove it is this job's store, and this "
                          "process has a token; set the same COMM_AUTH_TOKEN on every rank of the job");
    }
    if (reply == Reply::kBusy)  // closed before the hello was through: not final, connect() retries
      return SystemError(body.rfind(kBusyPrefix, 0) == 0 ? body : std::string(kBusyPrefix) + " before its hello");
    *final = true;
    if (reply == Reply::kAuthRefused)
      return InvalidUsage("the store at " + where_ +
                          " refused this process's auth token; set the same COMM_AUTH_TOKEN on every rank "
                          "of the job");
    if (reply == Reply::kTlsMismatch)
      return InvalidUsage("the store at " + where_ +
                          (body == "1" ? " requires TLS (COMM_TLS=1) and this process runs without it"
                                       : " runs without TLS (COMM_TLS=0) and this process requires it") +
                          "; set the same COMM_TLS on every rank of the job");
    if (reply == Reply::kVersionMismatch)
      return InvalidUsage("the store at " + where_ + " speaks another store protocol version (its answer: " + body +
                          "; this process: version " + std::to_string(kProtocolVersion) +
                          "); run the same libcomm on every rank");
    return SystemError("the store at " + where_ + " answered the hello with reply " +
                       std::to_string(static_cast<int>(reply)) + " and " + std::to_string(body.size()) +
                       " bytes (is MASTER_PORT the port of a libcomm store?)");
  }

  // COMM_TLS: after the greeting, the TLS handshake on the same socket (tls/tls.h). The server
  // agreed to TLS in its greeting, so a failure here is a key or a certificate it refused, or
  // one this process refuses: final.
  Status start_tls(int fd, Deadline deadline, bool* final, std::unique_ptr<tls::Session>* out) {
    Status st = tls::Session::create(options_.tls, fd, tls::Role::kClient, out);
    // The whole of the connect's deadline, as the greeting had: a rank 0 busy with a burst may
    // take seconds to answer a ClientHello (remaining_ms()'s default cap, 1 s, failed a burst).
    if (st.ok())
      st = (*out)->handshake_until(tls::Session::clock_ms() + deadline.remaining_ms(std::numeric_limits<int>::max()));
    if (st.ok()) {
      // The server's kOk through TLS, or the alert that says why it refused this process.
      char header[kResponseHeaderBytes];
      int err = 0;
      Io io = recv_exact(fd, out->get(), header, sizeof header, deadline, &err);
      if (io == Io::kTimeout) return Timeout("TLS: no confirmation from the store in time");
      if (io != Io::kOk)
        st = SystemError("TLS: refused after the handshake: " +
                         (io == Io::kClosed ? std::string("the store closed the connection")
                          : err == EPROTO   ? (*out)->why()
                                            : errno_string(err)));
      else if (get_u32(header) != kMagic || static_cast<Reply>(static_cast<uint8_t>(header[4])) != Reply::kOk ||
               get_u32(header + 8) != 0)
        st = SystemError("TLS: the store's confirmation is malformed");
    }
    if (st.ok()) {
      COMM_INFO(kStore, "store client: TLS to %s (%s)", where_.c_str(), (*out)->describe().c_str());
      return st;
    }
    if (st.code() == COMM_ERR_TIMEOUT) return st;  // retried: a slow server
    *final = true;
    return SystemError("the store at " + where_ + ": " + st.message() +
                       (options_.tls->uses_psk() ? " (is COMM_AUTH_TOKEN the same on every rank?)"
                                                 : " (is every rank's COMM_TLS_CERT signed by the COMM_TLS_CA of the "
                                                   "others?)"));
  }

  // Sends one handshake frame and reads the answer. Errors are the hello's: a malformed answer is
  // final, a timeout or a close is retried by connect().
  Status exchange(int fd, const std::string& frame, Deadline deadline, bool* final, Reply* reply, std::string* body) {
    constexpr size_t kMaxHandshakeReply = 4096;
    int err = 0;
    Io io = send_all(fd, frame, deadline, &err);
    char header[kResponseHeaderBytes];
    if (io == Io::kOk) io = recv_exact(fd, header, sizeof header, deadline, &err);
    if (io == Io::kOk) {
      const uint32_t len = get_u32(header + 8);
      if (get_u32(header) != kMagic || len > kMaxHandshakeReply) {
        *final = true;
        return SystemError("the service at " + where_ +
                           " is not a libcomm store (malformed reply to the hello); check MASTER_PORT");
      }
      body->assign(len, '\0');
      io = recv_exact(fd, body->data(), len, deadline, &err);
      *reply = static_cast<Reply>(static_cast<uint8_t>(header[4]));
    }
    if (io == Io::kOk) return Status::Ok();
    if (io == Io::kTimeout) return Timeout("connected, but no answer to the hello");
    if (io == Io::kClosed) return SystemError("connected, but the peer closed the connection during the hello");
    return SystemError("hello: " + errno_string(err));
  }

  // The numeric address of this end of a connection: routable from the server's host.
  static std::string local_host(int fd) {
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char host[NI_MAXHOST] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
      return "";
    std::string text = host;
    if (text.rfind("::ffff:", 0) == 0 && text.find('.') != std::string::npos) text = text.substr(7);  // v4-mapped
    return text;
  }

  const TcpStoreOptions options_;
  const std::string where_;
  std::string reach_address_;  // set once by connect_first, before anyone else sees the store
  std::mutex mu_;
  std::vector<Channel> idle_;
  std::atomic<bool> told_busy_{false};  // the first "rank 0's store closed ..." is logged at INFO
};

}  // namespace

Status connect_client(const TcpStoreOptions& options, std::shared_ptr<Store>* out) {
  auto client = std::make_shared<Client>(options);
  COMM_RETURN_IF_ERROR(client->connect_first());
  COMM_INFO(kStore, "store client connected to %s", host_port_string(options.host, options.port).c_str());
  *out = std::move(client);
  return Status::Ok();
}

}  // namespace tcp_store

Status make_tcp_store(const TcpStoreOptions& options, std::shared_ptr<Store>* out) {
  if (out == nullptr) return InvalidArgument("make_tcp_store: out is NULL");
  if (options.timeout_ms <= 0)
    return InvalidArgument("store timeout " + std::to_string(options.timeout_ms) + " ms must be positive");
  if (options.auth_token.size() > tcp_store::kMaxKeyBytes)
    return InvalidArgument("COMM_AUTH_TOKEN is " + std::to_string(options.auth_token.size()) +
                           " bytes; the limit is " + std::to_string(tcp_store::kMaxKeyBytes));
  if (options.is_server) return tcp_store::start_server(options, out);
  if (options.host.empty())
    return InvalidArgument("the store's host is empty; set MASTER_ADDR (or init_method tcp://HOST:PORT)");
  if (options.port < 1 || options.port > 65535)
    return InvalidArgument("store port " + std::to_string(options.port) +
                           " is not in 1..65535; set MASTER_PORT to the port rank 0 listens on");
  return tcp_store::connect_client(options, out);
}

int tcp_store_port(const Store& store) { return tcp_store::server_port(store); }

}  // namespace comm
