// Allgather around a ring: n-1 steps, each forwarding the block received in the step
// before, chunked and pipelined by the ring engine. In place when sendbuf is this rank's
// block of recvbuf.
#include "algorithms/collectives.h"
#include "algorithms/ring_pipeline.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kAllgather; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const size_t block_bytes = args.count * elem_size(args);
  char* recv = static_cast<char*>(args.recvbuf);
  copy_bytes(recv + static_cast<size_t>(ctx.rank) * block_bytes, args.sendbuf, block_bytes);
  RingJob job;
  job.layout = BlockLayout{args.count, ctx.size, true};
  job.ag_steps = ctx.size - 1;
  job.work = recv;
  return run_ring(ctx, args, job);
}

}  // namespace

Algorithm ring_allgather() { return {"ring", CollKind::kAllgather, can_run, run}; }

}  // namespace comm::algo
