// The init verdict down a binomial tree (verdict_tree.h; docs/design/base.md, "Hot keys").
//
// The wire, one exchange per connection: the child sends the item's tag (kAsk) and the digest
// key's 64 hex characters; the parent, once it has that item, answers only when that digest is
// its item's (so the listener gives the verdict, secret included, only to whoever could read the
// digest from the store, hence the verdict itself), with an 8-byte little-endian length and the
// bytes, and closes. It is a listener of its own, not the socket transport's: that one exists
// only when the socket transport is likely, and its acceptor speaks the authenticated handshake.
#include "verdict_tree.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "crypto/sha256.h"
#include "log.h"
#include "params.h"
#include "posix/socket.h"

namespace comm {
namespace {

using posix::Fd;

// Per TreeItem, in its order.
constexpr char kAsk[2][8] = {{'C', 'O', 'M', 'M', 'V', 'R', 'D', '1'}, {'C', 'O', 'M', 'M', 'R', 'C', 'H', '1'}};
constexpr size_t kItems = sizeof kAsk / sizeof kAsk[0];
constexpr size_t kTagBytes = sizeof kAsk[0];
constexpr size_t kAskBytes = kTagBytes + 64;
// A verdict is O(ranks) bytes (about 30 a rank), a reachability summary O(hosts) lines; anything
// far larger is neither.
constexpr uint64_t kMaxVerdictBytes = 64u << 20;

// Writes or reads all of `n` bytes on a non-blocking socket before `deadline`.
Status io_all(int fd, void* buf, size_t n, bool write, Deadline deadline, const char* what) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t k = write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return RemoteError(std::string("the connection closed while ") + what);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return SystemError(std::string(what) + ": " + errno_string(errno));
    if (deadline.expired()) return Timeout(std::string("no progress while ") + what);
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    (void)::poll(&pfd, 1, deadline.remaining_ms(100));
  }
  return Status::Ok();
}

// One child's connection at the server: its request so far.
struct Child {
  Fd fd;
  std::string ask;
};

}  // namespace

std::string verdict_digest(const std::string& verdict) {
  return hex(sha256(verdict.data(), verdict.size())) + " " + std::to_string(verdict.size());
}

struct VerdictServer::Impl {
  int rank = 0;
  std::string hook;
  Fd listener;
  Fd wake_read, wake_write;  // a pipe: publish and the destructor wake the thread
  std::string address;
  std::mutex mu;
  std::string value[kItems];  // per TreeItem, guarded by mu; "" until published
  std::string digest_hex[kItems];
  std::atomic<bool> stop{false};
  std::thread thread;

  void wake() {
    char b = 1;
    (void)!::write(wake_write.get(), &b, 1);
  }

