// The shared-memory transport's class, shared by its parts: setup.cc (segments, agreement),
// shm_transport.cc (requests, waits, failures), progress.cc (the channels) and
// local_access.cc (one-sided calls).
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/any_source.h"
#include "common/request_pool.h"
#include "shm/domain.h"
#include "shm/futex.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "shm/shm_transport.h"

namespace comm::transport::shm {

constexpr uint32_t kPoolBits = 10;  // 1024 requests in flight at once
constexpr uint32_t kNil = UINT32_MAX;
constexpr long kSliceNs = 20 * 1000 * 1000;  // futex sleeps: abort, deaths and deadlines between slices
constexpr long kFirstSliceNs = 100 * 1000;   // ... starting this short and doubling
constexpr uint64_t kRingDepth = 4;           // steps of a large call in flight through the staging rings


struct Geometry {
  ControlGeometry control;
  size_t zero_copy_min = 0;  // messages from this size are read from the sender's buffer
};

struct Request {  // in the transport's RequestPool (transports/common/request_pool.h)
  bool is_send = false;
  bool done = false;
  int peer = -1;  // local index
  OpTag tag;
  char* buf = nullptr;
  size_t bytes = 0;
  size_t moved = 0;          // bytes copied into (send) or out of (receive) the channel so far
  uint64_t until_tail = 0;   // zero-copy send: done once the receiver's tail reaches this
  bool awaited = false;      // a receive the wait's last look found unfinished (charge_requests)
  uint32_t next = kNil;      // the queue it is in
  // A receive from any rank (irecv_any) until it matched: peer -1, in any_recvs_.
  bool any = false;
  int* source = nullptr;              // irecv_any: the matched rank goes here
  const uint64_t* next_seq = nullptr;  // irecv_any: the caller's per-rank receive counters
};

struct Queue {
  uint32_t head = kNil;
  uint32_t tail = kNil;
  bool empty() const { return head == kNil; }
};

// One local peer as this rank sees it.
struct Peer {
  int rank = -1;        // in the communicator
  int dom = -1;         // index in the domain (arenas, processes)
  Segment mapping;      // its control segment (ours: ShmTransport::own_)
  ControlHeader* header = nullptr;
  ControlLines* lines = nullptr;
  char* slots = nullptr;
  char* channels = nullptr;
  Queue sends, acks, recvs;
  CallDesc desc{};      // its descriptor for the current call, copied at wait_posted()
  const char* mapped_in = nullptr;   // its buffers for the current call, when read in place
  const char* mapped_out = nullptr;
  char* ring = nullptr;              // its staging ring for the current call
  // Idle detection (check_idle, the watcher's thread only): its beat counter as last seen, and
  // when it was first seen at that value (unset: not looked at yet).
  uint64_t beat_seen = 0;
  bool silenced = false;  // idle detection failed this transport on its silence
  bool reported = false;  // its failure report was read (peer_errors) and kept
  std::chrono::steady_clock::time_point beat_seen_at{};
  // The same for the thread that drives the transport, looked at in a wait's slow path (await:
  // after the spinning, before each sleep), for the hang trace (silent_ms).
  uint64_t beat_heard = 0;
  std::chrono::steady_clock::time_point beat_heard_at{};
};

class ShmTransport final : public Transport, public LocalAccess {
 public:
  ShmTransport(Options options, std::vector<int> local_ranks, const std::vector<int>& world_ranks,
               std::shared_ptr<Domain> domain, Geometry geometry);
  ~ShmTransport() override;

  // setup.cc: this rank's segment, then every local peer's.
  Status create_own(const std::string& secret, const std::string& comm_id);
  Status map_peers(const std::string& secret, const std::string& comm_id, Store& store, Deadline deadline);
  void unlink_own() { own_.unlink(); }

