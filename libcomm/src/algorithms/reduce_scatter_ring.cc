// Reduce-scatter around a ring: the first half of the ring allreduce, shifted so that the
// block a rank ends up owning is its own. Partial sums travel through scratch, so the
// caller's sendbuf is only read, in place or not.
#include "algorithms/collectives.h"
#include "algorithms/ring_pipeline.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kReduceScatter; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  RingJob job;
  job.layout = BlockLayout{args.count, ctx.size, true};
  job.rs_steps = ctx.size - 1;
  job.shift = -1;  // owned block = rank - 1 - (n - 1) = rank
  job.in = static_cast<const char*>(args.sendbuf);
  job.owned_out = static_cast<char*>(args.recvbuf);
  if (ctx.size > 2) {
    // Only blocks reduced in one step and forwarded in the next are stored: never this
    // rank's own block (it goes to recvbuf) nor the one it sends first (read from sendbuf).
    void* p = nullptr;
    COMM_RETURN_IF_ERROR(scratch_get(ctx, static_cast<size_t>(ctx.size) * args.count * elem_size(args), 1, &p));
    job.work = static_cast<char*>(p);
  }
  return run_ring(ctx, args, job);
}

}  // namespace

Algorithm ring_reduce_scatter() { return {"ring", CollKind::kReduceScatter, can_run, run}; }

}  // namespace comm::algo
