// Per communicator device state: which path device buffers take (NCCL or staged), the NCCL
// communicator with its watchdog, NCCL-registered allocations, and the pinned staging buffer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"
#include "deadline.h"
#include "dl/cuda_library.h"
#include "device/device.h"
#include "dl/nccl_library.h"
#include "nccl/nccl_calls.h"

namespace comm::device {

using dl::CudaLibrary;  // the dlopen shims (libcomm/base/dl/)
using dl::NcclLibrary;
using dl::cuda_library;
using dl::nccl_library;

class State {
 public:
  enum class Path { kNccl, kStaged, kUnavailable };
  explicit State(comm_t c) : comm(c) {}
  ~State();

  comm_t comm;
  Path path = Path::kStaged;
  std::string why;  // why this path, for the log
  const CudaLibrary* cuda = nullptr;
  const NcclLibrary* nccl = nullptr;

  // ---- NCCL (nccl_comm.cc) ----
  ncclComm_t nccl_comm = nullptr;
  std::string nccl_name;
  int cuda_device = -1;
  Status create_nccl(int device);  // collective: unique id through the store, nonblocking init
  Status run_nccl(const algo::CollArgs& a, cudaStream_t stream, bool grouped);
  // Waits (bounded, abortable) while NCCL says ncclInProgress; converts a failure.
  Status settle(ncclResult_t r, const char* what);
  nccl::WaitPolicy wait_policy() const;  // this communicator's timeout, abort flag and name
  void destroy_nccl();

  // ---- watchdog (watchdog.cc): NCCL's async errors and calls that never complete ----
  void start_watchdog();
  void stop_watchdog();
  void track(cudaStream_t stream);  // after each NCCL call: at most one probe event in flight
  std::thread watchdog;
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;
  std::atomic<bool> nccl_dead{false};  // aborted by the watchdog (or comm_abort)
  cudaEvent_t probe_event = nullptr;
  std::atomic<bool> probe_pending{false};
  Clock::time_point probe_since{}, last_probe{};

  // ---- NCCL-registered memory (comm_mem_alloc on an NCCL communicator) ----
  std::mutex mem_mu;
  std::map<void*, void*> registered;  // pointer -> ncclCommRegister handle (nullptr: not registered)

  // ---- staged path (staged.cc) ----
  Status run_staged(const algo::CollArgs& a, cudaStream_t stream);
  void* staging = nullptr;  // pinned host memory, allocated once per size class and reused
  size_t staging_bytes = 0;
  cudaEvent_t staging_free = nullptr;  // the last copy out of the staging buffer has finished
  cudaEvent_t staged_in = nullptr;     // the copy into the staging buffer has finished
  bool staging_pending = false;
  // Send/recv inside a group: each call of the group holds its own pinned buffer until the
  // group ends (slot i for the i-th call), reused by later groups.
  struct GroupSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t free = nullptr;  // the copy out of it has finished
    bool pending = false;
  };
  std::vector<GroupSlot> group_slots;
  size_t group_used = 0;  // slots taken by the group being built on this communicator
  Status run_staged_grouped(const algo::CollArgs& a, cudaStream_t stream);
  Status pinned(void** p, size_t* have, size_t need);  // grows a pinned buffer to a power of two

  // Polls an event until it completes: bounded by the communicator's timeout, ended by comm_abort.
  Status wait_event(cudaEvent_t ev, const char* what);
  // Records a failure that involved peers: the communicator is broken, its peers are told.
  Status fail(Status st);
  std::string where() const;  // "rank 2, comm 0: "
};

}  // namespace comm::device
