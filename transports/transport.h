// The narrow point-to-point interface every host algorithm is written against.
// Algorithms never see sockets, shared memory or UCX; transports never know which
// collective runs (they only carry its OpTag so a receiver can check it).
//
// Model: non-blocking two-sided isend/irecv of byte ranges, matched in posting order
// per (peer) -- both sides post in the same order, as every collective does -- and a
// wait that drives progress inline. Where a transport can, it also offers direct access
// to a peer's registered region (shared memory maps it; UCX has RMA): algorithms ask
// local() (see LocalAccess) and fall back to two-sided without it.
//
// Threading: one thread drives a transport at a time (the communicator's rule);
// abort() may be called from any thread and wakes every wait.
#pragma once

#include <atomic>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deadline.h"
#include "posix/endpoints.h"
#include "posix/fd.h"
#include "status.h"
#include "store/store.h"
#include "tls/tls.h"

namespace comm::transport {

enum class CollKind : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kReduce = 3,
  kAllgather = 4,
  kReduceScatter = 5,
  kAlltoall = 6,
  kBarrier = 7,
  kSendRecv = 8,
  kInternal = 9,  // the runtime's own traffic (split, init checks)
};
const char* coll_name(CollKind kind);

// The identity of one call. Every frame on the wire carries it; a receiver whose posted
// tag differs fails with COMM_ERR_INVALID_USAGE naming both sides.
struct OpTag {
  uint64_t seq = 0;  // collectives: the communicator's sequence number; p2p: per-peer counter
  CollKind coll = CollKind::kInternal;
  uint8_t dtype = 0;
  uint8_t op = 0;
  int32_t root = -1;
  uint64_t count = 0;
  // Where the call stands in this rank's order of calls, for failure reports (never on the wire
  // with the data, never compared): the core's stamp() gives collective #s the order 2s and a
  // send/recv issued after collective #s-1 the order 2s-1; 0: unknown (a report naming it, or a
  // wait on it, fails at once, as before reports named their operation).
  uint64_t order = 0;
};
bool operator==(const OpTag& a, const OpTag& b);
// "allreduce #17 (count 100, float32, sum)"
std::string describe(const OpTag& tag);

using RequestId = uint32_t;
class Arrivals;  // common/arrivals.h: straggler detection's per-peer waits

// ---- one-sided access among the ranks of one host ---------------------------------------
//
// A transport that maps its local peers' memory (shared memory) offers this view; algorithms
// that read peers' data in place are written against it and nothing else. One call:
//   begin(tag)                      every local rank, for the same calls in the same order
//   small: copy into slot(me); post()            large: expose(in, out, bytes, chunk)
//   wait_posted(i) for each peer i  (INVALID_USAGE naming both sides if its tag differs)
//   small: read slot(i)                          large: steps of one chunk per slice, through
//                                                       marks that peers wait on; finish()
// A peer is never more than one call ahead, so slots and descriptors alternate by parity.
class LocalAccess {
 public:
  virtual ~LocalAccess() = default;
  // This communicator's ranks on this host, ascending (this rank among them), and this rank's
  // index there; every rank's host (0.., numbered in order of each host's first rank).
  virtual const std::vector<int>& local_ranks() const = 0;
  virtual int local_index() const = 0;
  virtual const std::vector<int>& host_of() const = 0;
  virtual int hosts() const = 0;           // how many hosts the communicator spans
  virtual int ranks_per_host() const = 0;  // 0 when hosts hold different numbers of ranks

  virtual Status begin(const OpTag& tag) = 0;

  // Small messages: local rank i's slot for this call (slot_bytes() long, written by its owner).
  virtual size_t slot_bytes() const = 0;
  virtual char* slot(int i) = 0;
  virtual Status post() = 0;  // publishes this call's tag (and slot) to the local peers
  virtual Status wait_posted(int i) = 0;

