// Alltoall in n-1 pairwise steps: at step k send block (rank+k) to rank+k and receive
// block (rank-k) from rank-k, so every rank talks to one peer each way at a time. In place
// (sendbuf == recvbuf), the outgoing blocks are staged in scratch first, since a block
// received early would otherwise overwrite one not yet sent.
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kAlltoall; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const int n = ctx.size, rank = ctx.rank;
  const size_t bb = args.count * elem_size(args);
  char* recv = static_cast<char*>(args.recvbuf);
  const char* send = static_cast<const char*>(args.sendbuf);
  if (args.sendbuf == args.recvbuf) {
    void* p = nullptr;
    COMM_RETURN_IF_ERROR(scratch_get(ctx, static_cast<size_t>(n) * bb, 0, &p));
    std::memcpy(p, args.sendbuf, static_cast<size_t>(n) * bb);
    send = static_cast<const char*>(p);
  } else {
    copy_bytes(recv + static_cast<size_t>(rank) * bb, send + static_cast<size_t>(rank) * bb, bb);
  }
  for (int k = 1; k < n; ++k) {
    const int to = mod(rank + k, n), from = mod(rank - k, n);
    COMM_RETURN_IF_ERROR(exchange(ctx, args, to, send + static_cast<size_t>(to) * bb, bb, from,
                                  recv + static_cast<size_t>(from) * bb, bb));
  }
  return Status::Ok();
}

}  // namespace

Algorithm pairwise_alltoall() { return {"pairwise", CollKind::kAlltoall, can_run, run}; }

}  // namespace comm::algo
