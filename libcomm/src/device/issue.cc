// The entry points the communicator calls for device buffers (device.h): find or decide the
// path, check the buffers are device memory, run through NCCL or the staging buffer.
#include <vector>

#include "log.h"
#include "params.h"
#include "device/state.h"

namespace comm::device {

Status decide(comm_t c, int device, std::shared_ptr<State>* out);  // decide.cc

namespace {

// An NCCL group opened on this thread by device calls inside comm_group_start/end.
struct OpenGroup {
  const NcclLibrary* nccl = nullptr;
  std::vector<State*> states;
};
thread_local OpenGroup t_group;

const char* buffer_name(const algo::CollArgs& a, bool send) {
  if (a.kind == transport::CollKind::kSendRecv) return "buf";
  return send ? "sendbuf" : "recvbuf";
}

// Device, managed or pinned host memory: what NCCL and cudaMemcpyAsync can use on a stream.
Status check_buffer(const State& s, const algo::CollArgs& a, const void* p, bool send, int* device) {
  if (p == nullptr || a.count == 0) return Status::Ok();
  cudaPointerAttributes attr{};
  cudaError_t e = s.cuda->cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    (void)s.cuda->cudaGetLastError();
    return InvalidArgument(std::string(buffer_name(a, send)) + " is not memory CUDA knows (" + s.cuda->error_text(e) +
                           "); with a stream, pass device memory");
  }
  if (attr.type == cudaMemoryTypeUnregistered)
    return InvalidArgument(std::string(buffer_name(a, send)) +
                           " is ordinary host memory but a stream was passed; pass NULL as the stream for host buffers, "
                           "or a device buffer");
  if (*device < 0 && attr.type == cudaMemoryTypeDevice) *device = attr.device;
  return Status::Ok();
}

}  // namespace

State::~State() {
  stop_watchdog();
  destroy_nccl();
  if (cuda && cuda->usable()) {
    if (staging_pending) (void)wait_event(staging_free, "the last copy out of the staging buffer");
    if (staging) (void)cuda->cudaFreeHost(staging);
    for (cudaEvent_t ev : {staging_free, staged_in, probe_event})
      if (ev) (void)cuda->cudaEventDestroy(ev);
    for (GroupSlot& slot : group_slots) {
      if (slot.pending) (void)wait_event(slot.free, "a group's copy out of its staging buffer");
      if (slot.host) (void)cuda->cudaFreeHost(slot.host);
      if (slot.free) (void)cuda->cudaEventDestroy(slot.free);
    }
  }
}

std::string State::where() const { return "rank " + std::to_string(comm->rank) + ", comm " + comm->id + ": "; }

Status State::fail(Status st) {
  return st.ok() ? st : fail_communicator(comm, st);
}

