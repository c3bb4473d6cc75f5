// Shared-memory transport: requests, the wait loop's checks (peers' reported failures, dead
// processes, abort) and failure propagation. Moving bytes is progress.cc's; one-sided calls
// are local_access.cc's.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/arrivals.h"
#include "common/silence.h"
#include "log.h"
#include "params.h"
#include "shm/shm_transport_impl.h"

namespace comm::transport::shm {

ShmTransport::ShmTransport(Options options, std::vector<int> local_ranks, const std::vector<int>& world_ranks,
                           std::shared_ptr<Domain> domain, Geometry geometry)
    : Transport(std::move(options)),
      local_ranks_(std::move(local_ranks)),
      domain_(std::move(domain)),
      geometry_(geometry) {
  local_of_.assign(static_cast<size_t>(size()), -1);
  peers_.resize(local_ranks_.size());
  for (size_t i = 0; i < local_ranks_.size(); ++i) {
    const int r = local_ranks_[i];
    local_of_[static_cast<size_t>(r)] = static_cast<int>(i);
    if (r == rank()) me_ = static_cast<int>(i);
    peers_[i].rank = r;
    const int world = world_ranks.empty() ? r : world_ranks[static_cast<size_t>(r)];
    peers_[i].dom = domain_->index_of_world(world);
  }
  std::vector<int> per_host;
  for (int h : options_.host_of) {
    if (h >= static_cast<int>(per_host.size())) per_host.resize(static_cast<size_t>(h) + 1, 0);
    if (h >= 0) ++per_host[static_cast<size_t>(h)];
  }
  hosts_ = static_cast<int>(per_host.size());
  ranks_per_host_ = per_host.empty() ? 0 : per_host[0];
  for (int c : per_host)
    if (c != ranks_per_host_) ranks_per_host_ = 0;
  // Spin long only when every local rank can have a core; otherwise sleep almost at once
  // and leave the core to the peer we wait for (docs/design/rules.md, "Progress without burning the machine").
  int64_t spin_us = params::int_or_default("COMM_SHM_SPIN_US", log::kNet);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = static_cast<long>(local_ranks_.size()) > cores;
  // Oversubscribed, the peer may share our core: spinning only delays it, so yield at once.
  if (spin_us < 0) spin_us = oversubscribed ? 0 : 200;
  spin_ = std::chrono::microseconds(spin_us);
  yield_ = std::chrono::microseconds(oversubscribed ? 1000 : 0);
}

ShmTransport::~ShmTransport() {
  // comm_destroy: peers that idle may see this process exit now without calling it a death.
  if (my_header_ != nullptr && !aborted_.load(std::memory_order_acquire) && failed_.ok())
    my_header_->left.store(1, std::memory_order_release);
  if (ring_ != nullptr) domain_->free(ring_);
}

// Between calls: a failure a local peer reported, a local peer's process gone without
// comm_destroy (its pidfd), or one whose beat counter stood still for the silence limit: a
// stopped (SIGSTOP, a debugger) or hung process, which its pidfd cannot show.
Status ShmTransport::check_idle() {
  COMM_RETURN_IF_ERROR(usable());
  Status st = peer_errors(kAnyOrder);  // no call runs: the next one is later than any report
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < peers_.size() && st.ok(); ++i) {
    if (static_cast<int>(i) == me_ || peers_[i].header->left.load(std::memory_order_acquire) != 0) continue;
    st = check_alive(static_cast<int>(i), "no call (the communicator was idle), without comm_destroy");
    if (st.ok()) st = check_beating(static_cast<int>(i), now);
  }
  if (!st.ok() && failed_.ok()) failed_ = st;
  return st;
}

// The watcher's thread, also while another drives the transport: one relaxed add on this
// rank's own cache line, which no wait reads.
void ShmTransport::beat() {
  if (my_lines_ != nullptr) my_lines_->beat.value.fetch_add(1, std::memory_order_relaxed);
}

// Silence is measured from the first look that found the counter at its present value, so a
// long call of this rank (no looks) never counts against a peer: the peer beat meanwhile.
Status ShmTransport::check_beating(int i, std::chrono::steady_clock::time_point now) {
  if (options_.heartbeat_ms <= 0) return Status::Ok();  // no watcher beats anywhere (agreed at init)
  Peer& p = peers_[static_cast<size_t>(i)];
  const uint64_t count = p.lines->beat.value.load(std::memory_order_relaxed);
  if (p.beat_seen_at == std::chrono::steady_clock::time_point{} || count != p.beat_seen) {
    p.beat_seen = count;
    p.beat_seen_at = now;
    return Status::Ok();
  }
  const int64_t silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.beat_seen_at).count();
  if (silent < silence_limit_ms(options_.timeout_ms, options_.heartbeat_ms)) return Status::Ok();
  const std::string pid = p.dom < 0 ? "" : " (pid " + std::to_string(domain_->pid(p.dom)) + ", on this host)";
  p.silenced = true;
  return silence_verdict(who(i) + pid,
                         "did not bump its heartbeat in shared memory", silent, options_.heartbeat_ms,
                         options_.timeout_ms);
}