  // Answers a child whose request is complete, once its item is here; true when done with it.
  bool answer(Child& c, const std::string (&values)[kItems], const std::string (&digests)[kItems]) {
    size_t item = 0;
    while (item < kItems && std::memcmp(c.ask.data(), kAsk[item], kTagBytes) != 0) ++item;
    const bool known = item < kItems;
    if (known && values[item].empty()) return false;  // not yet: keep it
    if (hook == "stall") return false;  // test hook: hold every child until comm_init ends
    if (!known || c.ask.compare(kTagBytes, 64, digests[item]) != 0) {
      COMM_INFO(kInit, "rank %d: init tree: a request for another verdict or summary, or not one, from %s: closed",
                rank, posix::peer_address(c.fd.get()).c_str());
      return true;
    }
    const std::string& v = values[item];
    std::string reply(8, '\0');
    const uint64_t n = v.size();
    for (int i = 0; i < 8; ++i) reply[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    reply += v;
    if (hook == "corrupt") reply[reply.size() / 2] ^= 0x20;  // test hook: the child must not trust it
    // A verdict fits the socket's buffer; a child that does not read costs at most this.
    Status st = io_all(c.fd.get(), reply.data(), reply.size(), true, Deadline::after_ms(2000), "answering a child");
    if (!st.ok()) COMM_INFO(kInit, "rank %d: init tree: %s", rank, st.message().c_str());
    return true;
  }

  void run() {
    std::vector<Child> children;
    while (!stop.load()) {
      std::vector<pollfd> fds = {{listener.get(), POLLIN, 0}, {wake_read.get(), POLLIN, 0}};
      for (auto& c : children)
        fds.push_back({c.fd.get(), static_cast<short>(c.ask.size() < kAskBytes ? POLLIN : 0), 0});
      (void)::poll(fds.data(), fds.size(), 1000);
      if (fds[1].revents != 0) {
        char buf[64];
        while (::read(wake_read.get(), buf, sizeof buf) > 0) {
        }
      }
      std::string values[kItems], digests[kItems];
      {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t k = 0; k < kItems; ++k) {
          values[k] = value[k];
          digests[k] = digest_hex[k];
        }
      }
      for (size_t i = 0; i < children.size();) {
        Child& c = children[i];
        bool done = false;
        if (c.ask.size() < kAskBytes && (fds[2 + i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          char buf[kAskBytes];
          const ssize_t k = ::recv(c.fd.get(), buf, kAskBytes - c.ask.size(), 0);
          if (k > 0) c.ask.append(buf, static_cast<size_t>(k));
          done = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        }
        if (!done && c.ask.size() == kAskBytes) done = answer(c, values, digests);
        if (done) {
          children.erase(children.begin() + static_cast<long>(i));
          fds.erase(fds.begin() + static_cast<long>(2 + i));
        } else {
          ++i;
        }
      }
      // Accepted last: the loop above reads `fds` by the children's index.
      if (fds[0].revents != 0)
        for (int fd; (fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;)
          children.push_back({Fd(fd), {}});
    }
  }
};

VerdictServer::VerdictServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Status VerdictServer::start(int rank, const std::string& host, int family, bool guess_local, const std::string& hook,
                            std::unique_ptr<VerdictServer>* out) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->hook = hook;
  posix::SockAddr bound;
  COMM_RETURN_IF_ERROR(posix::listen_on(host, family, 64, &impl->listener, &bound));
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return SystemError("pipe2() failed: " + errno_string(errno));
  impl->wake_read.reset(p[0]);
  impl->wake_write.reset(p[1]);
  impl->address = std::string(1, guess_local ? 'L' : 'R') + posix::format_address(bound);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  out->reset(new VerdictServer(std::move(impl)));
  return Status::Ok();
}

VerdictServer::~VerdictServer() {
  impl_->stop.store(true);
  impl_->wake();
  impl_->thread.join();
}

const std::string& VerdictServer::address() const { return impl_->address; }

void VerdictServer::publish(TreeItem item, const std::string& value) {
  const auto k = static_cast<size_t>(item);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->value[k] = value;
    impl_->digest_hex[k] = hex(sha256(value.data(), value.size()));
  }
  impl_->wake();
}

Status fetch_verdict(TreeItem item, const std::string& tagged_addr, bool same_host, const std::string& digest,
                     Deadline deadline, std::string* verdict) {
  if (tagged_addr.size() < 2 || (tagged_addr[0] != 'L' && tagged_addr[0] != 'R'))
    return Unavailable("it has no listener");
  if (tagged_addr[0] == 'L' && !same_host) return Unavailable("it listens on a loopback address of another host");
  const size_t space = digest.find(' ');
  if (space != 64) return Internal("malformed digest key '" + digest + "'");
  const uint64_t want = std::strtoull(digest.c_str() + space + 1, nullptr, 10);
  posix::SockAddr addr;
  COMM_RETURN_IF_ERROR(posix::parse_address(tagged_addr.substr(1), &addr));
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return SystemError("socket() failed: " + errno_string(errno));
  if (::connect(fd.get(), addr.get(), addr.len) != 0) {
    if (errno != EINPROGRESS) return SystemError("connect() failed: " + errno_string(errno));
    // A parent whose address drops packets (a firewall) costs its children at most a second,
    // not their slice (docs/topology.md, "Messy networks"): a parent on the job's network answers
    // a SYN in far less, and a child that gives up early only reads the store instead.
    int connect_ms = 0;
    (void)params::socket_connect_timeout_ms(&connect_ms);  // bad: the default (the socket transport refuses it)
    connect_ms = std::min(connect_ms, 1000);
    const Deadline answered_by = Deadline::after_ms(connect_ms);
    pollfd pfd{fd.get(), POLLOUT, 0};
    while (::poll(&pfd, 1, deadline.remaining_ms(100)) == 0)
      if (deadline.expired() || answered_by.expired())
        return Timeout("its TCP handshake was not answered within " + std::to_string(connect_ms) +
                       " ms (COMM_SOCKET_CONNECT_TIMEOUT_MS)");
    int err = 0;
    socklen_t len = sizeof err;
    (void)::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return SystemError("connect() failed: " + errno_string(err));
  }
  std::string ask(kAsk[static_cast<size_t>(item)], kTagBytes);
  ask.append(digest, 0, 64);
  COMM_RETURN_IF_ERROR(io_all(fd.get(), ask.data(), ask.size(), true, deadline, "asking"));
  unsigned char head[8];
  COMM_RETURN_IF_ERROR(io_all(fd.get(), head, sizeof head, false, deadline, "waiting for the answer"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
  if (n != want || n > kMaxVerdictBytes)
    return Internal("it answered " + std::to_string(n) + " bytes, the digest key says " + std::to_string(want));
  std::string got(static_cast<size_t>(n), '\0');
  COMM_RETURN_IF_ERROR(io_all(fd.get(), got.data(), got.size(), false, deadline, "reading the answer"));
  if (hex(sha256(got.data(), got.size())) != digest.substr(0, 64))
    return Internal("its answer does not match the digest rank 0 published");
  *verdict = std::move(got);
  return Status::Ok();
}

}  // namespace comm
