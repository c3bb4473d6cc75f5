// Device buffers without NCCL: copied into pinned host memory on the caller's stream, run on
// the host transports, copied back on the same stream. The staging buffer is allocated once
// per size class (powers of two) and reused; the host waits for the copy in, the copy out is
// left on the stream (the next call waits for it before reusing the buffer).
#include <cstring>

#include "dtype.h"
#include "group.h"
#include "log.h"
#include "device/state.h"

namespace comm::device {

namespace {

// Staged receives of the groups being built on this thread, copied to the device at the end.
struct PendingCopy {
  State* state;
  size_t slot;
  void* dst;
  size_t bytes;
  cudaStream_t stream;
};
thread_local std::vector<PendingCopy> t_pending;
thread_local std::vector<State*> t_grouped;

}  // namespace

Status State::pinned(void** p, size_t* have, size_t need) {
  if (need <= *have) return Status::Ok();
  size_t size = size_t{1} << 20;
  while (size < need) size *= 2;
  if (*p) (void)cuda->cudaFreeHost(*p);
  *p = nullptr;
  *have = 0;
  cudaError_t e = cuda->cudaMallocHost(p, size);
  if (e != cudaSuccess)
    return SystemError(where() + "cudaMallocHost(" + std::to_string(size) + ") for staging failed: " + cuda->error_text(e));
  std::memset(*p, 0, size);  // first touch now, once
  *have = size;
  COMM_INFO(kColl, "comm %s rank %d: a pinned staging buffer for device buffers is now %zu bytes", comm->id.c_str(),
            comm->rank, size);
  return Status::Ok();
}

// A send or receive inside comm_group_start/end: the send's data is copied out now, the host
// call joins the group, a receive's data goes back to the device when the group has run.
Status State::run_staged_grouped(const algo::CollArgs& a, cudaStream_t stream) {
  bool seen = false;
  for (State* s : t_grouped) seen = seen || s == this;
  if (!seen) {
    t_grouped.push_back(this);
    group_used = 0;
  }
  if (group_used == group_slots.size()) group_slots.emplace_back();
  const size_t index = group_used++;
  GroupSlot& slot = group_slots[index];
  if (slot.pending) {
    COMM_RETURN_IF_ERROR(wait_event(slot.free, "an earlier group's copy out of its staging buffer"));
    slot.pending = false;
  }
  if (slot.free == nullptr && cuda->cudaEventCreateWithFlags(&slot.free, cudaEventDisableTiming) != cudaSuccess)
    return SystemError(where() + "cudaEventCreate failed");
  const size_t bytes = a.count * dtype_size(a.dtype);
  COMM_RETURN_IF_ERROR(pinned(&slot.host, &slot.bytes, bytes));
  algo::CollArgs h = a;
  if (a.sendbuf != nullptr) {
    if (bytes) {
      h.sendbuf = slot.host;
      if (cudaError_t e = cuda->cudaMemcpyAsync(slot.host, a.sendbuf, bytes, cudaMemcpyDeviceToHost, stream); e != cudaSuccess)
        return SystemError(where() + "copy into the staging buffer failed: " + cuda->error_text(e));
      if (cuda->cudaEventRecord(slot.free, stream) != cudaSuccess) return SystemError(where() + "cudaEventRecord failed");
      COMM_RETURN_IF_ERROR(wait_event(slot.free, "the stream's work before the send and its copy to the host"));
    }
  } else if (bytes) {
    h.recvbuf = slot.host;
    t_pending.push_back({this, index, a.recvbuf, bytes, stream});
  }
  COMM_RETURN_IF_ERROR(check_usable(comm));
  stamp(comm, &h);
  group_add(comm, h);
  return Status::Ok();
}

Status group_finish(bool ok) {
  std::vector<PendingCopy> pending = std::move(t_pending);
  t_pending.clear();
  t_grouped.clear();
  Status first;
  for (const auto& p : pending) {
    if (!ok) break;  // the host calls failed: the device buffers keep what they had
    State& s = *p.state;
    State::GroupSlot& slot = s.group_slots[p.slot];
    cudaError_t e = s.cuda->cudaMemcpyAsync(p.dst, slot.host, p.bytes, cudaMemcpyHostToDevice, p.stream);
    if (e == cudaSuccess) e = s.cuda->cudaEventRecord(slot.free, p.stream);
    if (e != cudaSuccess) {
      if (first.ok()) first = s.fail(SystemError(s.where() + "copy out of the staging buffer failed: " + s.cuda->error_text(e)));
      continue;
    }
    slot.pending = true;
  }
  return first;
}

Status State::run_staged(const algo::CollArgs& a, cudaStream_t stream) {
  using transport::CollKind;
  const size_t esz = dtype_size(a.dtype), n = static_cast<size_t>(comm->size), bytes = a.count * esz;
  const bool root = comm->rank == a.root;
  size_t send_bytes = 0, recv_bytes = 0;
  switch (a.kind) {
    case CollKind::kAllreduce: send_bytes = recv_bytes = bytes; break;
    case CollKind::kBroadcast: send_bytes = root ? bytes : 0; recv_bytes = bytes; break;
    case CollKind::kReduce: send_bytes = bytes; recv_bytes = root ? bytes : 0; break;
    case CollKind::kAllgather: send_bytes = bytes; recv_bytes = n * bytes; break;
    case CollKind::kReduceScatter: send_bytes = n * bytes; recv_bytes = bytes; break;
    case CollKind::kAlltoall: send_bytes = recv_bytes = n * bytes; break;
    case CollKind::kSendRecv: (a.sendbuf != nullptr ? send_bytes : recv_bytes) = bytes; break;
    default: break;  // barrier: no data, only the stream's earlier work
  }
  if (a.sendbuf == nullptr) send_bytes = 0;
  if (a.recvbuf == nullptr) recv_bytes = 0;
  const size_t recv_offset = (send_bytes + 255) / 256 * 256;
  const size_t need = recv_offset + recv_bytes;
  if (staging_pending) {
    COMM_RETURN_IF_ERROR(fail(wait_event(staging_free, "the previous call's copy out of the staging buffer")));
    staging_pending = false;
  }
  if (Status st = pinned(&staging, &staging_bytes, need); !st.ok()) return fail(st);
  for (cudaEvent_t* ev : {&staging_free, &staged_in})
    if (*ev == nullptr && cuda->cudaEventCreateWithFlags(ev, cudaEventDisableTiming) != cudaSuccess)
      return SystemError(where() + "cudaEventCreate failed");
  char* host = static_cast<char*>(staging);
  algo::CollArgs h = a;
  if (send_bytes) h.sendbuf = host;
  if (recv_bytes) h.recvbuf = host + recv_offset;
  if (send_bytes) {
    cudaError_t e = cuda->cudaMemcpyAsync(host, a.sendbuf, send_bytes, cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) return fail(SystemError(where() + "copy into the staging buffer failed: " + cuda->error_text(e)));
  }
  // The host reads the data (and peers may be told it is ready) only once the stream got there.
  if (cuda->cudaEventRecord(staged_in, stream) != cudaSuccess)
    return fail(SystemError(where() + "cudaEventRecord on the caller's stream failed"));
  COMM_RETURN_IF_ERROR(fail(wait_event(staged_in, "the stream's work before the call and the copy into the staging buffer")));
  COMM_RETURN_IF_ERROR(run_blocking(comm, h));
  if (recv_bytes) {
    cudaError_t e = cuda->cudaMemcpyAsync(a.recvbuf, host + recv_offset, recv_bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return fail(SystemError(where() + "copy out of the staging buffer failed: " + cuda->error_text(e)));
    if (cuda->cudaEventRecord(staging_free, stream) != cudaSuccess)
      return fail(SystemError(where() + "cudaEventRecord on the caller's stream failed"));
    staging_pending = true;
  }
  return Status::Ok();
}

}  // namespace comm::device
