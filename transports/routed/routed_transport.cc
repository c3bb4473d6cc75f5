// Routing each request to the transport that reaches its peer. A wait whose requests are all
// on one side is that side's own wait (blocking in poll() or on a futex); a wait that spans
// both polls the two with test() and backs off into short sleeps, bounded by the timeout.
// A receive from any rank cannot be handed to both sides (each could take a message): it waits
// here, unposted, while each side's probe_any() says whose next message it would take; the first
// one seen gets a directed receive from that rank on that side, which takes exactly that message.
#include "routed/routed_transport.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

namespace comm::transport {
namespace {

constexpr uint32_t kPoolBits = 12;
constexpr uint32_t kPoolSize = 1u << kPoolBits;
constexpr uint32_t kNil = UINT32_MAX;
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kMaxNap = std::chrono::microseconds(1000);

class RoutedTransport final : public Transport {
 public:
  RoutedTransport(Options options, std::unique_ptr<Transport> near, std::unique_ptr<Transport> far,
                  std::vector<bool> is_local)
      : Transport(std::move(options)), near_(std::move(near)), far_(std::move(far)), is_local_(std::move(is_local)) {
    name_ = std::string(near_->name()) + "+" + far_->name();  // "shm+socket", "shm+ucx", "socket+ucx"
    pool_.resize(kPoolSize);
    for (uint32_t i = 0; i < kPoolSize; ++i) pool_[i].next = i + 1 < kPoolSize ? i + 1 : kNil;
    sub_ids_.reserve(64);
    live_.reserve(64);
  }

  const char* name() const override { return name_.c_str(); }
  LocalAccess* local() override { return near_->local(); }
  // A wait through local() (the hierarchical algorithms' one-sided steps) fails in the shared-memory
  // part, past drive(): its record is the failed wait's. Without it the first rank to time out
  // there published no wait for the hang trace, and the ranks waiting on it blamed it, after a
  // grace, instead of the stopped rank (the 4x2 chaos runs, libcomm/src/blame.cc).
  const WaitFailure& wait_failure() const override {
    const WaitFailure& own = Transport::wait_failure();
    if (own.hang || !own.awaited.empty()) return own;
    const WaitFailure& near = near_->wait_failure();
    return near.hang || !near.awaited.empty() ? near : own;
  }

  Status wait(const RequestId* ids, size_t n) override { return drive(ids, n, false); }
  Status wait_some(const RequestId* ids, size_t n) override { return drive(ids, n, true); }

  Status post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                  RequestId* id) override {
    COMM_RETURN_IF_ERROR(failed_);
    if (free_head_ == kNil)
      return Internal("routed transport: all " + std::to_string(kPoolSize) + " request slots are in use");
    const uint32_t index = free_head_;
    Entry& e = pool_[index];
    e.is_near = false;
    e.is_send = false;
    e.completed = false;
    e.peer = -1;
    e.tag = tag;
    e.any = Any{static_cast<char*>(buf), bytes, source, next_seq};
    free_head_ = e.next;
    e.active = true;
    unmatched_.push_back(index);
    *id = (e.generation << kPoolBits) | index;
    bool moved = false;
    return match_any(&moved);  // a message may be waiting already
  }

  Status test(RequestId id, bool* done) override {
    COMM_RETURN_IF_ERROR(failed_);
    uint32_t index;
    COMM_RETURN_IF_ERROR(lookup(id, &index));
    Entry& e = pool_[index];
    if (!unmatched_.empty()) {
      bool moved = false;
      COMM_RETURN_IF_ERROR(match_any(&moved));
    }
    *done = e.completed;
    if (e.peer < 0) return Status::Ok();  // from any rank, not matched yet
    if (!e.completed) {
      Status st = side(e).test(e.sub_id, done);
      if (!st.ok()) return fail(st);
      if (*done) e.completed = true;
    }
    if (*done) release(index);
    return Status::Ok();
  }

