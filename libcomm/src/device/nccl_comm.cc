// The NCCL communicator behind a libcomm communicator: created with a unique id exchanged
// through libcomm's store, nonblocking so that every wait on it is bounded by the
// communicator's timeout and ended by comm_abort; collectives enqueued on the caller's stream.
// The NCCL calls themselves are the wrapper's (transports/nccl/nccl_calls.h).
#include "device/state.h"
#include "log.h"
#include "nccl/nccl_calls.h"
#include "nccl_env.h"
#include "process_plan.h"
#include "tuning/nccl_settings.h"

namespace comm::device {

nccl::WaitPolicy State::wait_policy() const { return {comm->settings.timeout_ms, &comm->aborted, where()}; }

Status State::settle(ncclResult_t r, const char* what) {
  return nccl::settle(*nccl, nccl_comm, r, what, wait_policy());
}

Status State::create_nccl(int device) {
  // NCCL reads its environment once, at its first initialisation: the plan's NCCL_* settings and
  // the tuning profile's go in before that (never over the user's; prepare_process runs at
  // comm_init, this makes sure even when the probe saw no GPU).
  std::vector<std::string> notes;
  const auto tuned = tuning::nccl_settings(comm->settings.profile.get(), comm->size, &notes);
  if (!topology::apply_nccl_settings_once(tuned) && !tuned.empty())
    COMM_INFO(kEnv, "%sthe tuning profile's NCCL settings for %d ranks (%s) not applied: this process set NCCL's "
              "environment for its first NCCL communicator already, and NCCL reads it once",
              where().c_str(), comm->size, tuned.front().reason.c_str());
  if (device < 0) device = 0;
  cuda_device = device;
  cudaError_t e = cuda->cudaSetDevice(device);
  if (e != cudaSuccess)
    return SystemError(where() + "cudaSetDevice(" + std::to_string(device) + ") failed: " + cuda->error_text(e));
  auto store = make_prefix_store(comm->job_store, "comm/" + comm->id + "/device");
  ncclUniqueId id{};
  COMM_RETURN_IF_ERROR(nccl::exchange_unique_id(*nccl, *store, comm->rank, wait_policy(), &id));
  nccl_name = "libcomm comm " + comm->id;  // lives as long as the NCCL communicator
  COMM_RETURN_IF_ERROR(nccl::init_comm(*nccl, comm->size, comm->rank, id, nccl_name.c_str(), wait_policy(), &nccl_comm));
  e = cuda->cudaEventCreateWithFlags(&probe_event, cudaEventDisableTiming);
  if (e != cudaSuccess) return SystemError(where() + "cudaEventCreate failed: " + cuda->error_text(e));
  char busid[64] = "?";
  (void)cuda->cudaDeviceGetPCIBusId(busid, sizeof busid, device);
  std::string ft;
  for (const auto& [call, has] : nccl->fault_tolerance()) ft += (ft.empty() ? "" : ", ") + call + (has ? " yes" : " no");
  COMM_INFO(kInit, "comm %s rank %d: NCCL %s communicator on GPU %d (%s) ready; fault-tolerance calls: %s",
            comm->id.c_str(), comm->rank, nccl->version_text().c_str(), device, busid, ft.c_str());
  why = "NCCL " + nccl->version_text();
  start_watchdog();
  return Status::Ok();
}

Status State::run_nccl(const algo::CollArgs& a, cudaStream_t s, bool grouped) {
  std::unique_lock<std::mutex> lock(watch_mu);  // the watchdog aborts and frees the NCCL communicator under it
  if (nccl_comm == nullptr || nccl_dead.load(std::memory_order_acquire)) {
    lock.unlock();
    Status st = check_usable(comm);
    return st.ok() ? RemoteError(where() + "the NCCL communicator was aborted after an error; destroy this communicator")
                   : st;
  }
  nccl::Call call;
  call.kind = a.kind;
  call.sendbuf = a.sendbuf;
  call.recvbuf = a.recvbuf;
  call.count = a.count;
  call.dtype = a.dtype;
  call.op = a.op;
  call.root = a.root;
  call.peer = a.peer;
  call.nranks = comm->size;
  const char* what = nullptr;
  ncclResult_t r = nccl::enqueue(*nccl, nccl_comm, call, s, &what);
  if (what == nullptr) return Internal(where() + "no NCCL call for this collective");
  if (r != ncclSuccess && !(grouped && r == ncclInProgress)) {
    Status st = settle(r, what);
    if (!st.ok()) {
      lock.unlock();
      return fail(st);
    }
  }
  if (!grouped) track(s);
  return Status::Ok();
}

void State::destroy_nccl() {
  if (nccl_comm == nullptr) return;
  bool broken;
  {
    std::lock_guard<std::mutex> lock(comm->state_mu);
    broken = !comm->broken.ok();
  }
  {
    std::lock_guard<std::mutex> lock(mem_mu);
    for (auto& [ptr, handle] : registered) {
      if (handle) (void)nccl->ncclCommDeregister(nccl_comm, handle);
      if (nccl->ncclMemFree) (void)nccl->ncclMemFree(ptr);
      else (void)cuda->cudaFree(ptr);
    }
    registered.clear();
  }
  // Graceful: finalize flushes what is in flight (bounded); after an error or comm_abort, abort.
  nccl::close_comm(*nccl, nccl_comm, !broken && !comm->aborted.load(), wait_policy());
  nccl_comm = nullptr;
}

}  // namespace comm::device
