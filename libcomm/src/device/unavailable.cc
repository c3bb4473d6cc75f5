// Built without the CUDA/NCCL headers (meson -Dcuda=disabled, or none in -Dcudapath): device
// buffers are unavailable, with a message saying so; everything else works as before.
#include "communicator.h"
#include "device/device.h"

namespace comm::device {

namespace {
const char* kWhy = "libcomm was built without the CUDA/NCCL headers (meson found no cuda_runtime_api.h and nccl.h "
                   "under -Dcudapath); rebuild with them to use device buffers";
}

Probe probe_process() {
  Probe p;
  p.why_not = kWhy;
  return p;
}

Status init_forced(comm_t c) {
  return Unavailable("rank " + std::to_string(c->rank) + ": COMM_TRANSPORT=nccl, but " + kWhy);
}

Status issue(comm_t c, const algo::CollArgs&, comm_stream_t, bool) {
  return Unavailable("rank " + std::to_string(c->rank) + ": a non-NULL stream means device buffers, but " + kWhy +
                     ". Pass NULL for host buffers");
}

Status open_engine_streams(comm_t c, comm_stream_t, std::unique_ptr<EngineStreams>*) {
  return Unavailable("rank " + std::to_string(c->rank) + ": device gradients (a non-NULL stream in comm_engine_config_t), but " +
                     kWhy + ". Pass stream = NULL with host gradients");
}

Status group_end() { return Status::Ok(); }
Status group_finish(bool) { return Status::Ok(); }
bool mem_alloc(comm_t, size_t, void**, Status*) { return false; }
bool mem_free(comm_t, void*, Status*) { return false; }
Status check_shrink(comm_t) { return Status::Ok(); }  // no device state: the host part is all
Status shrink(comm_t, comm_t, const std::vector<int>&) { return Status::Ok(); }
void release(comm_t) {}

}  // namespace comm::device
