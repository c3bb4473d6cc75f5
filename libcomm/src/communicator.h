// The communicator behind the opaque comm_t: identity, transport, sequence numbers,
// the broken/aborted state, and the worker that runs non-blocking calls in issue order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/scratch.h"
#include "comm/comm.h"
#include "engine_view.h"
#include "flight_recorder.h"
#include "observe/stats.h"
#include "status.h"
#include "store/store.h"
#include "transport.h"
#include "tuning/apply.h"

namespace comm::device {
class State;
}

struct comm_request_s {
  comm_t comm = nullptr;
  comm::algo::CollArgs args;
  bool done = false;  // guarded by the communicator's queue mutex
  comm::Status status;
  int matched = -1;  // a receive from any rank: the rank its message came from (the transport writes it)
};

namespace comm {
class SetupWatch;  // setup_watch.h

// Settings every rank must share, and the job's rendezvous results. comm.cc (resolve_settings)
// fills every field from comm_config_t and the params registry (params.cc: the defaults).
struct CommSettings {
  int timeout_ms = 0;
  std::string transport;     // COMM_TRANSPORT, lower case
  std::string forced_algo;   // COMM_ALGO
  size_t chunk_bytes = 0;
  std::string tuning_hash = "none";
  std::shared_ptr<const tuning::Profile> profile;  // COMM_TUNING_FILE, parsed; null when unset
  int heartbeat_ms = 0;            // COMM_HEARTBEAT_MS: idle detection's period (watch.h); 0: off
  bool check_collectives = false;  // COMM_CHECK_COLLECTIVES: every call confirms its signature (strict.cc)
  bool tls = false;  // COMM_TLS / comm_config_t.tls: socket connections run TLS 1.3 (connect.cc)
};

}  // namespace comm

struct comm_s {
  int rank = 0;
  int size = 1;
  std::string id;  // "0" for the world, "0.d1", "0.s2c1" for children: unique per job
  comm::CommSettings settings;
  std::string secret;
  bool all_local = false;  // every rank on this host (hostname, boot id, netns or COMM_HOST_ID)
  std::vector<int> host_of;      // every rank's host, numbered in order of each host's first rank
  std::vector<int> world_ranks;  // every rank's rank in the world communicator
  // Every rank's admission into its world slot: the job store's count of admissions into that
  // slot when a comm_grow admitted its process (grow.h, joins_key), 0 for the job's first
  // processes. An exclusion record names it, so that a launcher acts on the process this
  // communicator had there, never on a later one in the slot (grow_records.cc).
  std::vector<int> world_gens;
  // The job's directly reachable memory on this host (comm_mem_alloc: the host-local transport's
  // arenas), shared by the world and every communicator derived from it; nullptr without local
  // peers or without a host-local transport.
  std::shared_ptr<comm::transport::JobMemory> job_memory;
  // The world only, from init until its socket transport adopts it: the listener made before
  // the verdict and the address table from the verdict (null when unusable; init_agreement.cc).
  std::shared_ptr<comm::transport::EarlyListener> early_listener;
  bool local_transport_usable = true;  // agreed at the world's init: the host-local transport works on every host
  std::shared_ptr<comm::Store> job_store;  // un-prefixed; children derive their prefix from it
  // Every world rank's host from the init verdict's address table (its socket listener's, else
  // the address the store saw it by; "" unknown): where comm_shrink's survivors meet when the
  // store died with rank 0 (shrink.cc).
  std::shared_ptr<const std::vector<std::string>> world_addrs;
  // This communicator's ranks set up their own host-local memory domain (the world, and a grown
  // communicator, whose joiners are in no earlier domain: grow.cc); the others share their parent's.
  bool own_job_memory = false;
  // While a grown communicator is set up (grow.cc, join.cc): its transport's store waits end
  // early when a rank is known dead (setup_watch.h); null otherwise.
  std::shared_ptr<comm::SetupWatch> setup_watch;
  // A grown or shrunk communicator: its children's set-ups are watched too (a comm_dup right after
  // a comm_grow is where a death during an admission lands). The world's are not: a rank there
  // is rarely dead, and a watched wait in a TCP store reconnects every slice.
  bool watch_setups = false;
  bool shrunk = false;  // comm_shrink made a communicator from this one: only comm_destroy is left
  std::unique_ptr<comm::transport::Transport> transport;
  // The profile entries for this communicator's rank count and transport (never null after init).
  std::shared_ptr<const comm::tuning::Applied> tuning;
  comm::algo::Scratch scratch;
  // Device buffers (device/): the NCCL communicator or the staging buffer; made at
  // init with COMM_TRANSPORT=nccl, else at the first call with a stream.
  std::shared_ptr<comm::device::State> device;

