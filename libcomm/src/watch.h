// Idle detection (docs/design/core.md, "Idle detection"): a dead or stopped peer is noticed while
// no call runs on the communicator, so comm_get_async_error reports it and the next call
// fails at once naming it, instead of blocking until the timeout.
#pragma once

#include <atomic>
#include <thread>

#include "communicator.h"

namespace comm {

// Held by every thread while it uses the communicator's transport (execute, the worker); the
// watcher touches the transport only when none is held. Entering costs one atomic add; it
// waits only while the watcher's own short, non-blocking look is running.
class Driving {
 public:
  explicit Driving(comm_t c) : c_(c) {
    c_->drivers.fetch_add(1, std::memory_order_seq_cst);
    while (c_->watching.load(std::memory_order_seq_cst)) std::this_thread::yield();
  }
  ~Driving() { c_->drivers.fetch_sub(1, std::memory_order_release); }
  Driving(const Driving&) = delete;
  Driving& operator=(const Driving&) = delete;

 private:
  comm_t c_;
};

// Starts the communicator's watcher (COMM_HEARTBEAT_MS > 0 and more than one rank): every
// period it calls the transport's check_idle() when no thread drives it; a failure breaks the
// communicator (its peers are told) and becomes its async error.
void start_watcher(comm_t c);
// Stops and joins it (comm_destroy, before the transport goes).
void stop_watcher(comm_t c);

}  // namespace comm