// Each peer's beat counter as the waiting thread last saw it, and since when at that value: a
// stopped peer's stands still (its watcher beats also while it is in a call). Only in the slow
// path of a wait, which sleeps next: nothing on a fast wait. A value the watcher's idle detection
// already saw (check_beating) counts from that earlier look: a wait that begins after the
// communicator idled beside a stopped peer fails on the silence, counted from the silence, not at
// its own timeout (the socket transport's heard_ is one reading for both threads). The watcher
// wrote it between calls, before this call's Driving handshake (libcomm/src/watch.cc).
void ShmTransport::note_beats(std::chrono::steady_clock::time_point now) {
  if (options_.heartbeat_ms <= 0) return;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_ || peers_[i].lines == nullptr) continue;
    Peer& p = peers_[i];
    const uint64_t count = p.lines->beat.value.load(std::memory_order_relaxed);
    if (count != p.beat_heard || p.beat_heard_at == std::chrono::steady_clock::time_point{}) {
      p.beat_heard = count;
      const bool seen_before = p.beat_seen == count && p.beat_seen_at != std::chrono::steady_clock::time_point{};
      p.beat_heard_at = seen_before ? std::min(now, p.beat_seen_at) : now;
    }
  }
}

int64_t ShmTransport::silent_ms(int peer) {
  const int i = local_of(peer);
  if (i < 0 || i == me_ || options_.heartbeat_ms <= 0) return -1;
  const Peer& p = peers_[static_cast<size_t>(i)];
  if (p.lines == nullptr || p.beat_heard_at == std::chrono::steady_clock::time_point{}) return -1;
  if (p.lines->beat.value.load(std::memory_order_relaxed) != p.beat_heard) return 0;  // it beat since
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - p.beat_heard_at)
      .count();
}

Status ShmTransport::check_silent(int i, const OpTag& tag) {
  const int64_t silent = silent_ms(peers_[static_cast<size_t>(i)].rank);
  if (silent < 0 || silent < silence_limit_ms(options_.timeout_ms, options_.heartbeat_ms)) return Status::Ok();
  return Timeout(who(i) + " did not bump its heartbeat in shared memory (every " + std::to_string(options_.heartbeat_ms) +
                 " ms, COMM_HEARTBEAT_MS) for " + std::to_string(silent) + " ms (COMM_TIMEOUT_MS " +
                 std::to_string(options_.timeout_ms) + ") while rank " + std::to_string(rank()) + " waited on it in " +
                 describe(tag) + "; is it stopped (SIGSTOP, a debugger) or hung?");
}

int ShmTransport::local_of(int r) const {
  return r >= 0 && r < size() ? local_of_[static_cast<size_t>(r)] : -1;
}

std::string ShmTransport::me() const {
  return options_.comm_label + (options_.comm_label.empty() ? "" : " ") + "rank " + std::to_string(rank());
}

Status ShmTransport::usable() {
  if (aborted_.load(std::memory_order_acquire) && failed_.code() != COMM_ERR_ABORTED)
    failed_ = Aborted(me() + ": the transport was aborted (comm_abort); make a new communicator");
  return failed_;
}

void ShmTransport::ring(int i, bool fenced) {
  ControlLines* l = peers_[static_cast<size_t>(i)].lines;
  if (fenced) std::atomic_thread_fence(std::memory_order_seq_cst);  // our store, then their flag
  if (l->sleeping.value.load(std::memory_order_seq_cst) == 0) return;
  l->doorbell.word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&l->doorbell.word);
}

void ShmTransport::ring_all(bool fenced) {
  if (fenced) std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i)
    if (i != me_) ring(i, false);
}

void ShmTransport::abort() {
  aborted_.store(true, std::memory_order_release);
  if (my_lines_ == nullptr) return;
  // Local peers waiting on this rank learn it now, as a socket peer does from the connection that
  // abort closes; without it they waited out COMM_TIMEOUT_MS for a rank that had given up (a
  // fault-tolerant DDP survivor aborting its step's communicator while a peer still waited in it,
  // so that peer reached the agreement too late: python-fault-tolerant-kill-options). Order 0:
  // it concerns every operation.
  publish_failure(me() + " aborted the communicator (comm_abort)", COMM_ERR_ABORTED, 0);
  my_lines_->doorbell.word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&my_lines_->doorbell.word);
}