  // Issue-order state, touched only by the thread that uses the communicator.
  uint64_t next_seq = 1;
  uint64_t children = 0;
  uint64_t agreements = 0;  // comm_agree_failed calls: every survivor makes as many (agree.cc)
  // comm_grow's lowest member: the job's join/claimed count it last read (it only grows), so a
  // step with nobody waiting costs one store read, not two (grow.cc).
  int64_t joins_claimed_seen = 0;
  // The lowest member's looks at the waiting joiners' liveness counters (grow.cc): ticket ->
  // the counter and when it was first seen at that value.
  std::map<int64_t, std::pair<int64_t, comm::Clock::time_point>> joiners_seen;
  std::vector<uint64_t> send_seq, recv_seq;  // per peer, for send/recv matching
  comm::FlightRecorder recorder;  // the last operations, written by the issuing thread
  // Straggler detection's per-peer waits, shared with the transports (connect.cc; null when
  // COMM_STRAGGLER_MS=0 or alone), and the counters the metrics plugin reads (observe/stats.h).
  std::shared_ptr<comm::transport::Arrivals> arrivals;
  comm::observe::Stats stats;
  std::vector<char> strict_signatures;  // COMM_CHECK_COLLECTIVES: every rank's, sized at first use (strict.cc)

  // Failure state: aborted by comm_abort; broken after any error that involved peers.
  std::atomic<bool> aborted{false};
  std::mutex state_mu;
  comm::Status broken;       // first peer-involving failure; sticky
  std::atomic<bool> is_broken{false};  // broken is set: the fast path checks this, not the mutex
  // Records the first peer-involving failure; call with state_mu held. True when it was the first.
  bool set_broken_locked(const comm::Status& st) {
    if (!broken.ok()) return false;
    broken = st;
    is_broken.store(true, std::memory_order_release);  // check_usable reads only this
    return true;
  }
  comm::Status async_error;  // first failure of a background (non-blocking) operation
  // The ranks the hang trace found stalled (blame.cc), under state_mu: comm_agree_failed
  // publishes them as this rank's suspicions, with the peers its transport saw gone.
  std::vector<int> stalled;

  // The worker: runs non-blocking calls in issue order. Started on first use.
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<comm_request_s*> queue;
  bool worker_busy = false;
  // A thread in comm_wait runs the call it waits for itself (execute.cc, wait_request): the
  // worker takes nothing from the queue meanwhile.
  bool helping = false;
  // The worker is blocked in the transport's wait_some: only then does a new call need
  // transport->wake() (an eventfd write, a system call per comm_i* otherwise).
  bool worker_in_transport = false;
  // !queue.empty() || worker_busy || helping, written under queue_mu, read without it by blocking calls
  // (a call enqueued by this thread is always seen; a worker going idle at that moment is fine).
  std::atomic<bool> worker_active{false};
  bool worker_stop = false;
  // The common pattern is comm_i* then comm_wait, which runs the call inline (wait_request): the
  // worker's wake-up per call is then pure cost (a futex wake and a context switch on a core
  // another rank may need). While inline runs come faster than one per kLazyGap, the idle worker
  // looks at the queue every kLazyPoll (for kLazyWindow after the last one) instead of being
  // woken per collective: a call nobody waits for still starts within kLazyPoll (execute.cc).
  bool worker_lazy = false;  // the worker is in that timed wait: enqueue need not wake it
  // A thread in comm_wait runs the queued collectives up to its own (wait_request): the worker
  // takes no collective meanwhile, once it has no sends/receives in flight.
  bool claim_wanted = false;
  std::chrono::steady_clock::time_point last_inline_run{};
  std::chrono::steady_clock::duration inline_gap = std::chrono::hours(1);  // between the last two
  std::thread worker;
  std::vector<comm_request_s*> free_requests;  // recycled, so steady state allocates nothing

