// Barrier by dissemination: ceil(log2 n) rounds, in round k a one-byte token to rank + 2^k
// and one from rank - 2^k. After the last round every rank has heard, through some chain,
// from every other, whatever n is (no power-of-two folding needed).
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kBarrier; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const char token = 1;
  char received = 0;
  for (int dist = 1; dist < ctx.size; dist <<= 1) {
    COMM_RETURN_IF_ERROR(
        exchange(ctx, args, mod(ctx.rank + dist, ctx.size), &token, 1, mod(ctx.rank - dist, ctx.size), &received, 1));
  }
  return Status::Ok();
}

}  // namespace

Algorithm dissemination_barrier() { return {"dissemination", CollKind::kBarrier, can_run, run}; }

}  // namespace comm::algo
