// The socket transport's class, shared by its two halves: socket_transport.cc (setup,
// requests, wait/test) and progress.cc (moving bytes, matching, failures on the wire).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/any_source.h"
#include "common/arrivals.h"
#include "common/progress_clock.h"
#include "common/request_pool.h"
#include "socket/connection.h"
#include "socket/mesh.h"
#include "transport.h"

namespace comm::transport::sock {

constexpr uint32_t kPoolBits = 12;  // 4096 requests in flight at once
constexpr uint64_t kHeaderBytes = sizeof(FrameHeader);
constexpr auto kNotifyBudget = std::chrono::milliseconds(100);
constexpr size_t kMaxNotifyText = 512;

inline bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

constexpr int kMaxBlockMs = 1000;  // a blocked poll looks at its peers at least once a second
class SocketTransport final : public Transport {
 public:
  // mesh: null for a single rank; links: what eager mode connected at setup.
  SocketTransport(Options options, int nconns, std::unique_ptr<Mesh> mesh, std::vector<MeshLink> links, Fd wake);
  // Says GOODBYE on every connection, so peers that idle do not take the close for a death,
  // and waits (bounded) until each peer has every byte (teardown.cc).
  ~SocketTransport() override;

  const char* name() const override { return "socket"; }

  Status post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                  RequestId* id) override;
  Status probe_any(int* source) override;
  Status wait(const RequestId* ids, size_t n) override;
  Status test(RequestId id, bool* done) override;
  Status wait_some(const RequestId* ids, size_t n) override;
  void wake() override;
  void notify_peers(const Status& failure, uint64_t order) override;
  Status check_idle() override;
  // Any thread (the watcher, also during a call): a heartbeat when one is due and no one is inside
  // the transport; a wait inside beats itself (heartbeat.cc).
  void beat() override;
  void lost_peers(std::vector<int>* out) override { find_lost(out, Silence::kNow); }  // heartbeat.cc
  void closed_peers(std::vector<int>* out) override { find_lost(out, Silence::kAsOfFailure); }
  void gone_peers(std::vector<int>* out) override { find_lost(out, Silence::kNever); }
  void find_lost(std::vector<int>* out, Silence silence);
  int64_t silent_ms(int peer) override;  // heartbeat.cc
  uint64_t idle_failure_order() override {
    Entry entry(*this);
    return Transport::idle_failure_order();
  }

  // Any thread: an atomic flag, and the eventfd wakes a wait blocked in poll().
  void abort() override;

 private:
  // wait() (all listed) and wait_some() (any listed, or woken) share one loop.
  Status drive(const RequestId* ids, size_t n, bool any);
  // How long a wait polls without blocking after each progress (COMM_SOCKET_SPIN_US): a wake-up
  // from poll() costs latency, but every microsecond spun is taken from a trainer computing on
  // the same cores.
  std::chrono::microseconds spin_{0};
  Status post_request(const Post& call, RequestId* id) override;  // after transport.h's checks
  // Splits request `index` (its peer known) into parts queued on the peer's connections.
  Status place(uint32_t index);
  // Gives the oldest receives from any rank the messages stashed on a connection #0 that no
  // earlier receive claims (socket_transport.cc).
  Status match_any();
  // A peer whose next message, stashed on its connection #0, a receive from any rank would take
  // (a send/recv's that no receive claims), in turn; -1: none.
  int find_any();

  // ---- the progress thread (progress_thread.cc) ----
  // Every entry point (post, wait, test, check_idle, notify_peers) holds an Entry: the lock on
  // the transport's state, and a count that keeps the progress thread parked while the caller
  // is inside. Between the caller's calls (a ring reducing its last chunk) the thread moves
  // the bytes of large requests still open, so the wire does not wait for the reduction.
  class Entry {
   public:
    explicit Entry(SocketTransport& t);
    Entry(SocketTransport& t, std::try_to_lock_t);  // inside only if no one is: see inside()
    ~Entry();
    bool inside() const { return lock_.owns_lock(); }
   private:
    SocketTransport& t_;
    std::unique_lock<std::mutex> lock_;
  };
  void start_progress_thread();  // under the lock, at the first large request
  void stop_progress_thread();
  void progress_thread_loop();
  bool thread_has_work() const;  // under the lock
  void part_done(Request& r) {
    if (--r.parts_left != 0) return;
    if (r.large) --open_large_;
    moved_bytes(r.peer, r.is_send, r.bytes);
  }
  Status take_thread_failure() {  // under the lock: what the thread met, for the caller's wait
    Status st = thread_failed_;
    thread_failed_ = Status::Ok();
    return st;
  }
  std::mutex mu_;
  std::condition_variable thread_cv_;
  std::thread thread_;
  std::atomic<int> callers_{0};  // threads inside an entry point (waiting for or holding mu_)
  bool thread_stop_ = false;
  bool thread_polling_ = false;  // the thread is in its unlocked poll(): a change needs thread_wake_
  uint64_t thread_min_bytes_ = 0;  // COMM_SOCKET_PROGRESS_THREAD_BYTES; 0: no progress thread
  uint32_t open_large_ = 0;       // unfinished requests of at least thread_min_bytes_
  Status thread_failed_;          // a peer's ERROR frame or a protocol error the thread read
  Fd thread_wake_;                // eventfd: stop_progress_thread() interrupts its poll()
  std::vector<pollfd> thread_pfds_;
  std::vector<size_t> thread_conn_of_;
  Status usable();
  Status fail(const Status& st) {
    if (failed_.ok()) {
      failed_ = st;
      failed_at_ = Clock::now();
    }
    return failed_;
  }

