// Device buffers without NCCL: copied into pinned host memory on the caller's stream, run on
// the host transports, copied back on the same stream. The staging buffer is allocated once
// per size class (powers of two) and reused; the host waits for the copy in, the copy out is
// left on the stream (the next call waits for it before reusing the buffer).
#include <cstring>

#include "dtype.h"
#include "log.h"
#include "transports/nccl/state.h"

namespace comm::device {

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
  if (need > staging_bytes) {
    size_t size = size_t{1} << 20;
    while (size < need) size *= 2;
    if (staging) (void)cuda->cudaFreeHost(staging);
    staging = nullptr;
    staging_bytes = 0;
    cudaError_t e = cuda->cudaMallocHost(&staging, size);
    if (e != cudaSuccess)
      return fail(SystemError(where() + "cudaMallocHost(" + std::to_string(size) +
                              ") for the staging buffer failed: " + cuda->error_text(e)));
    std::memset(staging, 0, size);  // first touch now, once
    staging_bytes = size;
    COMM_INFO(kColl, "comm %s rank %d: pinned staging buffer for device buffers is now %zu bytes", comm->id.c_str(),
              comm->rank, size);
  }
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
