// C ABI: the collectives, send/recv and their non-blocking variants. Everything is
// validated here, at the edge, before a byte moves (docs/design/core.md, "Validate at the edge").
#include <cstdint>
#include <string>

#include "abi_guard.h"
#include "communicator.h"
#include "dtype.h"
#include "group.h"
#include "device/device.h"

namespace comm {
namespace {

using transport::CollKind;

bool reduces(CollKind k) {
  return k == CollKind::kAllreduce || k == CollKind::kReduce || k == CollKind::kReduceScatter;
}

const char* fn_name(CollKind k, bool nonblocking) {
  switch (k) {
    case CollKind::kAllreduce: return nonblocking ? "comm_iallreduce" : "comm_allreduce";
    case CollKind::kBroadcast: return nonblocking ? "comm_ibroadcast" : "comm_broadcast";
    case CollKind::kReduce: return nonblocking ? "comm_ireduce" : "comm_reduce";
    case CollKind::kAllgather: return nonblocking ? "comm_iallgather" : "comm_allgather";
    case CollKind::kReduceScatter: return nonblocking ? "comm_ireduce_scatter" : "comm_reduce_scatter";
    case CollKind::kAlltoall: return nonblocking ? "comm_ialltoall" : "comm_alltoall";
    case CollKind::kBarrier: return nonblocking ? "comm_ibarrier" : "comm_barrier";
    default: return nonblocking ? "comm_isend/comm_irecv" : "comm_send/comm_recv";
  }
}

// "rank 2, comm_allreduce: " in front of a message, built only when there is one to make: a
// string per call would be an allocation on every collective's path (docs/design/rules.md, "No allocation on the hot path").
struct Where {
  comm_t c;
  const char* fn;
  std::string text() const { return "rank " + std::to_string(c->rank) + ", " + fn + ": "; }
};
std::string operator+(const Where& w, const char* s) { return w.text() + s; }

Status validate(comm_t c, const algo::CollArgs& a, int raw_dtype, int raw_op, const Where& where, bool grouped) {
  if (!dtype_valid(raw_dtype))
    return InvalidArgument(where + "dtype " + std::to_string(raw_dtype) +
                           " is not a comm_dtype_t (valid: 0..9, COMM_FLOAT32..COMM_UINT64)");
  if (reduces(a.kind) && !op_valid(raw_op))
    return InvalidArgument(where + "op " + std::to_string(raw_op) +
                           " is not a comm_op_t (valid: 0..4, COMM_SUM..COMM_AVG)");
  if ((a.kind == CollKind::kBroadcast || a.kind == CollKind::kReduce) && (a.root < 0 || a.root >= c->size))
    return InvalidArgument(where + "root " + std::to_string(a.root) + " is not a rank of this communicator (0.." +
                           std::to_string(c->size - 1) + ")");
  if (a.kind == CollKind::kSendRecv && a.peer == COMM_ANY_SOURCE) {
    if (a.sendbuf != nullptr)
      return InvalidArgument(where + "peer COMM_ANY_SOURCE is for receives; a send names its rank");
    if (grouped)
      return InvalidArgument(where + "a receive from any rank (COMM_ANY_SOURCE) cannot be inside "
                                     "comm_group_start/comm_group_end; issue it outside the group");
    if (a.count == 0)
      return InvalidArgument(where + "a receive of 0 elements from any rank (COMM_ANY_SOURCE) can never tell which "
                                     "rank it matched (a send of 0 elements moves nothing); name the rank");
  } else if (a.kind == CollKind::kSendRecv) {
    if (a.peer < 0 || a.peer >= c->size)
      return InvalidArgument(where + "peer " + std::to_string(a.peer) + " is not a rank of this communicator (0.." +
                             std::to_string(c->size - 1) + ")");
    if (a.peer == c->rank && !grouped)
      return InvalidArgument(where + "peer " + std::to_string(a.peer) +
                             " is this rank; outside comm_group_start/comm_group_end a send to oneself can "
                             "never complete. Put the send and the receive in one group");
  }
  // Total elements a buffer of this call spans, to catch overflow before anything moves.
  size_t span = 1;
  if (a.kind == CollKind::kAllgather || a.kind == CollKind::kReduceScatter || a.kind == CollKind::kAlltoall)
    span = static_cast<size_t>(c->size);
  size_t elems = 0, bytes = 0;
  if (__builtin_mul_overflow(a.count, span, &elems) ||
      __builtin_mul_overflow(elems, dtype_size(a.dtype), &bytes) || bytes > static_cast<size_t>(PTRDIFF_MAX))
    return InvalidArgument(where + "count " + std::to_string(a.count) + " of " + dtype_name(a.dtype) +
                           (span > 1 ? " x " + std::to_string(span) + " ranks" : std::string()) +
                           " overflows the address space; pass the element count, not a byte count");
  if (a.count == 0) return Status::Ok();
  bool need_send = true, need_recv = true;
  switch (a.kind) {
    case CollKind::kBroadcast: need_send = c->rank == a.root; break;
    case CollKind::kReduce: need_recv = c->rank == a.root; break;
    case CollKind::kBarrier: need_send = need_recv = false; break;
    case CollKind::kSendRecv: need_send = a.sendbuf != nullptr || a.recvbuf == nullptr; need_recv = !need_send; break;
    default: break;
  }
  const char* count_hint = "; pass a buffer (NULL is allowed only when count is 0)";
  if (need_send && a.sendbuf == nullptr)
    return InvalidArgument(where + (a.kind == CollKind::kSendRecv ? "buf" : "sendbuf") + std::string(" is NULL with count ") +
                           std::to_string(a.count) + count_hint);
  if (need_recv && a.recvbuf == nullptr)
    return InvalidArgument(where + (a.kind == CollKind::kSendRecv ? "buf" : "recvbuf") + std::string(" is NULL with count ") +
                           std::to_string(a.count) + count_hint);
  return Status::Ok();
}

// The one path every collective entry point takes: validate, then run now (blocking),
// queue (non-blocking) or record (inside a group).
comm_status_t issue(comm_t c, algo::CollArgs a, int raw_dtype, int raw_op, comm_stream_t stream,
                    comm_request_t* req, bool nonblocking) {
  const char* fn = fn_name(a.kind, nonblocking);
  return guarded(fn, [&]() -> Status {
    if (c == nullptr) return InvalidArgument(std::string(fn) + ": comm is NULL; pass a communicator from comm_init");
    const Where where{c, fn};
    if (nonblocking && req == nullptr) return InvalidArgument(where + "the request pointer is NULL");
    if (c->aborted.load(std::memory_order_acquire))
      return Aborted(where + "the communicator was aborted (comm_abort); destroy it and make a new one");
    a.dtype = static_cast<comm_dtype_t>(raw_dtype);
    a.op = reduces(a.kind) ? static_cast<comm_op_t>(raw_op) : COMM_SUM;
    if (!dtype_valid(raw_dtype)) a.dtype = COMM_UINT8;  // keep validate's size arithmetic defined
    const bool grouped = in_group();
    COMM_RETURN_IF_ERROR(validate(c, a, raw_dtype, raw_op, where, grouped && !nonblocking));
    const bool any_source = a.kind == CollKind::kSendRecv && a.peer == COMM_ANY_SOURCE;
    if (any_source && stream != nullptr)
      return InvalidArgument(where + "a receive from any rank (COMM_ANY_SOURCE) takes host buffers (stream NULL); "
                                     "receive device buffers from a named rank");
    // A stream means device buffers: NCCL on that stream, or staged through pinned host memory.
    if (stream != nullptr) return device::issue(c, a, stream, grouped).prefixed_at(c->rank, fn);
    if (nonblocking) return enqueue(c, a, req);
    if (any_source) {  // always through the worker, which orders it among the receives in flight
      comm_request_s* r = nullptr;
      COMM_RETURN_IF_ERROR(enqueue(c, a, &r));
      return wait_request(r);
    }
    if (grouped) {
      COMM_RETURN_IF_ERROR(check_usable(c));
      stamp(c, &a);
      group_add(c, a);
      return Status::Ok();
    }
    return run_blocking(c, a);
  });
}

}  // namespace

// send/recv of zero elements may pass NULL; a non-NULL marker keeps which direction the
// call is (sendbuf set: send), so per-peer sequence numbers stay in step. Never dereferenced.
static char empty_marker;
void* const kEmptyBuffer = &empty_marker;

namespace {

algo::CollArgs make(CollKind kind, const void* sendbuf, void* recvbuf, size_t count) {
  algo::CollArgs a;
  a.kind = kind;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  return a;
}

}  // namespace
}  // namespace comm