  Connection& conn(int peer, int index) {
    return conns_[static_cast<size_t>(peer) * static_cast<size_t>(nconns_) + static_cast<size_t>(index)];
  }
  Request& owner(PartLink link) { return pool_[link / kMaxConns]; }
  Part& part(PartLink link) { return pool_[link / kMaxConns].parts[link % kMaxConns]; }
  void push(PartQueue& q, PartLink link);
  PartLink pop(PartQueue& q);

  Status progress(int timeout_ms);
  bool collect_polls(std::vector<pollfd>* pfds, std::vector<size_t>* conn_of);
  Status handle_polls(const std::vector<pollfd>& pfds, const std::vector<size_t>& conn_of, size_t from, size_t to);
  void install(MeshLink& link);
  void unreachable(const MeshFailure& f);
  void send_progress(Connection& c);
  // Writes the frame of c.sends.head (the head part: header and payload) as far as the socket
  // takes it; true when it is all out (the part is then done and popped).
  bool write_head_frame(Connection& c);
  // A write failed for good: reads what the peer sent before closing c (its ERROR frame).
  void close_after_send_error(Connection& c, int err);
  Status recv_progress(Connection& c);
  bool handle_recv_result(Connection& c, ssize_t n);
  Status on_header(Connection& c);
  Status match(Connection& c);
  Status peer_reported(Connection& c);
  void close_connection(Connection& c, const std::string& reason, bool is_exit);
  Status check_peers(Request& r);
  Status silent_awaited(const RequestId* ids, size_t n, Clock::time_point now);  // a waited-on peer stopped
  // A peer's kept report (Transport::keep_report) when it concerns unfinished request r.
  Status report_for_request(const Request& r) { return report_for(r.any ? kAnyOrder : r.tag.order); }
  // Idle detection (heartbeat.cc): a HEARTBEAT to every connected peer when one is due.
  void beat(Clock::time_point now);
  bool flush_beat(Connection& c);  // false: the socket buffer is still full
  // comm_destroy: waits, bounded, until the peers of these half-closed connections have every byte (teardown.cc).
  void drain(std::vector<pollfd>& open);
  int64_t silence_limit_ms() const;  // a connected peer silent this long is stopped or hung
  int64_t silence_of(int peer, Clock::time_point now);  // ms since heard, -1 where not judged (heartbeat.cc)
  // Over TLS a frame may be on its way with 0 of its bytes counted (records sealed, in part sent).
  bool mid_frame(Connection& c) {
    return c.beat_left != 0 ||
           (!c.sends.empty() && (part(c.sends.head).done > 0 || (c.tls && c.tls->write_owed())));
  }
  std::string timeout_message(const RequestId* ids, size_t n);
  std::string me() const { return options_.comm_label + (options_.comm_label.empty() ? "" : " ") + "rank " +
                                  std::to_string(rank()); }

  int nconns_;
  std::unique_ptr<Mesh> mesh_;  // makes connections on first use (mesh.h)
  std::vector<MeshLink> new_links_;
  std::vector<MeshFailure> failures_;
  std::vector<Connection> conns_;
  RequestPool<Request, kPoolBits> pool_{"socket"};
  std::vector<pollfd> pfds_;
  std::vector<size_t> pfd_conn_;
  Fd wake_;  // eventfd: abort() wakes a wait blocked in poll()
  std::atomic<bool> aborted_{false};
  std::atomic<bool> woken_{false};  // wake() since the last wait_some
  Status failed_;
  // When failed_ was set: a failed transport reads nothing more, so heard_ stands still from then
  // and a peer's silence is judged as it was then (find_lost).
  Clock::time_point failed_at_{};
  AnySourceFifo any_recvs_;  // receives from any rank not matched yet, oldest first
  int any_turn_ = 0;  // where match_any looks first: every peer gets its turn
  uint64_t moved_ = 0;  // bytes moved on any connection: "no progress" means this stood still
  std::chrono::milliseconds heartbeat_{0};  // COMM_HEARTBEAT_MS (Options.heartbeat_ms); 0: none
  Clock::time_point next_beat_{};
  std::vector<Clock::time_point> heard_;  // per peer: when bytes last came from it
};

}  // namespace comm::transport::sock