  // ---- Transport
  const char* name() const override { return "shm"; }
  Status post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                  RequestId* id) override;
  Status probe_any(int* source) override;
  Status wait(const RequestId* ids, size_t n) override;
  Status test(RequestId id, bool* done) override;
  Status wait_some(const RequestId* ids, size_t n) override;
  void wake() override;
  void notify_peers(const Status& failure, uint64_t order) override;
  void lost_peers(std::vector<int>* out) override { find_lost(out, Silence::kNow); }
  void closed_peers(std::vector<int>* out) override { find_lost(out, Silence::kAsOfFailure); }
  void gone_peers(std::vector<int>* out) override { find_lost(out, Silence::kNever); }
  int64_t silent_ms(int peer) override;  // the driving thread's, after a wait failed
  Status check_idle() override;
  void beat() override;
  void abort() override;
  LocalAccess* local() override { return this; }

  // ---- LocalAccess (local_access.cc)
  const std::vector<int>& local_ranks() const override { return local_ranks_; }
  int local_index() const override { return me_; }
  const std::vector<int>& host_of() const override { return options_.host_of; }
  int hosts() const override { return hosts_; }
  int ranks_per_host() const override { return ranks_per_host_; }
  Status begin(const OpTag& tag) override;
  size_t slot_bytes() const override { return geometry_.control.slot_bytes; }
  char* slot(int i) override;
  Status post() override;
  Status wait_posted(int i) override;
  Status expose(const void* in, void* out, size_t bytes, size_t chunk_bytes) override;
  const char* mapped_input(int i) override;
  const char* mapped_output(int i) override;
  char* in_slot(int i, uint64_t step, int owner) override;
  char* out_slot(int i, uint64_t step) override;
  uint64_t ring_depth() const override { return kRingDepth; }
  void publish(Mark mark, uint64_t steps) override;
  Status wait_mark(int i, Mark mark, uint64_t steps) override;
  Status finish() override;
  void count_bytes(int i, uint64_t sent, uint64_t received) override;

  // Whether peers may be read with process_vm_readv (agreed communicator-wide at setup).
  bool cma() const { return domain_->cma(); }
  int local_of(int rank) const;  // local index of a communicator rank, -1 if not local
  void note_beats(std::chrono::steady_clock::time_point now);  // await's slow path: Peer::beat_heard

 private:
  // ---- waits (shm_transport.cc)
  // Spins, then sleeps on this rank's doorbell, until step() says done. step(&done, &moved)
  // drives progress; slow(timed_out) runs between sleeps: deaths and disagreements of the
  // peers this wait involves, and (timed_out) the TIMEOUT naming them. Bounded by timeout_ms
  // of no progress; ends at once on abort or a peer's reported failure. Every failure is kept
  // (fail): the transport stays failed, as transport.h says. charge(ns): the stretch since the
  // loop last read its clock, for the peers this wait needs (per-peer waits, Arrivals::waited).
  template <class Step, class Slow, class Charge>
  // order: the operation waited on (OpTag::order), for peers' reports (Transport::concerns).
  Status await(uint64_t order, Step&& step, Slow&& slow, Charge&& charge);
  // Per-peer waits over the whole call (docs/observability.md, "Per-peer waits over the whole
  // call"): ns charged to local peer i; flowing: its data of this wait had begun to come.
  void charge(int i, uint64_t ns, bool flowing);
  // A wait on requests: the stretch to the peers of receives unfinished at the last look.
  void charge_requests(const RequestId* ids, size_t n, uint64_t ns);
  Status usable();
  Status fail(const Status& st) {
    if (failed_.ok()) failed_ = st;
    return failed_;
  }
  // A local peer's report that concerns the operation of order `order` (Transport::concerns;
  // kAnyOrder: any report), else OK. Reports are kept (Transport::keep_report) as they are seen.
  Status peer_errors(uint64_t order);
  // The order a wait on these requests stands at: the latest (0 if any is unknown).
  uint64_t order_of(const RequestId* ids, size_t n);
  // A failed wait on requests: records the peers it still waited on (Transport::wait_failure).
  Status note_unfinished(const Status& failure, const RequestId* ids, size_t n);
  // A failed one-sided wait on local peer i (this call's tag).
  Status note_peer(const Status& failure, int i) {
    note_awaited(failure, peers_[static_cast<size_t>(i)].rank, tag_);
    seal_wait_failure(failure);
    return failure;
  }
  Status check_alive(int i, const std::string& during);
  // In a wait's slow path (after note_beats): the awaited local peer's beat counter still for the
  // silence limit, also since before this wait began (the one-sided waits in local_access.cc and
  // the request waits' request_stuck; the socket transport's silent_awaited says why).
  Status check_silent(int i, const OpTag& tag);
  // lost_peers, closed_peers and gone_peers: a process gone; but for kNever, a peer idle detection
  // convicted of silence; for kNow, on a transport that has not failed, a beat counter still for
  // the silence limit.
  void find_lost(std::vector<int>* out, Silence silence);
  // Idle detection: local peer i's beat counter stood still for the silence limit.
  Status check_beating(int i, std::chrono::steady_clock::time_point now);
  // Wakes local peer i if it sleeps (after a store it may be waiting for).
  // fenced: our stores are ordered before the look at their flag (a full fence, which waits
  // for them to reach the peer's cache). Unfenced, a peer that fell asleep in that instant sees
  // the store at its next wake-up instead, at most one (short, growing) futex slice later.
  void ring(int i, bool fenced = true);
  void ring_all(bool fenced = true);
  std::string me() const;
  std::string who(int i) const { return "rank " + std::to_string(peers_[static_cast<size_t>(i)].rank); }

