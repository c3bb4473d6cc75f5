// Reduce for large messages: the ring reduce-scatter of the allreduce, then every owner
// sends its finished block straight to the root. Each rank sends about (n-1)/n of the
// buffer plus its block, against the whole buffer per tree level for a binomial tree.
#include "algorithms/collectives.h"
#include "algorithms/ring_pipeline.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kReduce; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const size_t esz = elem_size(args);
  const bool is_root = ctx.rank == args.root;
  RingJob job;
  job.layout = BlockLayout{args.count, ctx.size, false};
  job.rs_steps = ctx.size - 1;
  job.in = static_cast<const char*>(args.sendbuf);
  if (is_root) {
    job.work = static_cast<char*>(args.recvbuf);
  } else {
    // A non-root's recvbuf is ignored (may be NULL): its partial sums live in scratch.
    void* p = nullptr;
    COMM_RETURN_IF_ERROR(scratch_get(ctx, args.count * esz, 1, &p));
    job.work = static_cast<char*>(p);
  }
  COMM_RETURN_IF_ERROR(run_ring(ctx, args, job));

  if (!is_root) {
    const int b = ring_owned_block(ctx, job);
    const size_t len = job.layout.len(b);
    if (len == 0) return Status::Ok();
    transport::RequestId id;
    COMM_RETURN_IF_ERROR(ctx.transport.isend(args.root, args.tag, job.work + job.layout.off(b) * esz, len * esz, &id));
    return wait_one(ctx.transport, id);
  }

  // The root already holds its own block in place; the others arrive in one message each,
  // at most two receives in flight.
  transport::RequestId ids[2];
  bool pending[2] = {false, false};
  int slot = 0;
  for (int peer = 0; peer < ctx.size; ++peer) {
    if (peer == ctx.rank) continue;
    const int b = mod(peer + job.shift - job.rs_steps, ctx.size);
    const size_t len = job.layout.len(b);
    if (len == 0) continue;
    if (pending[slot]) COMM_RETURN_IF_ERROR(wait_one(ctx.transport, ids[slot]));
    COMM_RETURN_IF_ERROR(
        ctx.transport.irecv(peer, args.tag, job.work + job.layout.off(b) * esz, len * esz, &ids[slot]));
    pending[slot] = true;
    slot ^= 1;
  }
  for (int i = 0; i < 2; ++i)
    if (pending[i]) COMM_RETURN_IF_ERROR(wait_one(ctx.transport, ids[i]));
  return Status::Ok();
}

}  // namespace

Algorithm ring_reduce() { return {"ring", CollKind::kReduce, can_run, run}; }

}  // namespace comm::algo
