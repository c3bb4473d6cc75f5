// The watchdog: one thread per NCCL communicator that polls ncclCommGetAsyncError and a probe
// event behind the latest NCCL call. An asynchronous error, a call that has not completed within
// the communicator's timeout, or comm_abort: the NCCL communicator is aborted (which ends the
// kernels waiting on a dead peer) and the libcomm communicator is broken with a message saying
// which rank, what NCCL said, and what to do.
#include "log.h"
#include "device/state.h"

namespace comm::device {
namespace {
constexpr auto kPollInterval = std::chrono::milliseconds(10);
constexpr auto kProbeInterval = std::chrono::milliseconds(1);  // at most one probe event recorded per ms
}  // namespace

void State::track(cudaStream_t stream) {
  // One probe in flight at a time, recorded at most once a millisecond: a hung collective
  // holds every later one on its stream, so the oldest unfinished probe ages until the timeout.
  if (probe_pending.load(std::memory_order_acquire)) return;
  const auto now = Clock::now();
  if (now - last_probe < kProbeInterval) return;
  last_probe = now;
  if (cuda->cudaEventRecord(probe_event, stream) != cudaSuccess) {
    (void)cuda->cudaGetLastError();
    return;
  }
  probe_since = now;
  probe_pending.store(true, std::memory_order_release);
}

void State::start_watchdog() {
  watchdog = std::thread([this] {
    log::set_thread_rank(comm->rank);
    (void)cuda->cudaSetDevice(cuda_device);
    const auto timeout = std::chrono::milliseconds(comm->settings.timeout_ms);
    std::unique_lock<std::mutex> lock(watch_mu);
    while (!watch_stop) {
      watch_cv.wait_for(lock, kPollInterval);
      if (watch_stop || nccl_comm == nullptr) break;
      Status st;
      if (comm->aborted.load(std::memory_order_acquire)) {
        st = Aborted(where() + "comm_abort: the NCCL communicator was aborted");
      } else {
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = nccl->ncclCommGetAsyncError(nccl_comm, &async);
        if (q != ncclSuccess) async = q;
        if (async != ncclSuccess && async != ncclInProgress) {
          st = settle(async, "NCCL (asynchronous error, found by the watchdog)");
        } else if (probe_pending.load(std::memory_order_acquire)) {
          cudaError_t e = cuda->cudaEventQuery(probe_event);
          if (e == cudaSuccess) {
            probe_pending.store(false, std::memory_order_release);
          } else if (e != cudaErrorNotReady) {
            st = SystemError(where() + "a stream with NCCL work failed: " + cuda->error_text(e));
          } else if (Clock::now() - probe_since > timeout) {
            st = Timeout(where() + "an NCCL collective enqueued " + std::to_string(comm->settings.timeout_ms) +
                         " ms ago has not completed (COMM_TIMEOUT_MS): a peer that never made the same call, or one "
                         "that died; the NCCL communicator was aborted. Destroy this communicator and make a new one");
          }
        }
      }
      if (st.ok()) continue;
      (void)nccl->ncclCommAbort(nccl_comm);
      nccl_comm = nullptr;
      nccl_dead.store(true, std::memory_order_release);
      {
        std::lock_guard<std::mutex> state(comm->state_mu);
        if (st.code() != COMM_ERR_ABORTED) comm->set_broken_locked(st);
        if (comm->async_error.ok()) comm->async_error = st;
      }
      // Peers on the host transport are not told from here (one thread drives a transport);
      // their own watchdogs see NCCL's error or their own timeout.
      if (st.code() != COMM_ERR_ABORTED) COMM_WARN(kColl, "%s", st.message().c_str());
      break;
    }
  });
}

void State::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    watch_stop = true;
  }
  watch_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
}

}  // namespace comm::device