void ShmTransport::wake() {
  woken_.store(true, std::memory_order_release);
  if (my_lines_ == nullptr) return;
  my_lines_->doorbell.word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&my_lines_->doorbell.word);
}

// A failure one local peer reported (notify_peers) ends every wait on the operation it names or
// a later one, as an ERROR frame does on a socket; a wait on an earlier operation goes on, since
// the peer's data of it is in shared memory already. INVALID_USAGE stays INVALID_USAGE: every
// rank then names the disagreement.
Status ShmTransport::peer_errors(uint64_t order) {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_ || peers_[i].reported) continue;
    const ControlHeader* h = peers_[i].header;
    const uint32_t code = h->error_code.load(std::memory_order_acquire);
    if (code == 0) continue;
    std::string text(h->error_text, std::min<size_t>(h->error_len, kMaxErrorText));
    for (auto& ch : text)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f) ch = '?';
    const comm_status_t status = code == COMM_ERR_INVALID_USAGE ? COMM_ERR_INVALID_USAGE : COMM_ERR_REMOTE;
    // A hang (a timeout report): the core traces it (wait_failure) when a wait takes the report.
    keep_report(Status(status, who(static_cast<int>(i)) + " reported: " + text), h->error_order,
                code == COMM_ERR_TIMEOUT);
    peers_[i].reported = true;
  }
  return report_for(order);
}

uint64_t ShmTransport::order_of(const RequestId* ids, size_t n) {
  uint64_t order = 0;
  for (size_t i = 0; i < n; ++i) {
    const Request& r = pool_.of(ids[i]);
    if (r.tag.order == 0 || r.any) return r.any ? kAnyOrder : 0;
    order = std::max(order, r.tag.order);
  }
  return order;
}

Status ShmTransport::check_alive(int i, const std::string& during) {
  const Peer& p = peers_[static_cast<size_t>(i)];
  if (i == me_ || p.dom < 0 || !domain_->exited(p.dom)) return Status::Ok();
  return RemoteError(who(i) + " (pid " + std::to_string(domain_->pid(p.dom)) + ", on this host) exited during " +
                     during + " (did it crash or get killed?)");
}

void ShmTransport::notify_peers(const Status& failure, uint64_t order) {
  Status reason = failure.ok() ? Internal(me() + ": notify_peers called without a failure") : failure;
  publish_failure(reason.message(), reason.code(), order);
  (void)fail(reason);
}

void ShmTransport::publish_failure(const std::string& text, comm_status_t code, uint64_t order) {
  if (my_header_ == nullptr || my_header_->error_code.load(std::memory_order_relaxed) != 0 ||
      published_.exchange(true, std::memory_order_acq_rel))
    return;
  const size_t len = std::min(text.size(), kMaxErrorText);
  std::memcpy(my_header_->error_text, text.data(), len);
  my_header_->error_len = static_cast<uint32_t>(len);
  my_header_->error_order = order;
  my_header_->error_code.store(static_cast<uint32_t>(code), std::memory_order_release);
  // Everyone, sleeping or not: a peer may wait on someone else and must still end.
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    peers_[i].lines->doorbell.word.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&peers_[i].lines->doorbell.word);
  }
  COMM_INFO(kNet, "%s: told its %zu local peer(s) that it failed: %s", me().c_str(), peers_.size() - 1, text.c_str());
}

// A local peer whose process exited (its pidfd) without comm_destroy, or that idle detection
// found silent. Judged here too (a healthy transport, whose watcher reads the counters: the beat
// seen is current): a SIGSTOPped rank's counter stands still, and without this the agreement of a
// communicator that carries no calls (the DDP wrapper's) waited out its timeout for a stopped
// local rank after its engine had already timed out on it, twice the timeout per SIGSTOP. A failed
// transport's watcher stopped and so did its peers' (their beats with it): that silence proves
// nothing (transports/transport.h, closed_peers).
void ShmTransport::find_lost(std::vector<int>* out, Silence silence) {
  const auto now = std::chrono::steady_clock::now();
  const bool healthy = failed_.ok() && !aborted_.load(std::memory_order_acquire);
  for (size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (static_cast<int>(i) == me_ || p.header->left.load(std::memory_order_acquire) != 0) continue;
    bool lost = !check_alive(static_cast<int>(i), "").ok() || (silence != Silence::kNever && p.silenced);
    if (!lost && silence == Silence::kNow && healthy && options_.heartbeat_ms > 0 && p.lines != nullptr &&
        p.beat_seen_at != std::chrono::steady_clock::time_point{} &&
        p.lines->beat.value.load(std::memory_order_relaxed) == p.beat_seen)
      lost = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.beat_seen_at).count() >=
             silence_limit_ms(options_.timeout_ms, options_.heartbeat_ms);
    if (lost) out->push_back(p.rank);
  }
}

