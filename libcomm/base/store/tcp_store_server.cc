// Rank 0's side of the TCP store: one background thread, poll(), many clients. Rank 0's
// own process uses the same object through the Store interface, without a socket.
//
// A get for a missing key is parked (the connection is not read further) until some rank
// sets the key; nothing busy-polls. A connection that sends anything but well-formed frames
// is dropped with a warning naming the peer; the server goes on serving the others.
//
// Before its hello is accepted a connection is a stranger: it may send only a hello and, when
// the job has an auth token, the proof that answers the server's challenge (tcp_store_wire.h;
// a few KiB, read no further than that), within TcpStoreOptions::hello_timeout_ms, and only
// max_unauthenticated strangers are kept (the oldest goes for a new one). Otherwise anyone
// who reaches the port could make rank 0 buffer 64 MiB per connection, or hold its
// descriptors until accept() fails and the job dies.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "log.h"
#include "store/tcp_store_wire.h"
#include "store/int_value.h"

namespace comm::tcp_store {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadBudgetPerWake = size_t{4} << 20;  // fairness between busy clients
// The largest frame a stranger may send: protocol 1's hello, whose key was the token, so that its
// clients are told their version is wrong instead of being dropped. Larger than a hello or a proof.
constexpr size_t kMaxHelloBytes = kRequestHeaderBytes + kMaxKeyBytes + 4;
// Descriptors rank 0 keeps for everything but the store (its transports, files, libraries).
constexpr size_t kReservedFds = 64;

// How many clients the server holds at once: its soft descriptor limit less the reserve. Past
// it, a new client costs an idle or waiting one its connection (shed(); the client reconnects,
// tcp_store.cc), so 512 ranks start under ulimit -n 256 instead of filling rank 0's table.
size_t connection_cap() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  size_t soft = static_cast<size_t>(lim.rlim_cur);
  return soft > 2 * kReservedFds ? soft - kReservedFds : std::max<size_t>(soft / 2, 8);
}

struct Conn {
  posix::Fd fd;
  std::string peer;
  std::string in;  // received, not yet handled (from in_done on)
  size_t in_done = 0;
  std::string out;  // to send (from out_done on)
  size_t out_done = 0;
  bool greeted = false;  // hello accepted (and with a token, the client's proof checked)
  bool challenged = false;  // kChallenge sent: the proof may come
  Nonce client_nonce{};
  Nonce server_nonce{};
  Clock::time_point hello_by{};  // dropped when not greeted by then
  bool parked = false;   // a get waits for parked_key
  std::string parked_key;
  bool dead = false;

  bool pending_out() const { return out_done < out.size(); }
};

class Server final : public Store {
 public:
  Server(posix::Fd listen_fd, posix::Fd wake_fd, int port, std::string where, const TcpStoreOptions& options)
      : listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        port_(port),
        where_(std::move(where)),
        token_(options.auth_token),
        host_(options.host),
        hello_timeout_(std::chrono::milliseconds(std::max(1, options.hello_timeout_ms))),
        max_strangers_(static_cast<size_t>(std::max(1, options.max_unauthenticated))),
        read_buf_(kReadChunk) {}

  ~Server() override {
    stop_.store(true, std::memory_order_relaxed);
    wake();
    if (thread_.joinable()) thread_.join();
  }