  // Large messages, in steps of `chunk_bytes` of every slice: exposes this rank's input and
  // output (`bytes` each) and posts. A buffer from comm_mem_alloc is read in place
  // (mapped_input/mapped_output); an ordinary one travels through its owner's staging ring,
  // ring_depth() steps deep: in_slot(i, step, owner) holds rank i's input chunk of owner's
  // slice, out_slot(i, step) rank i's result chunk.
  virtual Status expose(const void* in, void* out, size_t bytes, size_t chunk_bytes) = 0;
  virtual const char* mapped_input(int i) = 0;  // nullptr: through in_slot
  virtual const char* mapped_output(int i) = 0;  // nullptr: through out_slot
  virtual char* in_slot(int i, uint64_t step, int owner) = 0;
  virtual char* out_slot(int i, uint64_t step) = 0;
  virtual uint64_t ring_depth() const = 0;
  // Progress marks, counted in steps from the start of the call; peers wait on them.
  enum class Mark : int {
    kStaged = 0,    // this rank's input chunks of that many steps are in its in_slots
    kConsumed = 1,  // it has reduced its slice's chunks of that many steps (read every in_slot)
    kResult = 2,    // its result chunks of that many steps are readable (output or out_slot)
    kGathered = 3,  // it has copied every peer's result chunks of that many steps
  };
  virtual void publish(Mark mark, uint64_t steps) = 0;
  virtual Status wait_mark(int i, Mark mark, uint64_t steps) = 0;
  // Ends a large call: returns once no local peer reads this rank's buffers any more.
  virtual Status finish() = 0;
  // Per-peer bytes of a call that moved no messages (docs/observability.md, "Per-peer bytes over
  // shared memory"): what local rank i read of this rank's buffers (sent) and this rank of its.
  virtual void count_bytes(int i, uint64_t sent, uint64_t received) = 0;
};

// Where a socket-based transport listens: the interface the core chose from the plan and
// COMM_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (topology/interfaces.h), with the reason for the log.
struct ListenAddress {
  // Numeric, in order of preference (topology's choose_socket_addresses); empty: loopback when
  // all_local. A listener on each; dialers try them all (docs/topology.md, "Messy networks").
  std::vector<posix::LocalAddress> addresses;
  std::string why;
  std::string route_ifname;  // the interface that reaches the store's host ("" unknown): a failure's fix
};

// The world's socket listener, made by the core before the init verdict, and every rank's
// address, which came in that verdict (docs/design/base.md, "Hot keys"): the socket transport
// adopts both instead of listening and reading the address table from the store.
struct EarlyListener {
  std::vector<posix::Fd> fds;      // listening, non-blocking, CLOEXEC; moved out by the adopter
  std::vector<std::string> table;  // per rank, its addresses (posix/endpoints.h: "eth1/host:port,...")
};

// Memory the job's ranks on one host reach in place (comm_mem_alloc): made by a host-local
// transport when the world connects, shared by every communicator derived from the world.
class JobMemory {
 public:
  virtual ~JobMemory() = default;
  virtual Status allocate(size_t bytes, void** out) = 0;
  // Frees p when it came from job memory of this process; false when it did not.
  virtual bool release(void* p) = 0;
};

struct Options {
  int rank = 0;
  int size = 1;
  int timeout_ms = 600000;       // a wait with no progress from its peer for this long fails
  std::string secret;            // per-job secret from the rendezvous; data connections present it
  std::shared_ptr<Store> store;  // prefixed for this communicator: addresses are exchanged here
  std::string comm_label;        // for log lines, e.g. "comm 0x1a2b"
  bool all_local = false;        // every rank is on this host (from the rendezvous)
  std::vector<int> host_of;      // every rank's host index (from the rendezvous); empty: unknown
  ListenAddress listen;          // socket transport: where to listen
  std::shared_ptr<EarlyListener> early;  // socket transport: listener and table from the verdict
  // From the tuning profile when the environment leaves them unset; 0: the registry's value.
  int64_t shm_slot_bytes = 0;    // COMM_SHM_SLOT_BYTES
  int64_t socket_nconns = 0;     // COMM_SOCKET_NCONNS
  // COMM_HEARTBEAT_MS: how often a rank tells its connected peers it is alive (socket frames);
  // 0: no heartbeats, so no silence verdict (closes and exits are still seen).
  int heartbeat_ms = 0;
  // COMM_TLS: the socket transport's connections run TLS 1.3 in this context (tls/tls.h; the
  // core derives its key from the job secret); null: plaintext.
  std::shared_ptr<tls::Context> tls;
  // Straggler detection (common/arrivals.h), shared by every transport of the communicator;
  // null: not measured (a subset view, a test's transport).
  std::shared_ptr<Arrivals> arrivals;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  int rank() const { return options_.rank; }
  int size() const { return options_.size; }

