// comm_shrink on the device path: a parent whose device buffers go through NCCL hands its NCCL
// communicator to ncclCommShrink (NCCL 2.27+), so the child's NCCL communicator is NCCL's own
// shrink of it; a parent without one has nothing to carry over.
#include "device/state.h"
#include "log.h"
#include "nccl/nccl_calls.h"

namespace comm::device {

Status check_shrink(comm_t c) {
  const auto& s = c->device;
  if (!s || s->path != State::Path::kNccl || s->nccl == nullptr) return Status::Ok();
  if (s->nccl->ncclCommShrink == nullptr)
    return Unavailable(s->where() + "comm_shrink: this communicator's device buffers go through NCCL " +
                       s->nccl->version_text() + ", which has no ncclCommShrink (NCCL 2.27 or later); install a newer "
                       "NCCL (COMM_NCCL_LIBRARY), or start a new job");
  return Status::Ok();
}

Status shrink(comm_t parent, comm_t child, const std::vector<int>& excluded) {
  const auto& p = parent->device;
  if (!p || p->path != State::Path::kNccl) return Status::Ok();
  auto s = std::make_shared<State>(child);
  s->path = State::Path::kNccl;
  s->cuda = p->cuda;
  s->nccl = p->nccl;
  s->cuda_device = p->cuda_device;
  cudaError_t e = s->cuda->cudaSetDevice(s->cuda_device);
  if (e != cudaSuccess)
    return SystemError(s->where() + "cudaSetDevice(" + std::to_string(s->cuda_device) + ") failed: " +
                       s->cuda->error_text(e));
  bool parent_failed;
  {
    std::lock_guard<std::mutex> lock(parent->state_mu);
    parent_failed = !parent->broken.ok() || parent->aborted.load();
  }
  s->nccl_name = "libcomm comm " + child->id;
  {
    std::lock_guard<std::mutex> lock(p->watch_mu);  // the watchdog may abort the parent's NCCL communicator
    if (p->nccl_comm == nullptr || p->nccl_dead.load())
      return Unavailable(s->where() + "comm_shrink: the parent's NCCL communicator was aborted after an error, and "
                         "NCCL cannot shrink it any more; start a new job");
    COMM_RETURN_IF_ERROR(nccl::shrink_comm(*s->nccl, p->nccl_comm, excluded, parent_failed || p->nccl_dead.load(),
                                           s->nccl_name.c_str(), s->wait_policy(), &s->nccl_comm));
  }
  e = s->cuda->cudaEventCreateWithFlags(&s->probe_event, cudaEventDisableTiming);
  if (e != cudaSuccess) return SystemError(s->where() + "cudaEventCreate failed: " + s->cuda->error_text(e));
  s->why = "NCCL " + s->nccl->version_text() + " (ncclCommShrink)";
  COMM_INFO(kInit, "comm %s rank %d: NCCL communicator shrunk from comm %s", child->id.c_str(), child->rank,
            parent->id.c_str());
  s->start_watchdog();
  child->device = std::move(s);
  return Status::Ok();
}

}  // namespace comm::device