  Status start_thread() {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      return SystemError(std::string("store server: cannot start its thread: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const { return port_; }
  bool dies_with_rank0() const override { return true; }
  std::string reach_address() const override { return host_; }

  using Store::set;  // the set with a deadline: this store waits on no other process
  Status set(const std::string& key, const std::string& value) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, value.size()));
    store_value(key, value);
    wake();
    return Status::Ok();
  }

  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, 0));
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return data_.count(key) != 0; }))
      return Timeout("timed out waiting for key '" + key + "' in the store served at " + where_ +
                     ": no rank set it in time (did every rank start, with the same init_method?)");
    *value = data_[key];
    return Status::Ok();
  }

  Status add(const std::string& key, int64_t delta, int64_t* result) override {
    COMM_RETURN_IF_ERROR(check_sizes(key, 0));
    COMM_RETURN_IF_ERROR(add_value(key, delta, result));
    wake();
    return Status::Ok();
  }

 private:
  void store_value(const std::string& key, const std::string& value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }

  Status add_value(const std::string& key, int64_t delta, int64_t* result) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !parse_int64(it->second, &current))
        return InvalidUsage("store add on key '" + key + "', whose value is not an integer");
      int64_t now = 0;
      if (__builtin_add_overflow(current, delta, &now))
        return InvalidArgument("store add on key '" + key + "' overflows a 64-bit integer");
      data_[key] = std::to_string(now);
      *result = now;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  bool lookup(const std::string& key, std::string* value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) return false;
    *value = it->second;
    return true;
  }

  void wake() {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
    (void)n;  // EAGAIN: the counter is already non-zero, the thread wakes anyway
  }

  // ---- the server thread; everything below touches conns_ from it only ----

  void run() {
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_relaxed)) {
      bool accepting = Clock::now() >= accept_resume_;
      fds.clear();
      fds.push_back({wake_fd_.get(), POLLIN, 0});
      fds.push_back({listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      for (auto& c : conns_) {
        short events = POLLRDHUP;
        if (c->pending_out())
          events |= POLLOUT;
        else if (!c->parked)
          events |= POLLIN;
        fds.push_back({c->fd.get(), events, 0});
      }
      size_t polled = conns_.size();
      int timeout_ms = accepting ? -1 : 100;
      if (Clock::time_point first = first_hello_deadline(); first != Clock::time_point::max()) {
        // Wake up for the next stranger's hello deadline.
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - Clock::now()).count();
        const int until = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
        timeout_ms = timeout_ms < 0 ? until : std::min(timeout_ms, until);
      }
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        COMM_WARN(kStore, "store server %s: poll failed: %s", where_.c_str(), errno_string(errno).c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (fds[0].revents & POLLIN) {
        uint64_t count;
        ssize_t r = ::read(wake_fd_.get(), &count, sizeof count);
        (void)r;
        check_parked_ = true;  // an in-process set or add may have supplied a parked key
      }
      for (size_t i = 0; i < polled; ++i) handle(*conns_[i], fds[i + 2].revents);
      drop_late_strangers();
      if (fds[1].revents & POLLIN) accept_all();
      serve_parked();
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
    }
    conns_.clear();
  }

  // Closes one connection with no request in progress (an idle one first, else the oldest
  // parked get): its client retries on a new connection. false: none can go.
  bool shed() {
    Conn* victim = nullptr;
    for (auto& c : conns_) {
      if (c->dead || c->pending_out() || c->in.size() > c->in_done || !c->greeted) continue;
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

  void accept_all() {
    for (;;) {
      if (live_connections() >= cap_ && !shed()) {
        accept_resume_ = Clock::now() + std::chrono::milliseconds(10);
        return;
      }
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (posix::out_of_fds(errno) && shed()) continue;
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
      make_room_for_stranger();
      conns_.push_back(std::move(c));
    }
  }

  // Connections that have not said hello, oldest first (they are accepted in order).
  size_t strangers() const {
    size_t n = 0;
    for (const auto& c : conns_) n += !c->dead && !c->greeted;
    return n;
  }

  void make_room_for_stranger() {
    if (strangers() < max_strangers_) return;
    for (auto& c : conns_) {
      if (c->dead || c->greeted) continue;
      drop(*c, "closed for a newer connection: " + std::to_string(max_strangers_) +
                   " connections were already waiting to say hello (a port scanner, or a flood?)");
      c->fd.reset();  // now, not at the end of this round: the descriptor is what runs out
      return;
    }
  }

  Clock::time_point first_hello_deadline() const {
    Clock::time_point first = Clock::time_point::max();
    for (const auto& c : conns_)
      if (!c->dead && !c->greeted) first = std::min(first, c->hello_by);
    return first;
  }

  void drop_late_strangers() {
    const Clock::time_point now = Clock::now();
    for (auto& c : conns_)
      if (!c->dead && !c->greeted && now >= c->hello_by)
        drop(*c, "no hello within " + std::to_string(hello_timeout_.count()) +
                     " ms of connecting (not a libcomm rank, or one stuck before its hello?)");
  }

  void handle(Conn& c, short revents) {
    if (c.dead) return;
    if (revents & (POLLERR | POLLNVAL)) {
      closed(c, "socket error");
      return;
    }
    if (revents & POLLOUT) pump(c);
    if (revents & POLLIN)
      read_some(c);
    else if (revents & (POLLHUP | POLLRDHUP))
      closed(c, "peer closed");
  }

  // A client going away is normal (a rank finished, or timed out and reconnects).
  void closed(Conn& c, const char* why) {
    COMM_TRACE(kStore, "store server %s: connection from %s ended (%s)", where_.c_str(), c.peer.c_str(), why);
    c.dead = true;
  }

  void drop(Conn& c, const std::string& why) {
    COMM_WARN(kStore, "store server %s: dropping connection from %s: %s", where_.c_str(), c.peer.c_str(),
              why.c_str());
    c.dead = true;
  }

  void read_some(Conn& c) {
    size_t budget = kReadBudgetPerWake;
    while (!c.dead && !c.parked && !c.pending_out() && budget > 0) {
      // A stranger is read no further than the largest hello.
      size_t want = read_buf_.size();
      if (!c.greeted) {
        const size_t held = c.in.size() - c.in_done;
        if (held >= kMaxHelloBytes) return drop(c, "sent more than a hello before its hello was answered");
        want = std::min(want, kMaxHelloBytes - held);
      }
      ssize_t n = ::recv(c.fd.get(), read_buf_.data(), want, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(read_buf_.data(), static_cast<size_t>(n));
        budget -= std::min(budget, static_cast<size_t>(n));
        pump(c);
        continue;
      }
      if (n == 0) return closed(c, "peer closed");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return closed(c, "receive failed");
    }
  }

  void flush(Conn& c) {
    while (c.pending_out()) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return closed(c, "send failed");
    }
    c.out.clear();
    c.out_done = 0;
  }

  void reply(Conn& c, Reply r, std::string_view payload) { c.out += encode_response(r, payload); }

  // Sends what is queued, then handles complete frames one at a time, as long as the
  // connection is neither parked nor backed up (a client that does not read its replies
  // stops being read: its buffers stay bounded by one frame).
  void pump(Conn& c) {
    for (;;) {
      if (c.dead) return;
      flush(c);
      if (c.dead || c.pending_out() || c.parked) break;
      size_t avail = c.in.size() - c.in_done;
      const char* p = c.in.data() + c.in_done;
      if (avail >= 4 && get_u32(p) != kMagic) {
        char why[64];
        snprintf(why, sizeof why, "bad magic 0x%08x (not a libcomm store client)", get_u32(p));
        return drop(c, why);
      }
      if (avail < kRequestHeaderBytes) break;
      RequestHeader h;
      std::string why = check_request_header(p, &h);
      if (!why.empty()) return drop(c, why);
      // Before the body is buffered: a stranger's only allowed frame is its hello.
      if (!c.greeted && h.op != Op::kHello && !(c.challenged && h.op == Op::kProof))
        return drop(c, "sent a request before the hello");
      size_t total = kRequestHeaderBytes + h.key_len + h.value_len;
      if (avail < total) break;
      std::string key(p + kRequestHeaderBytes, h.key_len);
      std::string value(p + kRequestHeaderBytes + h.key_len, h.value_len);
      c.in_done += total;
      handle_request(c, h.op, key, value);
    }
    if (c.in_done > 0) {
      c.in.erase(0, c.in_done);
      c.in_done = 0;
    }
  }

  void handle_request(Conn& c, Op op, const std::string& key, const std::string& value) {
    if (op == Op::kHello) return hello(c, key, get_u32(value.data()));
    if (op == Op::kProof) return proof(c, value);
    if (!c.greeted) return drop(c, "sent a request before the hello");
    switch (op) {
      case Op::kSet:
        store_value(key, value);
        check_parked_ = true;
        return reply(c, Reply::kOk, "");
      case Op::kGet: {
        std::string found;
        if (lookup(key, &found)) return reply(c, Reply::kOk, found);
        c.parked = true;
        c.parked_key = key;
        return;
      }
      case Op::kAdd: {
        int64_t result = 0;
        Status st = add_value(key, static_cast<int64_t>(get_u64(value.data())), &result);
        if (!st.ok()) return reply(c, Reply::kError, st.message());
        check_parked_ = true;
        std::string payload;
        put_u64(&payload, static_cast<uint64_t>(result));
        return reply(c, Reply::kOk, payload);
      }
      case Op::kHello:
      case Op::kProof:
        break;
    }
  }

  void hello(Conn& c, const std::string& nonce, uint32_t version) {
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
    if (nonce.size() != 0 && nonce.size() != kNonceBytes)
      return drop(c, "its hello carries a " + std::to_string(nonce.size()) + "-byte nonce, not 0 or " +
                         std::to_string(kNonceBytes));
    if (token_.empty()) {
      // No token, nothing to prove; a client with one gives up on its own (tcp_store.cc).
      c.greeted = true;
      return reply(c, Reply::kOk, "");
    }
    if (nonce.empty()) return refuse(c, "it presented no COMM_AUTH_TOKEN (a rank started without the job's token?)");
    Status st = random_nonce(&c.server_nonce);
    if (!st.ok()) return drop(c, st.message());
    std::memcpy(c.client_nonce.data(), nonce.data(), kNonceBytes);
    c.challenged = true;
    reply(c, Reply::kChallenge,
          std::string_view(reinterpret_cast<const char*>(c.server_nonce.data()), c.server_nonce.size()));
  }

  // The answer to the challenge: the client proved the token first, so a stranger never gets a
  // value computed with it.
  void proof(Conn& c, const std::string& presented) {
    if (c.greeted || !c.challenged) return drop(c, "sent a proof it was not asked for");
    if (!check_proof(token_, kProofContext, Prover::kClient, c.client_nonce, c.server_nonce,
                     reinterpret_cast<const uint8_t*>(presented.data())))
      return refuse(c, "its proof of COMM_AUTH_TOKEN is wrong (a rank with another token, or not a rank of this job)");
    c.greeted = true;
    const Digest mine = proof_of_secret(token_, kProofContext, Prover::kServer, c.client_nonce, c.server_nonce);
    reply(c, Reply::kOk, std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size()));
  }

  void refuse(Conn& c, const std::string& why) {
    COMM_WARN(kStore, "store server %s: refused connection from %s: %s", where_.c_str(),
              c.peer.c_str(), why.c_str());
    reply(c, Reply::kAuthRefused, "");
    flush(c);
    c.dead = true;
  }

  // Answers parked gets whose key now exists; answering may run further requests of that
  // client, which may set keys other clients wait for, hence the loop.
  void serve_parked() {
    while (check_parked_) {
      check_parked_ = false;
      for (auto& c : conns_) {
        if (c->dead || !c->parked) continue;
        std::string value;
        if (!lookup(c->parked_key, &value)) continue;
        c->parked = false;
        c->parked_key.clear();
        reply(*c, Reply::kOk, value);
        pump(*c);
      }
    }
  }

  // Shared with in-process callers.
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> data_;

  posix::Fd listen_fd_;
  posix::Fd wake_fd_;
  const int port_;
  const std::string where_;
  const std::string token_;
  const std::string host_;  // the host it was told to listen on (MASTER_ADDR), "" for any
  const std::chrono::milliseconds hello_timeout_;
  const size_t max_strangers_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  size_t live_connections() const {
    size_t n = 0;
    for (const auto& c : conns_) n += c->dead ? 0 : 1;
    return n;
  }

  // Server thread only.
  const size_t cap_ = connection_cap();
  size_t shed_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<char> read_buf_;
  bool check_parked_ = false;
  Clock::time_point accept_resume_{};
};