  void wake() override {
    woken_.store(true, std::memory_order_release);
    near_->wake();
    far_->wake();
  }
  void notify_peers(const Status& failure, uint64_t order) override {
    near_->notify_peers(failure, order);
    far_->notify_peers(failure, order);
    (void)fail(failure);
  }
  void lost_peers(std::vector<int>* out) override { from_both(&Transport::lost_peers, out); }
  void closed_peers(std::vector<int>* out) override { from_both(&Transport::closed_peers, out); }
  void gone_peers(std::vector<int>* out) override { from_both(&Transport::gone_peers, out); }
  int64_t silent_ms(int peer) override {
    if (peer < 0 || static_cast<size_t>(peer) >= is_local_.size()) return -1;
    return is_local_[static_cast<size_t>(peer)] ? near_->silent_ms(peer) : far_->silent_ms(peer);
  }
  uint64_t idle_failure_order() override {
    return std::max(near_->idle_failure_order(), far_->idle_failure_order());
  }
  Status check_idle() override {
    COMM_RETURN_IF_ERROR(failed_);
    Status st = near_->check_idle();
    if (st.ok()) st = far_->check_idle();
    return st.ok() ? st : fail(st);
  }
  void beat() override {
    near_->beat();
    far_->beat();
  }
  void abort() override {
    aborted_.store(true, std::memory_order_release);
    near_->abort();
    far_->abort();
  }

 private:
  // One of the lost/closed/gone questions asked of both parts: their lists, merged ascending.
  void from_both(void (Transport::*which)(std::vector<int>*), std::vector<int>* out) {
    ((*near_).*which)(out);
    ((*far_).*which)(out);
    std::sort(out->begin(), out->end());
  }

  struct Any {  // a receive from any rank: what its directed receive is posted with
    char* buf = nullptr;
    size_t bytes = 0;
    int* source = nullptr;
    const uint64_t* next_seq = nullptr;
  };
  struct Entry {
    bool active = false;
    bool is_near = false;
    bool is_send = false;
    bool completed = false;  // its sub-request finished (and was released) in a wait_some
    int peer = -1;  // -1: a receive from any rank, not matched yet (in unmatched_)
    OpTag tag;
    Any any;
    RequestId sub_id = 0;
    uint32_t generation = 1;
    uint32_t next = kNil;
  };

  Transport& side(const Entry& e) { return e.is_near ? *near_ : *far_; }
  Status fail(const Status& st) {
    if (failed_.ok()) failed_ = st;
    return failed_;
  }

  // After transport.h's checks; the side's own isend/irecv checks what it carries.
  Status post_request(const Post& call, RequestId* id) override {
    COMM_RETURN_IF_ERROR(failed_);
    const auto [is_send, peer, tag, buf, bytes] = call;
    if (free_head_ == kNil)
      return Internal("routed transport: all " + std::to_string(kPoolSize) + " request slots are in use");
    const uint32_t index = free_head_;
    Entry& e = pool_[index];
    e.is_near = is_local_[static_cast<size_t>(peer)];
    e.is_send = is_send;
    e.completed = false;
    e.peer = peer;
    e.tag = tag;
    Status st = is_send ? side(e).isend(peer, tag, buf, bytes, &e.sub_id) : side(e).irecv(peer, tag, buf, bytes, &e.sub_id);
    if (!st.ok()) return st.code() == COMM_ERR_INVALID_ARGUMENT ? st : fail(st);
    free_head_ = e.next;
    e.active = true;
    live_.push_back(index);
    *id = (e.generation << kPoolBits) | index;
    return Status::Ok();
  }

