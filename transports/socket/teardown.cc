// comm_destroy on sockets (docs/design/transports.md, "Closing without a reset"): GOODBYE on every
// connection, a half-close, then a bounded wait until the peer has every byte (or closed) while
// reading what it still sends, so that no reset throws away this rank's last bytes still on their
// way over a slow link.
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "log.h"
#include "socket/socket_transport_impl.h"

namespace comm::transport::sock {
namespace {

// A peer whose kernel takes none of our bytes for this long (a dead host, a stopped process whose
// receive buffer is full) is left: the close may then reset it. Bounded by COMM_TIMEOUT_MS.
constexpr int kDrainQuietMs = 2000;

// Reads and drops what the peer still sent (at most 1 MiB a look: a peer that keeps sending
// cannot hold the loop); true once it closed (or the connection broke).
bool drop_input(int fd) {
  char sink[4096];
  for (int i = 0; i < 256; ++i) {
    const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return !would_block(errno);
  }
  return false;
}

// Bytes this side sent that the peer has not acknowledged yet.
uint64_t unacked(int fd) {
  int queued = 0;
  return ::ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0 ? static_cast<uint64_t>(queued) : 0;
}

}  // namespace

SocketTransport::~SocketTransport() {
  stop_progress_thread();
  // A failed rank already told its peers why; an aborted one looks dead to them, as it is.
  if (aborted_.load(std::memory_order_acquire) || !failed_.ok()) return;
  std::vector<pollfd> open;  // half-closed connections whose peer may still lack some of our bytes
  for (auto& c : conns_) {
    // Closed: a peer that left (or died) already; nothing of ours can reach it any more.
    if (c.closed || !c.fd.valid() || mid_frame(c)) continue;
    if (drop_input(c.fd.get())) continue;  // it closed meanwhile: nothing to wait for
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.kind = static_cast<uint8_t>(FrameKind::kGoodbye);
    h.coll = static_cast<uint8_t>(CollKind::kInternal);
    h.root = rank();
    iovec iov{&h, sizeof h};
    ssize_t n = conn_send(c, &iov, 1);
    (void)n;  // best effort: a peer that misses it takes this close for a death
    if (::shutdown(c.fd.get(), SHUT_WR) == 0) open.push_back(pollfd{c.fd.get(), POLLIN, 0});
  }
  drain(open);
}

// A connection is done once the peer closed it or its kernel acknowledged every byte we sent and
// our FIN (SIOCOUTQ is 0): then a later reset (a heartbeat of the peer's meeting our closed
// socket) finds our data on its side already, readable before the error. Waiting for the peer's
// own close would cost as long as the peer takes to look (its watcher, COMM_HEARTBEAT_MS), or to be
// destroyed in turn where one thread destroys several ranks' communicators. Bounded: no progress
// (no connection done, no fewer unacknowledged bytes) for kDrainQuietMs, or COMM_TIMEOUT_MS in all.
void SocketTransport::drain(std::vector<pollfd>& open) {
  const auto start = Clock::now();
  const auto limit = std::chrono::milliseconds(options_.timeout_ms);
  const auto quiet = std::chrono::milliseconds(std::min(options_.timeout_ms, kDrainQuietMs));
  auto last_progress = start;
  uint64_t queued = UINT64_MAX;
  int nap_ms = 0;  // the first look at once, then 1, 2, 4 ... 64 ms: loopback acknowledges in microseconds
  for (;;) {
    uint64_t left = 0;
    for (size_t i = 0; i < open.size();) {
      const uint64_t q = unacked(open[i].fd);
      if (drop_input(open[i].fd) || q == 0) {
        open[i] = open.back();
        open.pop_back();
        last_progress = Clock::now();
        continue;
      }
      left += q;
      ++i;
    }
    if (open.empty()) return;
    if (left < queued) last_progress = Clock::now();
    queued = left;
    const auto now = Clock::now();
    if (now - start >= limit || now - last_progress >= quiet) {
      COMM_INFO(kNet, "%s: comm_destroy: %zu connection(s) closed with %llu bytes unacknowledged (waited %lld ms)",
                me().c_str(), open.size(), static_cast<unsigned long long>(left),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()));
      return;
    }
    nap_ms = nap_ms == 0 ? 1 : std::min(2 * nap_ms, 64);
    if (::poll(open.data(), open.size(), nap_ms) < 0 && errno != EINTR) return;
  }
}

}  // namespace comm::transport::sock
