// comm_barrier_monitored: a barrier with its own deadline that names the ranks that did not
// arrive, as gloo's monitoredBarrier (torch.distributed.monitored_barrier) does. Rank 0 receives
// one byte from every other rank, then sends each one byte back; the others send, then wait for
// rank 0's byte. It is built on the communicator's own point-to-point calls, so it waits no
// longer than its deadline (shorter than the communicator's timeout, as a rank that is stuck
// elsewhere is what it is there to find), and on a failure it aborts the communicator: the
// receives still posted to the missing ranks are what a later call would match otherwise.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "abi_guard.h"
#include "comm/comm.h"

namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Waiting {
  int peer;
  comm_request_t req;
  bool done = false;
  comm_status_t status = COMM_OK;
};

// Tests every request until all are done or the deadline passes. A request that ended with an
// error counts as done (its status says how).
void poll_until(std::vector<Waiting>* reqs, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    bool all = true;
    for (auto& w : *reqs) {
      if (w.done) continue;
      int done = 0;
      comm_status_t s = comm_test(w.req, &done);
      if (done) {
        w.done = true;
        w.status = s;
      } else {
        all = false;
      }
    }
    if (all || Clock::now() >= deadline) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// Ends what is still pending: abort, then each request reports (comm_wait frees it).
void abandon(comm_t comm, std::vector<Waiting>* reqs) {
  comm_abort(comm);
  for (auto& w : *reqs)
    if (!w.done) {
      w.status = comm_wait(w.req);
      w.done = true;
    }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

Status run(comm_t comm, int timeout_ms, bool wait_all, int* missing, int max_missing, int* n_missing) {
  int rank = 0, size = 0;
  if (comm_rank(comm, &rank) != COMM_OK || comm_size(comm, &size) != COMM_OK)
    return InvalidArgument(std::string("comm_barrier_monitored: ") + comm_last_error(comm));
  if (size == 1) return Status::Ok();
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  static const uint8_t kToken = 1;
  static thread_local std::vector<uint8_t> sink;
  sink.assign(static_cast<size_t>(size), 0);

  if (rank != 0) {
    std::vector<Waiting> reqs(2);
    reqs[0].peer = reqs[1].peer = 0;
    if (comm_isend(comm, &kToken, 1, COMM_UINT8, 0, &reqs[0].req) != COMM_OK ||
        comm_irecv(comm, sink.data(), 1, COMM_UINT8, 0, &reqs[1].req) != COMM_OK)
      return RemoteError(std::string("comm_barrier_monitored: ") + comm_last_error(comm));
    poll_until(&reqs, deadline);
    bool ok = reqs[0].done && reqs[1].done && reqs[0].status == COMM_OK && reqs[1].status == COMM_OK;
    if (ok) return Status::Ok();
    const bool late = !reqs[1].done;
    abandon(comm, &reqs);
    std::string msg = "Rank " + std::to_string(rank) +
                      " successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                      "from rank 0. Please check rank 0 logs for faulty rank. (comm_barrier_monitored: " +
                      (late ? "rank 0 did not release it within " + std::to_string(timeout_ms) + " ms"
                            : std::string("the exchange with rank 0 failed")) +
                      "; the communicator is aborted)";
    return late ? Timeout(msg) : RemoteError(msg);
  }

  std::vector<Waiting> reqs(static_cast<size_t>(size - 1));
  for (int p = 1; p < size; ++p) {
    Waiting& w = reqs[static_cast<size_t>(p - 1)];
    w.peer = p;
    if (comm_irecv(comm, &sink[static_cast<size_t>(p)], 1, COMM_UINT8, p, &w.req) != COMM_OK) {
      std::string detail = comm_last_error(comm);
      reqs.resize(static_cast<size_t>(p - 1));
      abandon(comm, &reqs);
      return RemoteError("comm_barrier_monitored: " + detail);
    }
  }
  if (timeout_ms > 0) poll_until(&reqs, deadline);
  std::vector<int> absent;
  for (const auto& w : reqs)
    if (!w.done || w.status != COMM_OK) absent.push_back(w.peer);
  if (!absent.empty()) {
    abandon(comm, &reqs);
    if (n_missing != nullptr) *n_missing = static_cast<int>(absent.size());
    for (size_t i = 0; missing != nullptr && i < absent.size() && static_cast<int>(i) < max_missing; ++i)
      missing[i] = absent[i];
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    if (timeout_ms == 0 && !wait_all)
      return Timeout("Rank 0 timed out in monitoredBarrier after " + std::to_string(waited) + " ms (" +
                     std::to_string(absent.size()) + " of " + std::to_string(size - 1) +
                     " ranks had not arrived; the communicator is aborted)");
    std::string who = wait_all && absent.size() > 1 ? "Ranks " + rank_list(absent) : "Rank " + std::to_string(absent[0]);
    return Timeout(who + " failed to pass monitoredBarrier in " + std::to_string(timeout_ms) +
                   " ms (comm_barrier_monitored on rank 0; missing: " + rank_list(absent) +
                   "; the communicator is aborted)");
  }
  std::vector<Waiting> sends(static_cast<size_t>(size - 1));
  for (int p = 1; p < size; ++p) {
    Waiting& w = sends[static_cast<size_t>(p - 1)];
    w.peer = p;
    if (comm_isend(comm, &kToken, 1, COMM_UINT8, p, &w.req) != COMM_OK) {
      std::string detail = comm_last_error(comm);
      sends.resize(static_cast<size_t>(p - 1));
      abandon(comm, &sends);
      return RemoteError("comm_barrier_monitored: releasing rank " + std::to_string(p) + ": " + detail);
    }
  }
  // A send completes once the bytes are handed over; the peer has arrived, so this is prompt.
  for (auto& w : sends) {
    comm_status_t s = comm_wait(w.req);
    if (s != COMM_OK)
      return Status(s, "comm_barrier_monitored: releasing rank " + std::to_string(w.peer) + ": " + comm_last_error(comm));
  }
  return Status::Ok();
}

}  // namespace
}  // namespace comm

extern "C" {

COMM_API comm_status_t comm_barrier_monitored(comm_t comm, int timeout_ms, int wait_all, int* missing,
                                              int max_missing, int* n_missing) {
  return comm::guarded("comm_barrier_monitored", [&]() -> comm::Status {
    if (n_missing != nullptr) *n_missing = 0;
    if (comm == nullptr) return comm::InvalidArgument("comm_barrier_monitored: the communicator is NULL");
    if (timeout_ms < 0)
      return comm::InvalidArgument("comm_barrier_monitored: timeout_ms is " + std::to_string(timeout_ms) +
                                   ", expected >= 0");
    if (max_missing < 0 || (max_missing > 0 && missing == nullptr))
      return comm::InvalidArgument("comm_barrier_monitored: missing is NULL with max_missing " +
                                   std::to_string(max_missing));
    return comm::run(comm, timeout_ms, wait_all != 0, missing, max_missing, n_missing);
  });
}

}  // extern "C"
