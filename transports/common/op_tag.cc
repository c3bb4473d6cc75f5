// Transport-independent pieces of transport.h: naming a call for error messages, and
// the send-and-receive helper every algorithm uses.
#include <string>

#include "types.h"
#include "transport.h"

namespace comm::transport {

const char* coll_name(CollKind kind) {
  switch (kind) {
    case CollKind::kAllreduce: return "allreduce";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kReduce: return "reduce";
    case CollKind::kAllgather: return "allgather";
    case CollKind::kReduceScatter: return "reduce_scatter";
    case CollKind::kAlltoall: return "alltoall";
    case CollKind::kBarrier: return "barrier";
    case CollKind::kSendRecv: return "send/recv";
    case CollKind::kInternal: return "internal";
  }
  return "unknown collective";
}

bool operator==(const OpTag& a, const OpTag& b) {
  return a.seq == b.seq && a.coll == b.coll && a.dtype == b.dtype && a.op == b.op && a.root == b.root &&
         a.count == b.count;
}

// Tags may come from the wire: every field is printed defensively, never indexed blindly.
std::string describe(const OpTag& tag) {
  std::string text = coll_name(tag.coll);
  if (text == "unknown collective") text = "unknown collective " + std::to_string(static_cast<int>(tag.coll));
  text += " #" + std::to_string(tag.seq);
  if (tag.coll == CollKind::kBarrier) return text;
  text += " (count " + std::to_string(tag.count) + ", ";
  text += dtype_valid(tag.dtype) ? dtype_name(static_cast<comm_dtype_t>(tag.dtype))
                                 : "dtype " + std::to_string(static_cast<int>(tag.dtype));
  bool reduces = tag.coll == CollKind::kAllreduce || tag.coll == CollKind::kReduce ||
                 tag.coll == CollKind::kReduceScatter;
  if (reduces) {
    text += ", ";
    text += op_valid(tag.op) ? op_name(static_cast<comm_op_t>(tag.op)) : "op " + std::to_string(static_cast<int>(tag.op));
  }
  if (tag.coll == CollKind::kBroadcast || tag.coll == CollKind::kReduce) text += ", root " + std::to_string(tag.root);
  text += ")";
  return text;
}

Status sendrecv(Transport& t, int send_peer, const OpTag& tag, const void* sendbuf, size_t send_bytes, int recv_peer,
                void* recvbuf, size_t recv_bytes) {
  // Send first: if posting the receive then fails, the send already queued is one the peer
  // expects anyway, whereas a receive left posted would steal a later message.
  RequestId ids[2];
  COMM_RETURN_IF_ERROR(t.isend(send_peer, tag, sendbuf, send_bytes, &ids[0]));
  COMM_RETURN_IF_ERROR(t.irecv(recv_peer, tag, recvbuf, recv_bytes, &ids[1]));
  return t.wait(ids, 2);
}

}  // namespace comm::transport