  // Post a send/receive of `bytes` bytes to/from `peer` (!= rank). Buffers must stay valid
  // until the request completes. Requests come from a preallocated pool (no hot-path malloc).
  // The entry checks are made here, once for every transport (checked_post below); the
  // transport's post_request() only queues and starts what passed them.
  Status isend(int peer, const OpTag& tag, const void* buf, size_t bytes, RequestId* id) {
    return checked_post(Post{true, peer, tag, static_cast<char*>(const_cast<void*>(buf)), bytes}, id);
  }
  Status irecv(int peer, const OpTag& tag, void* buf, size_t bytes, RequestId* id) {
    return checked_post(Post{false, peer, tag, static_cast<char*>(buf), bytes}, id);
  }
  // A receive from whichever peer's next send/recv message comes first (MPI_ANY_SOURCE, Gloo's
  // recvFromAny). It takes a message from peer p only when no receive posted before it waits
  // for p (the caller posts no receive after it until it completes), so messages from one peer
  // still match in order. The message is checked as irecv() checks it, against `tag` with
  // seq = next_seq[p] (the caller's per-peer receive counter, read when it matches); *source
  // is written with p when it matches. Messages of collectives are never taken.
  // Its argument checks are made here, once, as isend/irecv's; then the transport's post_any().
  Status irecv_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                   RequestId* id) {
    if (id == nullptr || next_seq == nullptr || source == nullptr)
      return InvalidArgument(std::string(name()) + " transport: null pointer for a receive from any rank");
    if (buf == nullptr && bytes > 0)
      return InvalidArgument(std::string(name()) + " transport: null buffer for " + std::to_string(bytes) +
                             " bytes");
    if (tag.order > posted_order_) posted_order_ = tag.order;
    return post_any(tag, next_seq, buf, bytes, source, id);
  }

  // For a transport that routes to others (routed/routed_transport.cc), which cannot hand one
  // receive from any rank to two of them: moves what can move without blocking, then sets
  // *source to a peer whose next message is one irecv_any would take now (a send/recv's that no
  // posted receive claims), or to -1. Takes nothing: a directed receive from that peer, posted
  // next with seq = next_seq[peer], is the one that takes it. Peers are reported in turn.
  virtual Status probe_any(int* source) {
    *source = -1;
    return no_any_source();
  }
  Status no_any_source() const {
    return Status(COMM_ERR_UNAVAILABLE, std::string("the ") + name() +
                                            " transport has no receive from any source (COMM_ANY_SOURCE); "
                                            "receive from a named rank, or run every rank over one transport "
                                            "(COMM_TRANSPORT=socket, or ucx)");
  }

  // Drive progress until every listed request completes. Fails with TIMEOUT when no byte
  // moves for timeout_ms (naming the peer waited on), REMOTE when a peer died or reported an
  // error, INVALID_USAGE on a tag or length mismatch, ABORTED after abort(). After a failure
  // the transport stays failed: every later call returns the same status.
  virtual Status wait(const RequestId* ids, size_t n) = 0;
  // Progress without blocking; *done when the request completed (then it is released).
  virtual Status test(RequestId id, bool* done) = 0;

  // Drive progress until at least one listed request has completed (collect it with test())
  // or wake() was called since the last wait_some. Failures as wait(). The communicator's
  // worker uses it to keep non-blocking sends/receives moving while new calls may arrive.
  // Default, for transports that cannot block here: return at once (the caller polls).
  virtual Status wait_some(const RequestId* ids, size_t n) {
    (void)ids;
    (void)n;
    return Status::Ok();
  }
  // Any thread: makes a blocked wait_some() (or the next one) return at once.
  virtual void wake() {}

  // Best effort, non-blocking: tell every peer this rank failed, so ranks waiting on
  // someone else still end promptly with the reason (INVALID_USAGE stays INVALID_USAGE).
  // `order` (OpTag::order) names the operation that failed here: a peer still in an earlier
  // operation finishes it with the data this rank sent before the report, and fails from that
  // operation on (concerns() below; docs/design/core.md, "Which calls a failure fails"). 0: unknown,
  // every peer's wait fails at once.
  virtual void notify_peers(const Status& failure, uint64_t order) = 0;

  // Any thread: every pending and future wait ends with COMM_ERR_ABORTED.
  virtual void abort() = 0;

  // Idle detection (libcomm/src/watch.cc): called between calls by the communicator's watcher,
  // never while another thread drives the transport. Reads what peers sent (their failure
  // reports), sends heartbeats when due, and fails when a peer is gone: it closed its
  // connections without saying goodbye (comm_destroy does), its process exited, or it sent
  // nothing for timeout_ms. The transport then stays failed. Default: nothing to watch.
  virtual Status check_idle() { return Status::Ok(); }
  // The order a failure check_idle() found concerns, for notify_peers: a kept peer's report's
  // (concerns() below), else the first operation not posted yet. The routed transport asks its
  // parts; the socket transport takes its lock (its progress thread may read a report meanwhile).
  virtual uint64_t idle_failure_order() {
    return posted_order_ + 1 > kept_.order ? posted_order_ + 1 : kept_.order;
  }

  // The peers this transport has seen gone for good (their process exited, or closed a connection
  // without comm_destroy's goodbye), also after it failed; never blocks, appends ascending.
  // comm_agree_failed publishes them as this rank's suspicions (libcomm/src/agree.cc).
  virtual void lost_peers(std::vector<int>* out) { (void)out; }
  // The same without judging a silence that goes on now: a process gone, a connection closed, and
  // (socket transport) a silence as of the transport's failure. For a rank that waits in the
  // agreement on a communicator whose watcher stopped (libcomm/src/agree.cc, own_suspicions): no
  // one reads the heartbeats then, so a silence seen then proves nothing. The transports without
  // a silence rule have nothing to leave out.
  virtual void closed_peers(std::vector<int>* out) { lost_peers(out); }
  // Only what proves a peer gone: its process gone, or a connection closed without goodbye; never
  // a silence, not even the one that failed the transport. For waits that fail early on a dead
  // peer (libcomm/src/setup_watch.cc: a set-up, a shrink), where a rank that was only silent
  // for a while, and took part since, must not be taken for dead.
  virtual void gone_peers(std::vector<int>* out) { closed_peers(out); }
  // How long this transport has heard nothing from `peer`, in ms (as of its failure, once it
  // failed); -1 when it cannot tell (no heartbeats, no connection). A live peer is heard every
  // COMM_HEARTBEAT_MS, also while it waits: the hang trace takes a long silence for a stalled
  // rank instead of waiting for it to report (libcomm/src/blame.cc).
  virtual int64_t silent_ms(int peer) {
    (void)peer;
    return -1;
  }

  // Whether a peer's report of a failure in the operation of order `report` fails a wait on an
  // operation of order `op`: the reporter sent all its data of earlier operations before its
  // report, so only that operation and later ones fail. Either unknown (0): it does.
  static bool concerns(uint64_t report, uint64_t op) { return report == 0 || op == 0 || op >= report; }
  // Any thread, never blocks: the watcher calls it every COMM_HEARTBEAT_MS, also while a call
  // drives the transport, so that peers which idle see this process alive however long it
  // computes or waits. Shared memory bumps a counter in its control segment; sockets beat
  // from check_idle() and their waits instead (a frame needs the thread that drives them).
  virtual void beat() {}

  // One-sided access where the transport can give it (shared memory among local ranks).
  virtual LocalAccess* local() { return nullptr; }
  bool supports_direct_access() { return local() != nullptr; }

  // What the wait that failed was still waiting on, so the core can follow a hang along the
  // ranks' waits to the rank at the end of the chain (libcomm/src/blame.cc): the first rank to
  // time out names only its own peer, which may itself wait on the rank that stalls.
  struct Awaited {
    int peer = -1;
    OpTag tag;
  };
  struct WaitFailure {
    // The wait timed out, or a peer reported that its own wait timed out.
    bool hang = false;
    std::vector<Awaited> awaited;  // each peer once, in the order the wait listed them
  };
  // Read by the thread that drove the failed wait (the communicator's rule). A transport made of
  // parts says which part's wait failed (routed: local() hands out the shared-memory part's).
  virtual const WaitFailure& wait_failure() const { return wait_failure_; }
  bool peer_reported_timeout() const { return peer_reported_timeout_.load(std::memory_order_acquire); }

 protected:
  explicit Transport(Options options) : options_(std::move(options)) {}

  // Which silence a transport's find_lost counts for lost_peers, closed_peers and gone_peers: one
  // going on now (or as of the failure, once failed), only one that failed the transport, or none.
  enum class Silence { kNow, kAsOfFailure, kNever };

  // One send or receive as isend/irecv received it, after their checks.
  struct Post {
    bool is_send;
    int peer;
    OpTag tag;
    char* buf;  // a send's bytes are only read
    size_t bytes;
  };
  // The transport's part of a post: fail if the transport has failed or was aborted (its own
  // state, read under its own lock), take a request from its pool, queue it on `call.peer`'s
  // connection or queue, start it where it can (eager sends), set *id.
  virtual Status post_request(const Post& call, RequestId* id) = 0;
  // irecv_any's part, after its checks (the same first steps as post_request's); by default a
  // transport takes no receive from any rank.
  virtual Status post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                          RequestId* id) {
    (void)tag, (void)next_seq, (void)buf, (void)bytes, (void)source, (void)id;
    return no_any_source();
  }
  // Whether this transport carries messages between this rank and `peer`, and how a refusal
  // says what it carries: any other rank by default; shared memory only this host's.
  virtual bool reaches(int peer) const { return peer >= 0 && peer < size() && peer != rank(); }
  virtual const char* reach_rule() const { return "another rank"; }
  // Records that a wait ended with `failure` while `peer` had not finished `tag` (call once
  // per unfinished peer); only the first failed wait is kept, as the transport stays failed.
  void note_awaited(const Status& failure, int peer, const OpTag& tag) {
    if (wait_failure_sealed_ || failure.ok()) return;
    wait_failure_.hang = wait_failure_.hang || failure.code() == COMM_ERR_TIMEOUT || peer_reported_timeout();
    for (const Awaited& a : wait_failure_.awaited)
      if (a.peer == peer) return;
    wait_failure_.awaited.push_back({peer, tag});
  }
  // Ends the record of the failed wait (after its note_awaited calls).
  void seal_wait_failure(const Status& failure) {
    if (failure.ok() || wait_failure_sealed_) return;
    wait_failure_.hang = wait_failure_.hang || failure.code() == COMM_ERR_TIMEOUT || peer_reported_timeout();
    wait_failure_sealed_ = true;
  }
  // A message from `peer` met the receive posted for `tag`: straggler detection counts the
  // first of each peer in a collective (common/arrivals.h, which defines it; include it to call).
  // waited = false: it was there when this rank first looked, so this rank did not wait for it.
  inline void arrived(int peer, const OpTag& tag, bool waited = true);
  // A message to (sent) or from `peer` completed: per-peer bytes each way (common/arrivals.h).
  inline void moved_bytes(int peer, bool sent, uint64_t bytes);
  // Straggler detection's per-peer counters, null when COMM_STRAGGLER_MS=0 (common/arrivals.h).
  Arrivals* arrivals() const { return options_.arrivals.get(); }
  // A peer's report (an ERROR frame, a failure in its header) said its wait timed out.
  void peer_timed_out() { peer_reported_timeout_.store(true, std::memory_order_release); }

  // A peer's failure report is kept here until a wait on an operation it concerns (concerns())
  // takes it; the earliest operation's report wins. Under the transport's own lock where it has one.
  void keep_report(Status report, uint64_t order, bool timed_out) {
    if (report.ok()) return;
    if (!kept_.status.ok() && (kept_.order == 0 || (order != 0 && order >= kept_.order))) return;
    kept_ = {std::move(report), order, timed_out};
  }
  bool has_report() const { return !kept_.status.ok(); }
  // The kept report when it concerns an operation of order `op` (any, when `op` is kAnyOrder),
  // else OK. Taking it marks a hang for the core's trace when the peer timed out.
  static constexpr uint64_t kAnyOrder = ~uint64_t{0};
  Status report_for(uint64_t op) {
    if (kept_.status.ok() || (op != kAnyOrder && !concerns(kept_.order, op))) return Status::Ok();
    if (kept_.timed_out) peer_timed_out();
    return kept_.status;
  }
  Options options_;

 private:
  // The arguments' checks every transport made for itself before (the transport's own state is
  // post_request's first check).
  Status checked_post(const Post& call, RequestId* id) {
    if (call.tag.order > posted_order_) posted_order_ = call.tag.order;
    if (id == nullptr) return InvalidArgument(std::string(name()) + " transport: null request id pointer");
    if (!reaches(call.peer))
      return InvalidArgument(std::string(name()) + " transport: peer " + std::to_string(call.peer) + " is not " +
                             reach_rule() + " (size " + std::to_string(size()) + ", this rank " +
                             std::to_string(rank()) + ")");
    if (call.buf == nullptr && call.bytes > 0)
      return InvalidArgument(std::string(name()) + " transport: null buffer for " + std::to_string(call.bytes) +
                             " bytes");
    return post_request(call, id);
  }

  struct KeptReport {
    Status status;
    uint64_t order = 0;
    bool timed_out = false;
  };
  KeptReport kept_;
  uint64_t posted_order_ = 0;  // the latest operation posted here (checked_post)
  WaitFailure wait_failure_;
  bool wait_failure_sealed_ = false;
  // Atomic: the socket transport's progress thread may set it while the routed transport reads
  // it for its other half's failure (transports/routed/routed_transport.cc).
  std::atomic<bool> peer_reported_timeout_{false};
};

// What a transport needs to connect one communicator's ranks (each registry row's connect(),
// registry.h), and what it gives back.
struct ConnectRequest {
  Options options;                // the communicator's; its store is prefixed for this transport
  std::string comm_id;            // names per-communicator resources (unique in the job)
  std::vector<int> world_ranks;   // every rank's world rank (empty: the identity)
  // The job's directly reachable memory on this host (comm_mem_alloc), shared by every
  // communicator of the job: null on entry for the world, which may create it here.
  std::shared_ptr<JobMemory>* job_memory = nullptr;
  bool world = false;             // the world communicator: job-wide resources are made here
};

struct Connected {
  std::unique_ptr<Transport> transport;  // null: this rank has no peer the transport reaches
  bool usable = true;  // every rank of the communicator could set it up (else why_not)
  std::string why_not;
};

// Convenience for algorithms: send and receive at once, wait for both.
Status sendrecv(Transport& t, int send_peer, const OpTag& tag, const void* sendbuf, size_t send_bytes,
                int recv_peer, void* recvbuf, size_t recv_bytes);

}  // namespace comm::transport