Status State::wait_event(cudaEvent_t ev, const char* what) {
  const Deadline deadline = Deadline::after_ms(comm->settings.timeout_ms);
  for (int spins = 0;; ++spins) {
    cudaError_t e = cuda->cudaEventQuery(ev);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) {
      (void)cuda->cudaGetLastError();
      return SystemError(where() + what + " failed on the stream: " + cuda->error_text(e));
    }
    if (comm->aborted.load(std::memory_order_acquire))
      return Aborted(where() + "the communicator was aborted (comm_abort) while waiting for " + what);
    if (deadline.expired())
      return Timeout(where() + what + " did not finish within " + std::to_string(comm->settings.timeout_ms) +
                     " ms (COMM_TIMEOUT_MS): work queued earlier on the stream is stuck");
    if (spins < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status init_forced(comm_t c) {
  std::shared_ptr<State> s;
  COMM_RETURN_IF_ERROR(decide(c, -1, &s));
  c->device = std::move(s);
  return Status::Ok();
}

Status issue(comm_t c, const algo::CollArgs& a, comm_stream_t raw_stream, bool grouped) {
  if (!c->device) {
    // The NCCL communicator is made on the GPU the first device buffer lives on.
    int device = -1;
    std::string cuda_path;
    (void)params::get_string("COMM_CUDA_LIBRARY", &cuda_path);
    const CudaLibrary& cuda = cuda_library(cuda_path);
    for (const void* p : {a.sendbuf, static_cast<const void*>(a.recvbuf)}) {
      cudaPointerAttributes attr{};
      if (device < 0 && p != nullptr && cuda.usable() && cuda.cudaPointerGetAttributes(&attr, p) == cudaSuccess &&
          attr.type == cudaMemoryTypeDevice)
        device = attr.device;
    }
    if (cuda.usable()) (void)cuda.cudaGetLastError();
    std::shared_ptr<State> s;
    COMM_RETURN_IF_ERROR(decide(c, device, &s));
    c->device = std::move(s);
  }
  State& s = *c->device;
  if (s.path == State::Path::kUnavailable) return Unavailable(s.why);
  COMM_RETURN_IF_ERROR(check_usable(c));
  auto stream = static_cast<cudaStream_t>(raw_stream);
  int device = -1;
  COMM_RETURN_IF_ERROR(check_buffer(s, a, a.sendbuf, true, &device));
  COMM_RETURN_IF_ERROR(check_buffer(s, a, a.recvbuf, false, &device));
  // A barrier on a stream: the stream's earlier work, then the host barrier (NCCL has none).
  if (a.kind == transport::CollKind::kBarrier && !grouped) return s.run_staged(a, stream);
  if (s.path == State::Path::kStaged || a.kind == transport::CollKind::kBarrier) {
    if (grouped && a.kind == transport::CollKind::kSendRecv && s.path == State::Path::kStaged)
      return s.run_staged_grouped(a, stream);
    if (grouped)
      return Unavailable(s.where() + "device-buffer collectives and barriers inside comm_group_start/comm_group_end "
                                     "need NCCL, and this communicator stages them through host memory (" + s.why +
                                     "); only send/recv are staged inside a group");
    return s.run_staged(a, stream);
  }
  if (grouped && t_group.nccl == nullptr) {
    t_group.nccl = s.nccl;
    (void)s.nccl->ncclGroupStart();
  }
  if (grouped) {
    bool seen = false;
    for (State* k : t_group.states) seen = seen || k == &s;
    if (!seen) t_group.states.push_back(&s);
  }
  return s.run_nccl(a, stream, grouped);
}

Status group_end() {
  if (t_group.nccl == nullptr) return Status::Ok();
  OpenGroup g = std::move(t_group);
  t_group = OpenGroup{};
  ncclResult_t r = g.nccl->ncclGroupEnd();
  Status first;
  for (State* s : g.states) {
    Status st = s->settle(r, "ncclGroupEnd (comm_group_end)");
    if (!st.ok() && first.ok()) first = s->fail(st);
  }
  return first;
}

bool mem_alloc(comm_t c, size_t bytes, void** ptr, Status* st) {
  State* s = c->device.get();
  if (s == nullptr || s->path != State::Path::kNccl) return false;
  std::lock_guard<std::mutex> nccl_lock(s->watch_mu);  // the watchdog may abort the NCCL communicator
  if (s->nccl_comm == nullptr) {
    *st = check_usable(c);
    if (st->ok()) *st = RemoteError(s->where() + "comm_mem_alloc: the NCCL communicator was aborted after an error");
    return true;
  }
  void* p = nullptr;
  ncclResult_t r = s->nccl->ncclMemAlloc ? s->nccl->ncclMemAlloc(&p, bytes) : ncclSuccess;
  if (s->nccl->ncclMemAlloc == nullptr) {
    cudaError_t e = s->cuda->cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      *st = SystemError(s->where() + "comm_mem_alloc: cudaMalloc(" + std::to_string(bytes) + ") failed: " + s->cuda->error_text(e));
      return true;
    }
  } else if (r != ncclSuccess) {
    *st = SystemError(s->where() + "comm_mem_alloc: ncclMemAlloc(" + std::to_string(bytes) + ") failed: " + s->nccl->error_text(r));
    return true;
  }
  void* handle = nullptr;
  if (s->nccl->ncclCommRegister) {
    r = s->nccl->ncclCommRegister(s->nccl_comm, p, bytes, &handle);
    Status reg = s->settle(r, "ncclCommRegister");
    if (!reg.ok()) {
      COMM_WARN(kInit, "%s; the buffer works unregistered (one copy more inside NCCL)", reg.message().c_str());
      handle = nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(s->mem_mu);
  s->registered[p] = handle;
  *ptr = p;
  *st = Status::Ok();
  return true;
}

bool mem_free(comm_t c, void* ptr, Status* st) {
  State* s = c->device.get();
  if (s == nullptr || s->path != State::Path::kNccl) return false;
  void* handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(s->mem_mu);
    auto it = s->registered.find(ptr);
    if (it == s->registered.end()) return false;
    handle = it->second;
    s->registered.erase(it);
  }
  std::lock_guard<std::mutex> nccl_lock(s->watch_mu);
  if (handle && s->nccl_comm) (void)s->settle(s->nccl->ncclCommDeregister(s->nccl_comm, handle), "ncclCommDeregister");
  if (s->nccl->ncclMemFree)
    (void)s->nccl->ncclMemFree(ptr);
  else
    (void)s->cuda->cudaFree(ptr);
  *st = Status::Ok();
  return true;
}

void release(comm_t c) { c->device.reset(); }

}  // namespace comm::device