  // ---- requests and channels (progress.cc)
  Status post_request(const Post& call, RequestId* id) override;  // after transport.h's checks
  bool reaches(int peer) const override { return peer != rank() && local_of(peer) >= 0; }
  const char* reach_rule() const override { return "another rank on this host"; }
  void release(uint32_t index) {
    if (pool_.release(index)) --active_;
  }
  void push(Queue& q, uint32_t index);
  uint32_t pop(Queue& q);
  Status progress(bool* moved);
  bool send_progress(int i);
  bool ack_progress(int i);
  Status recv_progress(int i, bool* moved);
  // Gives the oldest receives from any rank the messages waiting at the head of a channel
  // that no earlier receive claims (progress.cc).
  Status match_any(bool* moved);
  // The local index of a peer whose message at the head of its channel a receive from any rank
  // would take (a send/recv's, no receive posted for that peer), in turn; -1: none.
  int find_any();
  ChannelHead* channel_out(int i) const;  // this rank -> i, in this rank's segment
  ChannelHead* channel_in(int i) const;   // i -> this rank, in i's segment
  SlotHeader* slot_of(ChannelHead* ch, uint64_t n) const;
  Status request_stuck(const Request& r, bool timed_out, std::string* text);
  // A peer that runs a one-sided call with this sequence number while we expect a message.
  Status one_sided_disagreement(int i, const OpTag& mine);
  // A message from i for a collective with our sequence number but another tag.
  Status channel_disagreement(int i, const OpTag& mine);

  // ---- one-sided (local_access.cc)
  Status wait_counter(int i, std::atomic<uint64_t>& c, uint64_t at_least, const char* what, bool flowing);
  Status wait_slot(int i);
  SlotHead* slot_head(int i);

  std::vector<int> local_ranks_;
  int me_ = 0;
  std::vector<int> local_of_;  // communicator rank -> local index or -1
  int hosts_ = 1;
  int ranks_per_host_ = 0;
  std::shared_ptr<Domain> domain_;
  Geometry geometry_;
  Segment own_;
  std::vector<Peer> peers_;  // by local index; our own entry points at own_
  ControlLines* my_lines_ = nullptr;
  ControlHeader* my_header_ = nullptr;

  RequestPool<Request, kPoolBits> pool_{"shm"};
  size_t active_ = 0;  // requests posted and not released
  Queue any_recvs_;    // receives from any rank not matched yet, oldest first
  int any_turn_ = 0;   // where match_any looks first: every local peer gets its turn

  // One-sided call state.
  uint64_t call_ = 0;        // calls begun
  bool small_call_ = false;  // posted through the slots (no expose)
  OpTag tag_;
  uint64_t mark_base_[kMarks] = {};
  size_t chunk_bytes_ = 0;
  char* ring_ = nullptr;  // this rank's staging ring in its arena (in-slots, then out-slots)
  size_t ring_bytes_ = 0;

