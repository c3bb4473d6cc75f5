#include "algorithms/common.h"

#include <string>

namespace comm::algo {

Status run_trivial(const Context& ctx, const CollArgs& args, bool* done) {
  *done = true;
  if (args.kind == CollKind::kBarrier) {
    *done = ctx.size == 1;
    return Status::Ok();
  }
  if (args.count == 0) return Status::Ok();
  if (ctx.size > 1) {
    *done = false;
    return Status::Ok();
  }
  const size_t bytes = args.count * elem_size(args);
  switch (args.kind) {
    case CollKind::kAllreduce:
    case CollKind::kReduce:
    case CollKind::kReduceScatter:
      copy_bytes(args.recvbuf, args.sendbuf, bytes);
      if (args.op == COMM_AVG) avg_finalize(args.recvbuf, args.count, args.dtype, 1);
      return Status::Ok();
    case CollKind::kBroadcast:
    case CollKind::kAllgather:
    case CollKind::kAlltoall:
      copy_bytes(args.recvbuf, args.sendbuf, bytes);
      return Status::Ok();
    case CollKind::kSendRecv:
      return InvalidArgument("send/recv to peer " + std::to_string(args.peer) +
                             " in a communicator of one rank: there is no peer");
    default:
      return Internal(std::string("no local case for ") + transport::coll_name(args.kind));
  }
}

Status scratch_get(Context& ctx, size_t bytes, int slot, void** out) {
  *out = ctx.scratch.get(bytes, slot);
  if (*out == nullptr)
    return SystemError("cannot allocate " + std::to_string(bytes) + " bytes of staging memory (scratch slot " +
                       std::to_string(slot) + ")");
  return Status::Ok();
}

Status wait_one(transport::Transport& t, transport::RequestId id) { return t.wait(&id, 1); }

Status exchange(Context& ctx, const CollArgs& args, int send_peer, const void* sendbuf, size_t send_bytes,
                int recv_peer, void* recvbuf, size_t recv_bytes) {
  transport::RequestId ids[2];
  size_t n = 0;
  if (recv_bytes > 0) COMM_RETURN_IF_ERROR(ctx.transport.irecv(recv_peer, args.tag, recvbuf, recv_bytes, &ids[n++]));
  if (send_bytes > 0) COMM_RETURN_IF_ERROR(ctx.transport.isend(send_peer, args.tag, sendbuf, send_bytes, &ids[n++]));
  return n == 0 ? Status::Ok() : ctx.transport.wait(ids, n);
}

Status SendWindow::post(int peer, const transport::OpTag& tag, const void* buf, size_t bytes, long idx) {
  if (count_ == depth_) COMM_RETURN_IF_ERROR(retire_oldest());
  int slot = (head_ + count_) % kMax;
  COMM_RETURN_IF_ERROR(t_.isend(peer, tag, buf, bytes, &ids_[slot]));
  idx_[slot] = idx;
  ++count_;
  return Status::Ok();
}

Status SendWindow::has_room(bool* room) {
  while (count_ == depth_) {
    bool done = false;
    COMM_RETURN_IF_ERROR(t_.test(ids_[head_], &done));  // releases the request when done
    if (!done) break;
    head_ = (head_ + 1) % kMax;
    --count_;
  }
  *room = count_ < depth_;
  return Status::Ok();
}

Status SendWindow::retire_oldest() {
  if (count_ == 0) return Status::Ok();
  transport::RequestId id = ids_[head_];
  head_ = (head_ + 1) % kMax;
  --count_;
  return wait_one(t_, id);
}

Status SendWindow::retire_through(long idx) {
  while (count_ > 0 && idx_[head_] <= idx) COMM_RETURN_IF_ERROR(retire_oldest());
  return Status::Ok();
}

}  // namespace comm::algo
