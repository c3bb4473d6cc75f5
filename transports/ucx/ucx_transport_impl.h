// The UCX transport's class, shared by its two halves: ucx_transport.cc (context, worker,
// endpoints, teardown) and progress.cc (requests, matching checks, waits, failures).
//
// Each isend is two UCP tag messages: a small header (the OpTag, the length, the job key) and
// the payload, contiguous, so UCX keeps its zero-copy rendezvous for large buffers. Tags are
// (kind, source rank, per-pair message number): both sides count messages per peer in posting
// order, which is transport.h's matching rule; the header then lets the receiver name both
// calls when ranks disagree instead of exchanging wrong bytes.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "common/any_source.h"
#include "common/progress_clock.h"
#include "ucx/ucx_library.h"
#include "common/request_pool.h"
#include "transport.h"

namespace comm::transport::ucx {

constexpr uint32_t kPoolBits = 12;  // 4096 requests in flight at once
constexpr uint32_t kNil = UINT32_MAX;
constexpr auto kSpin = std::chrono::microseconds(50);  // then block on the worker's fd: ranks may outnumber cores
constexpr auto kNotifyBudget = std::chrono::milliseconds(100);
constexpr size_t kMaxErrorText = 512;

// Tag layout: bit 63 header, bit 62 error report, bit 61 (headers) a send/recv message, bits 40..60
// source rank, bits 0..39 message number. Bit 61 lets a receive from any rank probe for a peer's
// next message only when it is a send/recv's (irecv_any); directed receives ignore it.
constexpr uint64_t kHeaderBit = 1ull << 63;
constexpr uint64_t kErrorBit = 1ull << 62;
constexpr uint64_t kP2pBit = 1ull << 61;
constexpr int kRankShift = 40;
constexpr uint64_t kNumberMask = (1ull << kRankShift) - 1;
constexpr int kMaxRanks = 1 << 21;
inline uint64_t data_tag(int src, uint64_t number) {
  return (static_cast<uint64_t>(src) << kRankShift) | (number & kNumberMask);
}

constexpr uint32_t kMagic = 0x55435831;  // "UCX1"
// A report of status 0 (COMM_OK) is GOODBYE: the sender's comm_destroy, so its endpoint's failure
// and its exit that follow are not a death (idle detection, check_idle).
constexpr uint32_t kGoodbye = 0;
struct WireHeader {
  uint32_t magic = kMagic;
  uint32_t status = 0;  // error reports: the sender's comm_status_t (kGoodbye: it left)
  uint64_t key = 0;     // derived from the job secret: a stray sender is refused
  uint64_t seq = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;   // payload length; error reports: text length
  int32_t root = -1;
  int32_t source = -1;  // the sending rank (error reports arrive from any source)
  uint8_t coll = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t pad[5] = {};
};
struct ErrorFrame {
  WireHeader header;
  char text[kMaxErrorText];
};

class UcxTransport;

// One UCP operation of a request (its header or its payload); the UCP callbacks get a pointer
// to it as user data.
struct Part {
  UcxTransport* owner = nullptr;
  uint32_t request = 0;   // index in the pool
  void* ucp = nullptr;    // the UCP request while pending (cancelled at teardown)
  bool pending = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;      // receives: bytes that arrived
};

struct Request {  // in the transport's RequestPool (transports/common/request_pool.h)
  bool is_send = false;
  int peer = -1;
  OpTag tag;
  char* buf = nullptr;
  size_t bytes = 0;
  WireHeader header;      // sends: what goes out; receives: what arrived
  Part parts[2];          // [0] header, [1] payload (not used for empty messages)
  uint8_t parts_left = 0;
  bool awaited = false;  // a receive the wait's last look found unfinished (per-peer waits)
  // A receive from any rank (irecv_any) until it matched: peer -1, nothing started, in the
  // transport's queue of such receives (threaded through any_next).
  bool any = false;
  int* source = nullptr;
  const uint64_t* next_seq = nullptr;
  uint32_t any_next = kNil;  // transports/common/any_source.h
};

struct Peer {
  UcxTransport* owner = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  bool failed = false;     // UCX reported the endpoint broken (peer died or reset)
  std::string reason;
  uint64_t sent = 0, received = 0;  // messages posted to / expected from this peer
  int pid = 0;             // its process, when it shares this pid namespace
  bool watch_pid = false;  // no UCX failure handling to this peer: its pid is checked instead
  int pidfd = -1;          // watch_pid: readable once the process exited, reaped or not (-1: kill(pid, 0))
  bool left = false;       // it said GOODBYE (comm_destroy): its failure that follows is no death
  int idle_failed = 0;     // check_idle calls that found it failed without GOODBYE
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(Options options);
  ~UcxTransport() override;

