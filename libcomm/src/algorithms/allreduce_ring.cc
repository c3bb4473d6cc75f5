// Allreduce as a ring reduce-scatter then a ring allgather: bandwidth-optimal (each rank
// sends 2(n-1)/n of the buffer), and every element is reduced once, at its owner, so all
// ranks end with the owner's bits.
#include "algorithms/collectives.h"
#include "algorithms/ring_pipeline.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kAllreduce; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  RingJob job;
  job.layout = BlockLayout{args.count, ctx.size, false};
  job.rs_steps = ctx.size - 1;
  job.ag_steps = ctx.size - 1;
  job.in = static_cast<const char*>(args.sendbuf);
  job.work = static_cast<char*>(args.recvbuf);
  return run_ring(ctx, args, job);
}

}  // namespace

Algorithm ring_allreduce() { return {"ring", CollKind::kAllreduce, can_run, run}; }

}  // namespace comm::algo