  std::chrono::nanoseconds spin_{0};
  std::chrono::nanoseconds yield_{0};  // after spinning, yield the core this long before sleeping
  std::atomic<bool> aborted_{false};
  // Set by the first of notify_peers and abort (which may run on another thread, comm_abort's):
  // only one of them writes this rank's failure into its header.
  std::atomic<bool> published_{false};
  // Writes a failure into this rank's header and wakes every local peer (notify_peers, abort).
  void publish_failure(const std::string& text, comm_status_t code, uint64_t order);
  std::atomic<bool> woken_{false};
  Status failed_;
};

}  // namespace comm::transport::shm

// ---- the one wait loop ------------------------------------------------------------------------
namespace comm::transport::shm {

template <class Step, class Slow, class Charge>
Status ShmTransport::await(uint64_t order, Step&& step, Slow&& slow, Charge&& charge) {
  using Clock = std::chrono::steady_clock;
  COMM_RETURN_IF_ERROR(usable());
  const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
  auto last_move = Clock::now();
  auto spin_until = last_move + spin_;
  unsigned spins = 0;
  int sleeps = 0;
  // Per-peer waits: charged only at the clock reads this loop makes anyway (every 64 spins, each
  // move, each wake-up), plus one when a wait that got that far ends. A wait that ends before the
  // first of them (a few microseconds of spinning) reads no clock for it and is not charged.
  const bool charging = arrivals() != nullptr;
  auto charged_at = last_move;
  bool looked = false;
  auto settle = [&](Clock::time_point now) {
    if (!charging) return;
    charge(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - charged_at).count()));
    charged_at = now;
    looked = true;
  };
  auto ended = [&] {
    if (looked) settle(Clock::now());
    return Status::Ok();
  };
  for (;;) {
    bool done = false, moved = false;
    if (Status st = step(&done, &moved); !st.ok()) return fail(st);
    if (done) return ended();
    if (moved) {
      last_move = Clock::now();
      settle(last_move);
      spin_until = last_move + spin_;
      continue;
    }
    if (aborted_.load(std::memory_order_acquire)) return usable();
    if (spin_.count() > 0 && (++spins & 63u) != 0) {  // the clock only every 64 rounds: ~30 ns each
      cpu_relax();
      continue;
    }
    const auto now = Clock::now();
    settle(now);
    if (now < spin_until) continue;
    if (now < spin_until + yield_) {
      // More ranks than cores: let the peer we wait for have this core, and stay runnable
      // (a futex wake-up costs a scheduling decision; a yield only a turn).
      sched_yield();
      continue;
    }

    if (Status st = peer_errors(order); !st.ok()) return fail(st);
    note_beats(now);
    const bool timed_out = now - last_move >= timeout;
    if (Status st = slow(timed_out); !st.ok()) return fail(st);
    if (timed_out) return fail(Timeout(me() + ": no progress for " + std::to_string(options_.timeout_ms) + " ms"));

    // Sleep until a peer rings (it checks `sleeping` after each store we may wait for) or a
    // slice passes. The flag is set before the last look, so no ring falls in between.
    my_lines_->sleeping.value.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t bell = my_lines_->doorbell.word.load(std::memory_order_seq_cst);
    Status st = step(&done, &moved);
    // Short slices first (a peer's unfenced ring may just have missed us), growing to kSliceNs.
    if (st.ok() && !done && !moved && !aborted_.load(std::memory_order_acquire))
      futex_wait(&my_lines_->doorbell.word, bell, std::min(kSliceNs, kFirstSliceNs << std::min(sleeps++, 20)));
    my_lines_->sleeping.value.store(0, std::memory_order_relaxed);
    if (!st.ok()) return fail(st);
    if (done) return ended();
    if (moved) sleeps = 0;
    const auto woke = Clock::now();
    settle(woke);
    last_move = moved ? woke : last_move;
    spin_until = woke + (moved ? spin_ : std::chrono::nanoseconds(0));
  }
}

}  // namespace comm::transport::shm