  // Idle detection (watch.h): threads that drive the transport count themselves in `drivers`
  // (a Driving guard); the watcher uses the transport only while none does, flagged `watching`.
  std::atomic<int> drivers{0};
  std::atomic<bool> watching{false};
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;
  std::thread watcher;
};

namespace comm {

// Creates the world communicator: identity, store, agreement check, transport.
Status init_communicator(const comm_config_t& cfg, comm_t* out);
// Children share the job store and secret; every member calls with the same id and the same
// members (their parent ranks, in the child's rank order). comm_shrink passes the store the
// survivors met in, a new secret, and the watch its agreement ran under (`watch`, for this same id
// and members): the set-up ends early when a member is known dead (setup_watch.h), as does that of
// every child of a watched communicator (grown, shrunk), which gets a watch of its own.
Status create_child(comm_t parent, const std::string& id, int rank, const std::vector<int>& members, comm_t* out,
                    std::shared_ptr<Store> store = nullptr, const std::string& secret = "",
                    std::shared_ptr<SetupWatch> watch = nullptr);
// A child whose fields are set but for its transport: connects it, waits for every member (the
// init barrier), starts its watcher. create_child's last step, and comm_grow's (grow.cc, join.cc).
Status finish_communicator(std::unique_ptr<comm_s> c, comm_t* out);
// comm_config_t and the environment to the settings every rank must share (comm.cc).
Status resolve_settings(const comm_config_t& cfg, CommSettings* s);
// The version line and the unknown-variable warnings, once per process.
void announce_once();
// comm_shrink: the survivors of `comm` (every rank not in `excluded`) make *out without touching
// comm's transport (shrink.cc).
// comm_agree_failed: the ranks of `comm` still alive agree on the failed ones (agree.cc).
Status agree_failed(comm_t comm, std::vector<int>* failed, int* flag = nullptr);  // flag: comm_agree's
Status shrink_communicator(comm_t comm, const std::vector<int>& excluded, comm_t* out);
// 32 random bytes as hex: a job's (or a shrunk communicator's) secret.
Status random_secret(std::string* out);
void destroy_communicator(comm_t comm);

// fail_communicator(): engine_view.h.
// Fails fast when the communicator is aborted or broken (with the error it broke with).
Status check_usable(comm_t comm);
// Stamps the tag (sequence number etc.) in issue order; call on the issuing thread. A receive's
// per-peer sequence number is left to stamp_receive, called where it is posted.
void stamp(comm_t comm, algo::CollArgs* args);
// A send/recv receive from a named rank takes its per-peer sequence number when it is posted to
// the transport, not when issued: a receive from any rank (COMM_ANY_SOURCE) learns its rank only
// when it matches, and receives issued after it are posted (and numbered) after that.
void stamp_receive(comm_t comm, algo::CollArgs* args);
// Runs one stamped call now on this thread; records a peer-involving failure as broken.
Status execute(comm_t comm, const algo::CollArgs& args);
// Blocking entry: waits for earlier non-blocking calls (issue order), then executes.
Status run_blocking(comm_t comm, algo::CollArgs args);
// Non-blocking entry: stamps and queues for the worker.
Status enqueue(comm_t comm, algo::CollArgs args, comm_request_s** req);
Status wait_request(comm_request_s* req);
Status test_request(comm_request_s* req, bool* done);
// Several send/recv calls posted together and waited on together (group semantics).
Status execute_p2p_batch(comm_t comm, std::vector<algo::CollArgs> calls);

// "rank 2, allreduce #17: "
std::string context(comm_t comm, const algo::CollArgs& args);

}  // namespace comm
