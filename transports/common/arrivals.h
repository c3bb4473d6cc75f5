// Straggler detection's measurement (docs/observability.md): how long this rank waited, from the
// start of a collective, for each peer's first message of it. Only this rank's clock is read, so
// nothing assumes clocks agree across hosts. The core marks the collective that runs (begin/end);
// a transport reports each message as it arrives or meets its posted receive (Transport::arrived),
// and only the first of each peer in that collective is counted. One per communicator, shared by every
// transport that carries it (the routed transport's two halves report into the same one).
//
// Plain relaxed atomics: the metrics snapshot (libcomm/src/observe/snapshot.cc) reads them from
// another thread while the transports write them; a reader may see a count and its wait total
// one message apart (a diagnostic, never a crash).
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "transport.h"

namespace comm::transport {

class Arrivals {
 public:
  explicit Arrivals(int size) : size_(size), peers_(new Peer[static_cast<size_t>(size > 0 ? size : 0)]) {}

  // Wall-clock nanoseconds: the flight recorder's clock, so a call's start is read once.
  static uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  }

  // The issuing thread, around one collective (seq != 0) that started at start_ns.
  void begin(uint64_t seq, uint64_t start_ns) {
    last_peer_.store(-1, std::memory_order_relaxed);
    last_wait_ns_.store(0, std::memory_order_relaxed);
    start_ns_.store(start_ns, std::memory_order_relaxed);
    seq_.store(seq, std::memory_order_release);
  }
  void end() { seq_.store(0, std::memory_order_relaxed); }

