// Broadcast for small messages: a binomial tree rooted at `root`, log2(n) rounds, the whole
// buffer per message (latency, not bandwidth, is what small messages pay).
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kBroadcast; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const int n = ctx.size;
  const int v = mod(ctx.rank - args.root, n);
  const size_t bytes = args.count * elem_size(args);
  const void* src = args.sendbuf;

  // Receive from the parent: the rank that differs in v's lowest set bit.
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      transport::RequestId id;
      COMM_RETURN_IF_ERROR(ctx.transport.irecv(mod(args.root + v - mask, n), args.tag, args.recvbuf, bytes, &id));
      COMM_RETURN_IF_ERROR(wait_one(ctx.transport, id));
      src = args.recvbuf;
      break;
    }
    mask <<= 1;
  }

  // Send to the children, farthest subtree first; at most log2(n) requests in flight.
  transport::RequestId ids[32];
  size_t nids = 0;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n)
      COMM_RETURN_IF_ERROR(ctx.transport.isend(mod(args.root + v + mask, n), args.tag, src, bytes, &ids[nids++]));
  }
  if (v == 0 && args.recvbuf != nullptr) copy_bytes(args.recvbuf, args.sendbuf, bytes);
  return nids == 0 ? Status::Ok() : ctx.transport.wait(ids, nids);
}

}  // namespace

Algorithm binomial_tree_broadcast() { return {"binomial_tree", CollKind::kBroadcast, can_run, run}; }

}  // namespace comm::algo
