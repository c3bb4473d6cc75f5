// Rank 0's side of the TCP store, serving: one background thread, poll(), many clients. Rank
// 0's own process uses the same object through the Store interface, without a socket.
//
// A get for a missing key is parked (the connection is not read further) until some rank
// sets the key; nothing busy-polls. A connection that sends anything but well-formed frames
// is dropped with a warning naming the peer; the server goes on serving the others. Who may
// connect and say what before its hello: tcp_store_admission.cc.
#include "store/tcp_store_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

#include "log.h"
#include "store/int_value.h"

namespace comm::tcp_store {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadBudgetPerWake = size_t{4} << 20;  // fairness between busy clients
// The largest frame a stranger may send: protocol 1's hello, whose key was the token, so that its
// clients are told their version is wrong instead of being dropped. Larger than a hello or a proof.
constexpr size_t kMaxHelloBytes = kRequestHeaderBytes + kMaxKeyBytes + 4;

}  // namespace

Server::Server(posix::Fd listen_fd, posix::Fd wake_fd, int port, std::string where, const TcpStoreOptions& options)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      where_(std::move(where)),
      token_(options.auth_token),
      tls_(options.tls),
      host_(options.host),
      hello_timeout_(std::chrono::milliseconds(std::max(1, options.hello_timeout_ms))),
      max_strangers_(stranger_limit(options)),
      cap_(connection_cap()),
      read_buf_(kReadChunk) {}

Server::~Server() {
  stop_.store(true, std::memory_order_relaxed);
  wake();
  if (thread_.joinable()) thread_.join();
}

Status Server::start_thread() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return SystemError(std::string("store server: cannot start its thread: ") + e.what());
  }
  return Status::Ok();
}

Status Server::set(const std::string& key, const std::string& value) {
  COMM_RETURN_IF_ERROR(check_sizes(key, value.size()));
  store_value(key, value);
  wake();
  return Status::Ok();
}

Status Server::get(const std::string& key, std::string* value, Deadline deadline) {
  COMM_RETURN_IF_ERROR(check_sizes(key, 0));
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline.at(), [&] { return data_.count(key) != 0; }))
    return Timeout("timed out waiting for key '" + key + "' in the store served at " + where_ +
                   ": no rank set it in time (did every rank start, with the same init_method?)");
  *value = data_[key];
  return Status::Ok();
}

Status Server::add(const std::string& key, int64_t delta, int64_t* result) {
  COMM_RETURN_IF_ERROR(check_sizes(key, 0));
  COMM_RETURN_IF_ERROR(add_value(key, delta, result));
  wake();
  return Status::Ok();
}

void Server::store_value(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Status Server::add_value(const std::string& key, int64_t delta, int64_t* result) {
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

bool Server::lookup(const std::string& key, std::string* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  *value = it->second;
  return true;
}

void Server::wake() {
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  (void)n;  // EAGAIN: the counter is already non-zero, the thread wakes anyway
}

void Server::run() {
  std::vector<pollfd> fds;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool buffered = false;  // COMM_TLS: a connection holds bytes poll() cannot see
    bool accepting = Clock::now() >= accept_resume_;
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    for (auto& c : conns_) {
      short events = POLLRDHUP;
      if (c->tls_handshaking)
        events |= c->tls_events;
      else if (c->pending_out())
        events |= POLLOUT;
      else if (!c->parked)
        events |= POLLIN;
      fds.push_back({c->fd.get(), events, 0});
      buffered = buffered || c->tls_buffered();
    }
    size_t polled = conns_.size();
    int timeout_ms = buffered ? 0 : accepting ? -1 : 10;
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
    for (size_t i = 0; i < polled; ++i)
      handle(*conns_[i], static_cast<short>(fds[i + 2].revents | (conns_[i]->tls_buffered() ? POLLIN : 0)));
    drop_late_strangers();
    // Accept whenever the pause is over, not only when poll said so: a pause for room must end
    // by itself once a stranger has spoken or gone.
    if ((fds[1].revents & POLLIN) || (!accepting && Clock::now() >= accept_resume_)) accept_all();
    serve_parked();
    std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
  }
  conns_.clear();
}

size_t Server::live_connections() const {
  size_t n = 0;
  for (const auto& c : conns_) n += c->dead ? 0 : 1;
  return n;
}

void Server::handle(Conn& c, short revents) {
  if (c.dead) return;
  if (revents & (POLLERR | POLLNVAL)) {
    closed(c, "socket error");
    return;
  }
  if (c.tls_handshaking) {
    if (revents != 0) tls_step(c);
    return;
  }
  if (revents & POLLOUT) pump(c);
  if (revents & POLLIN)
    read_some(c);
  else if (revents & (POLLHUP | POLLRDHUP))
    closed(c, "peer closed");
}

// A client going away is normal (a rank finished, or timed out and reconnects).
void Server::closed(Conn& c, const char* why) {
  COMM_TRACE(kStore, "store server %s: connection from %s ended (%s)", where_.c_str(), c.peer.c_str(), why);
  c.dead = true;
}

void Server::drop(Conn& c, const std::string& why) {
  COMM_WARN(kStore, "store server %s: dropping connection from %s: %s", where_.c_str(), c.peer.c_str(), why.c_str());
  c.dead = true;
}

void Server::read_some(Conn& c) {
  size_t budget = kReadBudgetPerWake;
  while (!c.dead && !c.parked && !c.pending_out() && !c.tls_handshaking && budget > 0) {
    // A stranger is read no further than the largest hello.
    size_t want = read_buf_.size();
    if (!c.greeted) {
      const size_t held = c.in.size() - c.in_done;
      if (held >= kMaxHelloBytes) return drop(c, "sent more than a hello before its hello was answered");
      want = std::min(want, kMaxHelloBytes - held);
    }
    ssize_t n = tls::recv_some(c.tls.get(), c.fd.get(), read_buf_.data(), want);
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

void Server::flush(Conn& c) {
  while (c.pending_out()) {
    ssize_t n = tls::send_some(c.tls.get(), c.fd.get(), c.out.data() + c.out_done, c.out.size() - c.out_done);
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
  if (c.tls_next) start_tls(c);
}

void Server::reply(Conn& c, Reply r, std::string_view payload) { c.out += encode_response(r, payload); }

// Sends what is queued, then handles complete frames one at a time, as long as the
// connection is neither parked nor backed up (a client that does not read its replies
// stops being read: its buffers stay bounded by one frame).
void Server::pump(Conn& c) {
  for (;;) {
    if (c.dead) return;
    flush(c);
    if (c.dead || c.pending_out() || c.parked || c.tls_handshaking) break;
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

void Server::handle_request(Conn& c, Op op, const std::string& key, const std::string& value) {
  if (op == Op::kHello) return hello(c, key, get_u32(value.data()), value.size() == 8 ? get_u32(value.data() + 4) : 0);
  if (op == Op::kProof) return proof(c, value);
  if (!c.greeted) return drop(c, "sent a request before the hello");
  c.asked = true;
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

// Answers parked gets whose key now exists; answering may run further requests of that
// client, which may set keys other clients wait for, hence the loop.
void Server::serve_parked() {
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

}  // namespace comm::tcp_store