  // The oldest receives from any rank take the first message either side reports (the core posts
  // no receive after one from any rank until it completes, so this is MPI's order); the side
  // asked first alternates, so neither starves the other.
  Status match_any(bool* moved) {
    while (!unmatched_.empty()) {
      int source = -1;
      bool near = near_first_;
      for (int k = 0; k < 2 && source < 0; ++k, near = !near) {
        Status st = (near ? *near_ : *far_).probe_any(&source);
        if (!st.ok()) return fail(st);
        if (source >= 0 && is_local_[static_cast<size_t>(source)] != near) source = -1;  // not its to reach
        if (source >= 0) break;
      }
      if (source < 0) return Status::Ok();
      near_first_ = !near;
      const uint32_t index = unmatched_.front();
      Entry& e = pool_[index];
      e.is_near = near;
      e.peer = source;
      e.tag.seq = e.any.next_seq[source];
      Status st = side(e).irecv(source, e.tag, e.any.buf, e.any.bytes, &e.sub_id);  // checked as irecv()'s
      if (!st.ok()) return fail(st);
      *e.any.source = source;
      unmatched_.erase(unmatched_.begin());
      live_.push_back(index);
      *moved = true;
    }
    return Status::Ok();
  }

  Status lookup(RequestId id, uint32_t* index) const {
    const uint32_t i = id & (kPoolSize - 1);
    if (!pool_[i].active || pool_[i].generation != (id >> kPoolBits))
      return InvalidArgument("routed transport: request id " + std::to_string(id) + " is unknown or already completed");
    *index = i;
    return Status::Ok();
  }

  void release(uint32_t index) {
    Entry& e = pool_[index];
    if (!e.active) return;
    e.active = false;
    forget(index);
    std::erase(unmatched_, index);
    e.generation = (e.generation + 1) & ((1u << (32 - kPoolBits)) - 1);
    if (e.generation == 0) e.generation = 1;
    e.next = free_head_;
    free_head_ = index;
  }

  void forget(uint32_t index) {
    for (size_t k = 0; k < live_.size(); ++k)
      if (live_[k] == index) {
        live_[k] = live_.back();
        live_.pop_back();
        return;
      }
  }

  // Requests on the other side than `near` that are still moving: a wait on one side alone
  // would leave them unprogressed (UCX's rendezvous and shm's staging ring need the sender to
  // progress), and a peer waiting on them could wait on us in turn.
  bool other_side_live(bool near) const {
    for (uint32_t index : live_)
      if (pool_[index].is_near != near) return true;
    return false;
  }

  // wait (all listed) and wait_some (any listed, or woken).
  Status drive(const RequestId* ids, size_t n, bool any) {
    Status st = drive_parts(ids, n, any);
    if (st.ok()) return st;
    // A failure names the peers this wait still needed (Transport::wait_failure), whichever
    // part failed.
    if (near_->peer_reported_timeout() || far_->peer_reported_timeout()) peer_timed_out();
    for (size_t i = 0; i < n && ids != nullptr; ++i) {
      const Entry& e = pool_[ids[i] & (kPoolSize - 1)];
      if (!e.completed && e.peer >= 0) note_awaited(st, e.peer, e.tag);
    }
    seal_wait_failure(st);
    return st;
  }

  Status drive_parts(const RequestId* ids, size_t n, bool any) {
    COMM_RETURN_IF_ERROR(failed_);
    if (n > 0 && ids == nullptr) return InvalidArgument("routed transport: null request id list");
    size_t near_count = 0, pending = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t index;
      COMM_RETURN_IF_ERROR(lookup(ids[i], &index));
      if (pool_[index].completed) continue;
      ++pending;
      near_count += pool_[index].is_near ? 1 : 0;
    }
    if (pending < n && any) return Status::Ok();  // one is finished already
    const bool one_side = near_count == 0 || near_count == pending;
    if (pending > 0 && one_side && unmatched_.empty() && !other_side_live(near_count > 0)) {
      Transport& t = near_count > 0 ? *near_ : *far_;
      sub_ids_.clear();
      for (size_t i = 0; i < n; ++i)
        if (!pool_[ids[i] & (kPoolSize - 1)].completed) sub_ids_.push_back(pool_[ids[i] & (kPoolSize - 1)].sub_id);
      Status st = any ? t.wait_some(sub_ids_.data(), sub_ids_.size()) : t.wait(sub_ids_.data(), sub_ids_.size());
      if (!st.ok()) return fail(st);
    } else if (pending > 0) {
      COMM_RETURN_IF_ERROR(drive_mixed(ids, n, any));
    }
    if (!any)
      for (size_t i = 0; i < n; ++i) release(ids[i] & (kPoolSize - 1));
    return Status::Ok();
  }