// ---- waits on requests -------------------------------------------------------------------

void ShmTransport::charge(int i, uint64_t ns, bool flowing) {
  if (Arrivals* a = arrivals()) a->waited(peers_[static_cast<size_t>(i)].rank, ns, flowing);
}

// As the socket transport's drive: a receive unfinished at the last look (or still unfinished)
// had the stretch; one that had begun to come (bytes copied) had it in transit.
void ShmTransport::charge_requests(const RequestId* ids, size_t n, uint64_t ns) {
  for (size_t k = 0; k < n; ++k) {
    Request& r = pool_.of(ids[k]);
    if (r.is_send || r.any) continue;
    if (r.awaited || !r.done) charge(r.peer, ns, r.moved > 0);
    r.awaited = !r.done;
  }
}

Status ShmTransport::wait(const RequestId* ids, size_t n) {
  COMM_RETURN_IF_ERROR(usable());
  COMM_RETURN_IF_ERROR(pool_.lookup_all(ids, n));
  auto all_done = [&] {
    for (size_t i = 0; i < n; ++i)
      if (!pool_.of(ids[i]).done) return false;
    return true;
  };
  Status st = await(order_of(ids, n),
      [&](bool* done, bool* moved) {
        COMM_RETURN_IF_ERROR(progress(moved));
        *done = all_done();
        return Status::Ok();
      },
      [&](bool timed_out) {
        std::string text;
        for (size_t i = 0; i < n; ++i) {
          const Request& r = pool_.of(ids[i]);
          if (!r.done) COMM_RETURN_IF_ERROR(request_stuck(r, timed_out, &text));
        }
        if (timed_out)
          return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                         std::to_string(rank()) + " waited on " + text +
                         "; is that rank still running, and calling the same operation?");
        return Status::Ok();
      },
      [&](uint64_t ns) { charge_requests(ids, n, ns); });
  if (!st.ok()) return note_unfinished(st, ids, n);
  for (size_t i = 0; i < n; ++i) release(decltype(pool_)::index_of(ids[i]));
  return Status::Ok();
}

Status ShmTransport::wait_some(const RequestId* ids, size_t n) {
  COMM_RETURN_IF_ERROR(usable());
  if (n == 0) return Status::Ok();
  COMM_RETURN_IF_ERROR(pool_.lookup_all(ids, n));
  Status st = await(order_of(ids, n),
      [&](bool* done, bool* moved) {
        COMM_RETURN_IF_ERROR(progress(moved));
        for (size_t i = 0; i < n && !*done; ++i) *done = pool_.of(ids[i]).done;
        if (woken_.exchange(false, std::memory_order_acq_rel)) *done = true;
        return Status::Ok();
      },
      [&](bool timed_out) {
        std::string text;
        for (size_t i = 0; i < n; ++i) {
          const Request& r = pool_.of(ids[i]);
          if (!r.done) COMM_RETURN_IF_ERROR(request_stuck(r, timed_out, &text));
        }
        if (timed_out)
          return Timeout("no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                         std::to_string(rank()) + " waited on " + text +
                         "; is that rank still running, and calling the same operation?");
        return Status::Ok();
      },
      [&](uint64_t ns) { charge_requests(ids, n, ns); });
  return st.ok() ? st : note_unfinished(st, ids, n);
}

Status ShmTransport::note_unfinished(const Status& failure, const RequestId* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Request& r = pool_.of(ids[i]);
    if (!r.done && !r.any) note_awaited(failure, peers_[static_cast<size_t>(r.peer)].rank, r.tag);
  }
  seal_wait_failure(failure);
  return failure;
}

Status ShmTransport::test(RequestId id, bool* done) {
  COMM_RETURN_IF_ERROR(usable());
  if (done == nullptr) return InvalidArgument("shm transport: null done pointer");
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.lookup(id, &index));
  Request& r = pool_[index];
  if (!r.done) {
    bool moved = false;
    COMM_RETURN_IF_ERROR(progress(&moved));
    Status st = peer_errors(r.any ? kAnyOrder : r.tag.order);
    if (st.ok() && !r.done) {
      std::string ignored;
      st = request_stuck(r, false, &ignored);
    }
    if (!st.ok()) return fail(st);
  }
  *done = r.done;
  if (*done) release(index);
  return Status::Ok();
}

}  // namespace comm::transport::shm
