// Broadcast for large messages: a chain root -> root+1 -> ... cut into chunks, so every
// link carries data at once after a start-up of n-1 chunks. Each rank forwards a chunk as
// soon as it lands, with the next chunk's receive already posted.
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kBroadcast; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const int n = ctx.size;
  const int v = mod(ctx.rank - args.root, n);  // position in the chain
  const int prev = mod(ctx.rank - 1, n);
  const int next = mod(ctx.rank + 1, n);
  const bool forwards = v < n - 1;
  const size_t esz = elem_size(args);
  const size_t ce = chunk_elems(ctx, esz);
  const long nchunks = static_cast<long>((args.count + ce - 1) / ce);
  SendWindow sends(ctx.transport);

  if (v == 0) {
    const char* src = static_cast<const char*>(args.sendbuf);
    for (long c = 0; c < nchunks; ++c) {
      const size_t off = static_cast<size_t>(c) * ce;
      COMM_RETURN_IF_ERROR(sends.post(next, args.tag, src + off * esz, clip(args.count, off, ce) * esz, c));
    }
    // The root's own copy overlaps the sends already in flight.
    if (args.recvbuf != nullptr) copy_bytes(args.recvbuf, args.sendbuf, args.count * esz);
    return sends.retire_all();
  }

  char* dst = static_cast<char*>(args.recvbuf);
  transport::RequestId recv_ids[2];
  auto post_recv = [&](long c) {
    const size_t off = static_cast<size_t>(c) * ce;
    return ctx.transport.irecv(prev, args.tag, dst + off * esz, clip(args.count, off, ce) * esz, &recv_ids[c % 2]);
  };
  COMM_RETURN_IF_ERROR(post_recv(0));
  for (long c = 0; c < nchunks; ++c) {
    if (c + 1 < nchunks) COMM_RETURN_IF_ERROR(post_recv(c + 1));
    COMM_RETURN_IF_ERROR(wait_one(ctx.transport, recv_ids[c % 2]));
    if (forwards) {
      const size_t off = static_cast<size_t>(c) * ce;
      COMM_RETURN_IF_ERROR(sends.post(next, args.tag, dst + off * esz, clip(args.count, off, ce) * esz, c));
    }
  }
  return sends.retire_all();
}

}  // namespace

Algorithm pipelined_chain_broadcast() { return {"pipelined_chain", CollKind::kBroadcast, can_run, run}; }

}  // namespace comm::algo
