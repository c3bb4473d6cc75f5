// Allgather for small messages on a power-of-two number of ranks: log2(n) exchanges with
// partner rank ^ 2^k, each doubling the contiguous run of blocks a rank holds. Other sizes
// say "not me" and the ring runs instead.
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context& ctx, const CollArgs& args) {
  return args.kind == CollKind::kAllgather && ctx.size > 0 && (ctx.size & (ctx.size - 1)) == 0;
}

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  if (!can_run(ctx, args))
    return Internal("recursive_doubling allgather needs a power-of-two number of ranks, not " +
                    std::to_string(ctx.size));

  const size_t block_bytes = args.count * elem_size(args);
  char* recv = static_cast<char*>(args.recvbuf);
  copy_bytes(recv + static_cast<size_t>(ctx.rank) * block_bytes, args.sendbuf, block_bytes);
  for (int mask = 1; mask < ctx.size; mask <<= 1) {
    const int partner = ctx.rank ^ mask;
    const size_t mine = static_cast<size_t>(ctx.rank & ~(mask - 1)) * block_bytes;
    const size_t theirs = static_cast<size_t>(partner & ~(mask - 1)) * block_bytes;
    const size_t bytes = static_cast<size_t>(mask) * block_bytes;
    COMM_RETURN_IF_ERROR(exchange(ctx, args, partner, recv + mine, bytes, partner, recv + theirs, bytes));
  }
  return Status::Ok();
}

}  // namespace

Algorithm recursive_doubling_allgather() { return {"recursive_doubling", CollKind::kAllgather, can_run, run}; }

}  // namespace comm::algo
