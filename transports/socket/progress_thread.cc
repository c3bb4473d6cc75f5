// The socket transport's progress thread (COMM_SOCKET_PROGRESS_THREAD_BYTES, docs/design/transports.md,
// "The socket progress thread"): while a large request is open and no caller is inside the transport -- a ring
// reducing the chunk it just received, or a trainer between two waits -- it polls the data
// connections and moves bytes, so a socket does not drain or fill up behind a reduction, and on
// a host whose cores are busy the rank has a second runnable thread when bytes arrive.
//
// Rules that keep it small:
// - It never blocks holding the lock: poll() runs unlocked on a copy of the descriptors, and
//   readiness is only a hint (handle_polls skips a connection that changed meanwhile).
// - It parks whenever a caller is inside (callers_ > 0): the caller's wait moves everything
//   itself, as without the thread, so small messages never go through it.
// - It does not dial, accept, beat or time out: the mesh, heartbeats and deadlines stay with
//   the caller's wait (progress.cc). A failure it reads (a peer's ERROR frame, a malformed
//   frame) is kept for the caller's next wait, which reports it naming the peers it waited on.
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "socket/socket_transport_impl.h"

namespace comm::transport::sock {

SocketTransport::Entry::Entry(SocketTransport& t) : t_(t) {
  t_.callers_.fetch_add(1, std::memory_order_acq_rel);
  lock_ = std::unique_lock<std::mutex>(t_.mu_);
}

// The watcher's heartbeat (heartbeat.cc) must never wait behind a caller blocked in poll().
SocketTransport::Entry::Entry(SocketTransport& t, std::try_to_lock_t) : t_(t), lock_(t.mu_, std::try_to_lock) {
  if (lock_.owns_lock()) t_.callers_.fetch_add(1, std::memory_order_acq_rel);  // under the lock, as the thread reads it
}

SocketTransport::Entry::~Entry() {
  if (!lock_.owns_lock()) return;  // a try that found someone inside
  // Counted out under the lock, so the thread's check of callers_ (also under it) cannot miss
  // the last caller leaving.
  const bool last = t_.callers_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  const bool work = last && t_.thread_.joinable() && t_.thread_has_work();
  // A thread blocked in poll() watches the connections as they were: this caller may have queued
  // a send (POLLOUT), posted the receive of a stashed header (POLLIN) or installed a connection.
  // Wake it to look again; a parked thread is only notified.
  const bool repoll = work && t_.thread_polling_;
  lock_.unlock();
  if (repoll) {
    uint64_t one = 1;
    if (::write(t_.thread_wake_.get(), &one, sizeof one) < 0) {
      // Only fails when the counter would overflow: it is already signalled.
    }
  } else if (work) {
    t_.thread_cv_.notify_one();  // the last caller out hands the open requests to the thread
  }
}

bool SocketTransport::thread_has_work() const {
  return open_large_ > 0 && !thread_stop_ && failed_.ok() && thread_failed_.ok() &&
         !aborted_.load(std::memory_order_acquire);
}

void SocketTransport::start_progress_thread() {
  if (thread_.joinable() || thread_min_bytes_ == 0) return;
  thread_wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!thread_wake_.valid()) {
    COMM_WARN(kNet, "%s: no progress thread (eventfd() failed: %s); waits move the bytes", me().c_str(),
              errno_string(errno).c_str());
    thread_min_bytes_ = 0;
    return;
  }
  thread_ = std::thread([this] { progress_thread_loop(); });
}

void SocketTransport::stop_progress_thread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    thread_stop_ = true;
  }
  thread_cv_.notify_one();
  uint64_t one = 1;
  if (::write(thread_wake_.get(), &one, sizeof one) < 0) {
    // Only fails when the counter would overflow: it is already signalled.
  }
  thread_.join();
}

void SocketTransport::progress_thread_loop() {
  log::set_thread_rank(rank());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    thread_cv_.wait(lock, [&] {
      return thread_stop_ || (callers_.load(std::memory_order_acquire) == 0 && thread_has_work());
    });
    if (thread_stop_) return;
    thread_pfds_.clear();
    thread_conn_of_.clear();
    thread_pfds_.push_back({thread_wake_.get(), POLLIN, 0});
    thread_conn_of_.push_back(0);
    const bool buffered = collect_polls(&thread_pfds_, &thread_conn_of_);  // TLS: bytes poll() cannot see
    thread_polling_ = true;
    lock.unlock();
    // A caller that enters meanwhile takes the lock at once; this poll then ends at the next
    // event (or after kMaxBlockMs) and the thread parks.
    int rc = ::poll(thread_pfds_.data(), thread_pfds_.size(), buffered ? 0 : kMaxBlockMs);
    lock.lock();
    thread_polling_ = false;
    if (rc < 0 || (rc == 0 && !buffered)) continue;  // EINTR or nothing within the cap: look again
    if (thread_pfds_[0].revents & POLLIN) {
      uint64_t count = 0;
      ssize_t ignored = ::read(thread_wake_.get(), &count, sizeof count);
      (void)ignored;
    }
    // A caller waiting for the lock goes first: its own wait sees the same readiness.
    if (thread_stop_ || callers_.load(std::memory_order_acquire) > 0 || !thread_has_work()) continue;
    Status st = handle_polls(thread_pfds_, thread_conn_of_, 1, thread_pfds_.size());
    if (!st.ok()) thread_failed_ = st;
  }
}

}  // namespace comm::transport::sock