  // Context, worker, address exchange, endpoints.
  Status setup();
  Status create_worker();        // setup's steps (ucx_transport.cc)
  Status post_report_receive();
  Status publish_address();
  Status connect_peer(int r, const Deadline& deadline);

  const char* name() const override { return "ucx"; }
  Status post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                  RequestId* id) override;
  Status probe_any(int* source) override;
  Status wait(const RequestId* ids, size_t n) override { return drive(ids, n, false); }
  Status wait_some(const RequestId* ids, size_t n) override { return drive(ids, n, true); }
  Status test(RequestId id, bool* done) override;
  void wake() override;
  void notify_peers(const Status& failure, uint64_t order) override;
  void lost_peers(std::vector<int>* out) override {
    for (const Peer& p : peers_)
      if (p.failed && !p.left) out->push_back(p.rank);
  }
  void abort() override;  // any thread: a flag, and the eventfd wakes a blocked wait
  Status check_idle() override;  // progress without blocking: failed peers, reports (progress.cc)

  // UCP callbacks (progress.cc).
  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_error_report(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_peer_failure(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  Status connect_all(const Deadline& deadline);
  Status post_request(const Post& call, RequestId* id) override;  // after transport.h's checks
  Status start(Part& part, bool is_send, ucp_ep_h ep, void* buf, size_t bytes, uint64_t tag,
               uint64_t mask = ~uint64_t{0});
  // Starts request r's header and payload operations, its peer known.
  Status start_request(Request& r);
  // Gives the oldest receives from any rank a peer's next message when UCX holds its header,
  // unexpected, and it is a send/recv's (ucp_tag_probe_nb; progress.cc).
  Status match_any();
  // A peer whose next message's header UCX holds, unexpected, and is a send/recv's, in turn;
  // -1: none.
  int find_any();
  Status drive(const RequestId* ids, size_t n, bool any);
  // One part of request `index` finished (a callback, or at once): the last one counts the
  // message's bytes for its peer (common/arrivals.h). On the thread driving the transport.
  void part_finished(uint32_t index);
  Status check(Request& r);        // a finished request: statuses, then the header against the posted call
  Status check_pending(Request& r);  // an unfinished one: is its peer still there?
  void check_pids();               // peers watched by pid: gone means failed
  Status block(int timeout_ms);    // arm the worker and poll its fd and ours
  Status peer_report();            // a peer's failure report, as this rank's failure
  // An arrived report: a GOODBYE marks its sender as left and posts the receive again (OK);
  // anything else is peer_report().
  Status take_report();
  void say_goodbye(std::vector<void*>* sends);  // comm_destroy (ucx_transport.cc)
  Status usable();
  Status fail(const Status& st) {
    if (failed_.ok()) failed_ = st;
    return failed_;
  }
  void cancel_pending();
  void close_endpoints();
  std::string timeout_message(const RequestId* ids, size_t n);
  std::string me() const {
    return options_.comm_label + (options_.comm_label.empty() ? "" : " ") + "rank " + std::to_string(rank());
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;  // the worker's event fd: armed, it wakes a blocked wait when UCX has work
  int wake_fd_ = -1;    // eventfd: abort() and wake() from any thread
  uint64_t key_ = 0;
  std::vector<Peer> peers_;
  RequestPool<Request, kPoolBits> pool_{"UCX"};
  ErrorFrame report_;       // where a peer's failure report lands
  ErrorFrame outgoing_;     // this rank's own report (notify_peers), alive while UCX sends it
  Part report_part_;
  bool report_arrived_ = false;
  Clock::time_point next_pid_check_{};
  AnySourceFifo any_recvs_;  // receives from any rank not matched yet, oldest first
  int any_turn_ = 0;  // where match_any looks first: every peer gets its turn
  uint64_t completions_ = 0;  // operations finished: "no progress" means this stood still
  std::atomic<bool> aborted_{false};
  std::atomic<bool> woken_{false};
  Status failed_;
};

}  // namespace comm::transport::ucx
