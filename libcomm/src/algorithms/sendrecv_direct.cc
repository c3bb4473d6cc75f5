// Point-to-point: one direction per call. The side whose sendbuf is set sends to
// args.peer; the side with only recvbuf set receives from it.
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context& ctx, const CollArgs& args) {
  return args.kind == CollKind::kSendRecv && args.peer >= 0 && args.peer < ctx.size && args.peer != ctx.rank;
}

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  if (!can_run(ctx, args))
    return InvalidArgument("send/recv peer " + std::to_string(args.peer) + " is not another rank of 0.." +
                           std::to_string(ctx.size - 1));

  const size_t bytes = args.count * elem_size(args);
  transport::RequestId id;
  if (args.sendbuf != nullptr)
    COMM_RETURN_IF_ERROR(ctx.transport.isend(args.peer, args.tag, args.sendbuf, bytes, &id));
  else if (args.recvbuf != nullptr)
    COMM_RETURN_IF_ERROR(ctx.transport.irecv(args.peer, args.tag, args.recvbuf, bytes, &id));
  else
    return InvalidArgument("send/recv with neither a send nor a receive buffer");
  return wait_one(ctx.transport, id);
}

}  // namespace

Algorithm direct_sendrecv() { return {"direct", CollKind::kSendRecv, can_run, run}; }

}  // namespace comm::algo
