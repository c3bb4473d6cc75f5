// The communicator's idle watcher (watch.h): one sleeping thread per communicator, awake for
// a few microseconds every COMM_HEARTBEAT_MS.
#include "watch.h"

#include <chrono>

#include "log.h"

namespace comm {

namespace {

void watch_loop(comm_t c) {
  log::set_thread_rank(c->rank);
  const auto period = std::chrono::milliseconds(c->settings.heartbeat_ms);
  std::unique_lock<std::mutex> lock(c->watch_mu);
  for (;;) {
    c->watch_cv.wait_for(lock, period, [&] { return c->watch_stop; });
    if (c->watch_stop) return;
    // First, whatever runs: a beat in memory (shared memory) needs no lock on the transport,
    // and a rank busy in a long call or in its own code must still look alive to idle peers.
    c->transport->beat();
    // A broken or aborted communicator has nothing left to find; its error is already kept.
    if (c->aborted.load(std::memory_order_acquire) || c->is_broken.load(std::memory_order_acquire)) return;
    // Dekker's handshake with Driving: one of the two sees the other's flag.
    c->watching.store(true, std::memory_order_seq_cst);
    if (c->drivers.load(std::memory_order_seq_cst) != 0) {
      c->watching.store(false, std::memory_order_seq_cst);  // a call runs: its waits watch the peers
      continue;
    }
    Status st = c->transport->check_idle();
    if (!st.ok()) {
      // Broken and the peers told, as a failed call would (fail_communicator); callers that
      // arrive meanwhile wait in Driving, then find it broken.
      st = fail_communicator(c, st.prefixed("rank " + std::to_string(c->rank) + ", comm " + c->id +
                                            ", between calls (idle detection): "),
                             c->transport->idle_failure_order());
      std::lock_guard<std::mutex> state(c->state_mu);
      if (c->async_error.ok()) c->async_error = st;
    }
    c->watching.store(false, std::memory_order_seq_cst);
    if (!st.ok()) return;
  }
}

}  // namespace

void start_watcher(comm_t c) {
  if (c->settings.heartbeat_ms <= 0 || c->size < 2 || !c->transport) return;
  c->watcher = std::thread(watch_loop, c);
}

void stop_watcher(comm_t c) {
  {
    std::lock_guard<std::mutex> lock(c->watch_mu);
    c->watch_stop = true;
  }
  c->watch_cv.notify_all();
  if (c->watcher.joinable()) c->watcher.join();
}

}  // namespace comm