  // A message of a collective from `peer` arrived (a transport that sees arrivals: sockets) or
  // met its posted receive (the thread that drives the transport). Only the first of each peer
  // in a collective counts; one for a later collective than the running one came early: no wait.
  // Collectives' sequence numbers grow, and each peer's messages come in order. waited = false:
  // the message was there when this rank first looked for it, so it did not wait, and no clock is
  // read (a clock read costs ~35 ns here, 3-5 % of an 8 B all-reduce between two local ranks; one
  // read while this rank waits anyway costs nothing).
  void seen(int peer, const OpTag& tag, bool waited = true) {
    // The top bit marks the runtime's own checks (libcomm/src/strict.cc): not a collective's number.
    if (tag.coll == CollKind::kSendRecv || (tag.seq >> 63) != 0 || peer < 0 || peer >= size_) return;
    Peer& p = peers_[static_cast<size_t>(peer)];
    if (p.last_seq.load(std::memory_order_relaxed) >= tag.seq) return;
    const uint64_t seq = seq_.load(std::memory_order_acquire);
    uint64_t wait = 0;
    if (tag.seq == seq && waited) {
      const uint64_t now = now_ns(), start = start_ns_.load(std::memory_order_relaxed);
      wait = now > start ? now - start : 0;
    } else if (seq != 0 && tag.seq < seq) {
      return;  // not this communicator's collective numbering (the runtime's own traffic)
    }
    // One writer per peer (the thread that drives the transport reaching it): load and store.
    p.wait_ns.store(p.wait_ns.load(std::memory_order_relaxed) + wait, std::memory_order_relaxed);
    p.messages.store(p.messages.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    p.last_seq.store(tag.seq, std::memory_order_release);
    if (tag.seq != seq) return;
    // The latest first message names the call's last arrival, but only when it came clearly
    // after the one named so far: a message that was there all along and was matched only when
    // its receive was posted, after a wait for someone else (recursive doubling's second step),
    // comes a few microseconds after that wait and must not take its name.
    const uint64_t last = last_wait_ns_.load(std::memory_order_relaxed);
    if (last_peer_.load(std::memory_order_relaxed) < 0 || wait > last + last / 8 + kTieNs) {
      last_wait_ns_.store(wait, std::memory_order_relaxed);
      last_peer_.store(peer, std::memory_order_relaxed);
    }
  }

  int size() const { return size_; }
  // The running collective's sequence number, 0 between collectives.
  uint64_t running_seq() const { return seq_.load(std::memory_order_acquire); }
  // The peer whose first message came last in the collective begun last, and this rank's wait
  // for it from the collective's start (-1 and 0: no message came, as a broadcast's root sees).
  int last_peer() const { return last_peer_.load(std::memory_order_relaxed); }
  uint64_t last_wait_ns() const { return last_wait_ns_.load(std::memory_order_relaxed); }
  // Per peer: first messages counted, the waits for them summed, and the last collective one came in.
  uint64_t messages(int peer) const { return peers_[static_cast<size_t>(peer)].messages.load(std::memory_order_relaxed); }
  uint64_t wait_ns(int peer) const { return peers_[static_cast<size_t>(peer)].wait_ns.load(std::memory_order_relaxed); }
  uint64_t last_seq(int peer) const { return peers_[static_cast<size_t>(peer)].last_seq.load(std::memory_order_acquire); }

  // The rest of the call, not only its first message (a slow link shows here, docs/observability.md):
  // the transport's wait thread charges each stretch it blocked to every peer whose receive was
  // still unfinished; `flowing`: that receive's message had begun to arrive (its header matched),
  // so the stretch was spent on the peer's bytes in transit (a slow link or a slow sender), not on
  // the peer being late. Called only where the wait blocked (one clock read per wake-up).
  void waited(int peer, uint64_t ns, bool flowing) {
    if (peer < 0 || peer >= size_) return;
    Peer& p = peers_[static_cast<size_t>(peer)];
    add(p.recv_wait_ns, ns);
    if (flowing) add(p.flow_wait_ns, ns);
  }
  // A message to (sent) or from the peer completed: its payload bytes.
  void moved(int peer, bool sent, uint64_t bytes) {
    if (peer < 0 || peer >= size_) return;
    Peer& p = peers_[static_cast<size_t>(peer)];
    add(sent ? p.sent_bytes : p.recv_bytes, bytes);
  }
  // A connection to the peer that had to be dialed again (a failed attempt retried).
  void redialed(int peer) {
    if (peer >= 0 && peer < size_) peers_[static_cast<size_t>(peer)].reconnects.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t recv_wait_ns(int peer) const { return get(peer, &Peer::recv_wait_ns); }
  uint64_t flow_wait_ns(int peer) const { return get(peer, &Peer::flow_wait_ns); }
  uint64_t sent_bytes(int peer) const { return get(peer, &Peer::sent_bytes); }
  uint64_t recv_bytes(int peer) const { return get(peer, &Peer::recv_bytes); }
  uint64_t reconnects(int peer) const { return get(peer, &Peer::reconnects); }

 private:
  static constexpr uint64_t kTieNs = 200000;  // 0.2 ms
  struct Peer {
    std::atomic<uint64_t> last_seq{0}, messages{0}, wait_ns{0};
    // One writer per peer (the thread driving the transport that reaches it, under its lock).
    std::atomic<uint64_t> recv_wait_ns{0}, flow_wait_ns{0}, sent_bytes{0}, recv_bytes{0};
    std::atomic<uint64_t> reconnects{0};  // the mesh's thread: fetch_add, rare
  };
  static void add(std::atomic<uint64_t>& a, uint64_t v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  uint64_t get(int peer, std::atomic<uint64_t> Peer::*field) const {
    return (peers_[static_cast<size_t>(peer)].*field).load(std::memory_order_relaxed);
  }
  const int size_;
  std::unique_ptr<Peer[]> peers_;
  std::atomic<uint64_t> seq_{0}, start_ns_{0}, last_wait_ns_{0};
  std::atomic<int> last_peer_{-1};
};

inline void Transport::arrived(int peer, const OpTag& tag, bool waited) {
  if (options_.arrivals) options_.arrivals->seen(peer, tag, waited);
}
inline void Transport::moved_bytes(int peer, bool sent, uint64_t bytes) {
  if (options_.arrivals) options_.arrivals->moved(peer, sent, bytes);
}

}  // namespace comm::transport