using comm::transport::CollKind;

extern "C" {

COMM_API comm_status_t comm_allreduce(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op,
                                      comm_stream_t stream) {
  return comm::issue(c, comm::make(CollKind::kAllreduce, s, r, n), t, op, stream, nullptr, false);
}
COMM_API comm_status_t comm_iallreduce(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op,
                                       comm_request_t* req) {
  return comm::issue(c, comm::make(CollKind::kAllreduce, s, r, n), t, op, nullptr, req, true);
}

COMM_API comm_status_t comm_broadcast(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, int root,
                                      comm_stream_t stream) {
  auto a = comm::make(CollKind::kBroadcast, s, r, n);
  a.root = root;
  return comm::issue(c, a, t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_ibroadcast(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, int root,
                                       comm_request_t* req) {
  auto a = comm::make(CollKind::kBroadcast, s, r, n);
  a.root = root;
  return comm::issue(c, a, t, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_reduce(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op, int root,
                                   comm_stream_t stream) {
  auto a = comm::make(CollKind::kReduce, s, r, n);
  a.root = root;
  return comm::issue(c, a, t, op, stream, nullptr, false);
}
COMM_API comm_status_t comm_ireduce(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op, int root,
                                    comm_request_t* req) {
  auto a = comm::make(CollKind::kReduce, s, r, n);
  a.root = root;
  return comm::issue(c, a, t, op, nullptr, req, true);
}

COMM_API comm_status_t comm_allgather(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t,
                                      comm_stream_t stream) {
  return comm::issue(c, comm::make(CollKind::kAllgather, s, r, n), t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_iallgather(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t,
                                       comm_request_t* req) {
  return comm::issue(c, comm::make(CollKind::kAllgather, s, r, n), t, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_reduce_scatter(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op,
                                           comm_stream_t stream) {
  return comm::issue(c, comm::make(CollKind::kReduceScatter, s, r, n), t, op, stream, nullptr, false);
}
COMM_API comm_status_t comm_ireduce_scatter(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t, comm_op_t op,
                                            comm_request_t* req) {
  return comm::issue(c, comm::make(CollKind::kReduceScatter, s, r, n), t, op, nullptr, req, true);
}

COMM_API comm_status_t comm_alltoall(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t,
                                     comm_stream_t stream) {
  return comm::issue(c, comm::make(CollKind::kAlltoall, s, r, n), t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_ialltoall(comm_t c, const void* s, void* r, size_t n, comm_dtype_t t,
                                      comm_request_t* req) {
  return comm::issue(c, comm::make(CollKind::kAlltoall, s, r, n), t, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_barrier(comm_t c, comm_stream_t stream) {
  return comm::issue(c, comm::make(CollKind::kBarrier, nullptr, nullptr, 0), COMM_UINT8, COMM_SUM, stream, nullptr,
                     false);
}
COMM_API comm_status_t comm_ibarrier(comm_t c, comm_request_t* req) {
  return comm::issue(c, comm::make(CollKind::kBarrier, nullptr, nullptr, 0), COMM_UINT8, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_send(comm_t c, const void* buf, size_t n, comm_dtype_t t, int peer, comm_stream_t stream) {
  auto a = comm::make(CollKind::kSendRecv, buf, nullptr, n);
  a.peer = peer;
  if (buf == nullptr && n == 0) a.sendbuf = comm::kEmptyBuffer;  // keeps the direction; nothing is read
  return comm::issue(c, a, t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_isend(comm_t c, const void* buf, size_t n, comm_dtype_t t, int peer, comm_request_t* req) {
  auto a = comm::make(CollKind::kSendRecv, buf, nullptr, n);
  a.peer = peer;
  if (buf == nullptr && n == 0) a.sendbuf = comm::kEmptyBuffer;
  return comm::issue(c, a, t, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_recv(comm_t c, void* buf, size_t n, comm_dtype_t t, int peer, comm_stream_t stream) {
  auto a = comm::make(CollKind::kSendRecv, nullptr, buf, n);
  a.peer = peer;
  if (buf == nullptr && n == 0) a.recvbuf = comm::kEmptyBuffer;
  return comm::issue(c, a, t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_irecv(comm_t c, void* buf, size_t n, comm_dtype_t t, int peer, comm_request_t* req) {
  auto a = comm::make(CollKind::kSendRecv, nullptr, buf, n);
  a.peer = peer;
  if (buf == nullptr && n == 0) a.recvbuf = comm::kEmptyBuffer;
  return comm::issue(c, a, t, COMM_SUM, nullptr, req, true);
}

COMM_API comm_status_t comm_recv_any(comm_t c, void* buf, size_t n, comm_dtype_t t, int* source,
                                     comm_stream_t stream) {
  if (source != nullptr) *source = COMM_ANY_SOURCE;  // until a message matched
  auto a = comm::make(CollKind::kSendRecv, nullptr, buf, n);
  a.peer = COMM_ANY_SOURCE;
  a.source = source;
  return comm::issue(c, a, t, COMM_SUM, stream, nullptr, false);
}
COMM_API comm_status_t comm_irecv_any(comm_t c, void* buf, size_t n, comm_dtype_t t, int* source,
                                      comm_request_t* req) {
  if (source != nullptr) *source = COMM_ANY_SOURCE;
  auto a = comm::make(CollKind::kSendRecv, nullptr, buf, n);
  a.peer = COMM_ANY_SOURCE;
  a.source = source;
  return comm::issue(c, a, t, COMM_SUM, nullptr, req, true);
}

}  // extern "C"