// Returns 0 or the errno of the step that failed.
int bind_and_listen(const sockaddr* sa, socklen_t len, bool dual_stack, posix::Fd* out) {
  posix::Fd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  int one = 1;
  if (setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) return errno;
  if (sa->sa_family == AF_INET6) {
    int v6only = dual_stack ? 0 : 1;
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  }
  if (::bind(fd.get(), sa, len) != 0) return errno;
  if (::listen(fd.get(), SOMAXCONN) != 0) return errno;
  *out = std::move(fd);
  return 0;
}

int bind_wildcard(int family, int port, posix::Fd* out, std::string* bound_host) {
  if (family == AF_INET6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    *bound_host = "::";
    return bind_and_listen(reinterpret_cast<sockaddr*>(&a), sizeof a, true, out);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  *bound_host = "0.0.0.0";
  return bind_and_listen(reinterpret_cast<sockaddr*>(&a), sizeof a, false, out);
}

}  // namespace

Status start_server(const TcpStoreOptions& options, std::shared_ptr<Store>* out) {
  if (options.port < 0 || options.port > 65535)
    return InvalidArgument("store port " + std::to_string(options.port) + " is not in 0..65535");
  const std::string& host = options.host;
  std::string bound_host = host;
  posix::Fd fd;
  int err = 0;
  if (host.empty()) {
    err = bind_wildcard(AF_INET6, options.port, &fd, &bound_host);
    if (err == EAFNOSUPPORT) err = bind_wildcard(AF_INET, options.port, &fd, &bound_host);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    std::string port_text = std::to_string(options.port);
    int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
    if (rc != 0)
      return SystemError("store: cannot resolve '" + host + "' to listen on (" + gai_strerror(rc) +
                         "); set MASTER_ADDR (or the host of tcp://HOST:PORT) to rank 0's host name or address");
    int family = AF_UNSPEC;
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      if (family == AF_UNSPEC) family = ai->ai_family;
      err = bind_and_listen(ai->ai_addr, ai->ai_addrlen, false, &fd);
      if (err != EADDRNOTAVAIL) break;
    }
    freeaddrinfo(found);
    if (err == EADDRNOTAVAIL) {
      // The name resolves, but not to an address of this host (NAT, a load balancer, a name
      // that means rank 0's host only from the outside): listen on every address instead.
      err = bind_wildcard(family, options.port, &fd, &bound_host);
      if (err == 0)
        COMM_INFO(kStore, "store: '%s' is not an address of this host; listening on %s instead", host.c_str(),
                  host_port_string(bound_host, options.port).c_str());
    }
  }
  std::string where = host_port_string(bound_host, options.port);
  if (err == EADDRINUSE)
    return SystemError("store: cannot listen on " + where + ": port " + std::to_string(options.port) +
                       " is already in use (another job, or a previous run that has not exited); pick another "
                       "MASTER_PORT (or the port of init_method tcp://HOST:PORT)");
  if (err != 0)
    return SystemError("store: cannot listen on " + where + ": " + errno_string(err) +
                       (err == EACCES ? "; ports below 1024 need privileges, pick another MASTER_PORT" : ""));

  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    return SystemError("store: getsockname on " + where + ": " + errno_string(errno));
  int port = local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  where = host_port_string(bound_host, port);

  posix::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return SystemError("store: eventfd: " + errno_string(errno));
  auto server = std::make_shared<Server>(std::move(fd), std::move(wake), port, where, options);
  COMM_RETURN_IF_ERROR(server->start_thread());
  COMM_INFO(kStore, "store server listening on %s", where.c_str());
  *out = std::move(server);
  return Status::Ok();
}

int server_port(const Store& store) {
  auto* server = dynamic_cast<const Server*>(&store);
  return server != nullptr ? server->port() : -1;
}

}  // namespace comm::tcp_store