  Status drive_mixed(const RequestId* ids, size_t n, bool any) {
    using Clock = std::chrono::steady_clock;
    const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
    auto last_move = Clock::now();
    auto nap = std::chrono::microseconds(0);
    for (;;) {
      bool all = true, some = false, moved = false;
      COMM_RETURN_IF_ERROR(match_any(&moved));
      // Every request still moving, listed or not, on both sides.
      for (size_t k = 0; k < live_.size();) {
        Entry& e = pool_[live_[k]];
        bool d = false;
        Status st = side(e).test(e.sub_id, &d);  // a finished sub-request is released by test()
        if (!st.ok()) return fail(st);
        if (!d) {
          ++k;
          continue;
        }
        e.completed = true;  // test()/release() of ours collects it
        moved = true;
        live_[k] = live_.back();
        live_.pop_back();
      }
      for (size_t i = 0; i < n; ++i) {
        if (pool_[ids[i] & (kPoolSize - 1)].completed)
          some = true;
        else
          all = false;
      }
      if (all || (any && some)) return Status::Ok();
      if (any && woken_.exchange(false, std::memory_order_acq_rel)) return Status::Ok();
      if (aborted_.load(std::memory_order_acquire))
        return fail(Aborted("rank " + std::to_string(rank()) + ": the transport was aborted (comm_abort)"));
      const auto now = Clock::now();
      if (moved) {
        last_move = now;
        nap = std::chrono::microseconds(0);
        continue;
      }
      if (now - last_move >= timeout) return fail(Timeout(timeout_message(ids, n)));
      if (now - last_move < kSpin) continue;
      // Neither side can wake us for the other: nap briefly, longer while nothing moves.
      nap = std::min<std::chrono::microseconds>(kMaxNap, nap.count() == 0 ? std::chrono::microseconds(10) : nap * 2);
      timespec ts{0, static_cast<long>(nap.count()) * 1000};
      nanosleep(&ts, nullptr);
    }
  }

  std::string timeout_message(const RequestId* ids, size_t n) {
    std::string parts;
    for (size_t i = 0; i < n; ++i) {
      const Entry& e = pool_[ids[i] & (kPoolSize - 1)];
      if (e.completed) continue;
      std::string one = e.peer < 0 ? "any rank (receive of " + describe(e.tag) + ", " + name_ + ")"
                                   : "rank " + std::to_string(e.peer) + " (" + (e.is_send ? "send of " : "receive of ") +
                                         describe(e.tag) + ", " + side(e).name() + ")";
      if (parts.find(one) == std::string::npos) parts += (parts.empty() ? "" : "; ") + one;
    }
    return "no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
           std::to_string(rank()) + " waited on " + parts + "; is that rank still running, and calling the same operation?";
  }

  std::unique_ptr<Transport> near_, far_;
  std::string name_;
  std::vector<bool> is_local_;
  std::vector<Entry> pool_;
  uint32_t free_head_ = 0;
  std::vector<RequestId> sub_ids_;
  std::vector<uint32_t> live_;  // entries whose sub-request is still pending
  std::vector<uint32_t> unmatched_;  // receives from any rank not matched yet, oldest first
  bool near_first_ = true;           // which side match_any asks first
  std::atomic<bool> aborted_{false};
  std::atomic<bool> woken_{false};
  Status failed_;
};

}  // namespace

std::unique_ptr<Transport> make_routed_transport(Options options, std::unique_ptr<Transport> near,
                                                 std::unique_ptr<Transport> far, std::vector<bool> is_local) {
  return std::make_unique<RoutedTransport>(std::move(options), std::move(near), std::move(far), std::move(is_local));
}

}  // namespace comm::transport
