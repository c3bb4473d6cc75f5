// All-reduce of large messages among the ranks of one host: a direct reduce-scatter (each
// rank reduces its slice reading every peer's input where it lies) and all-gather (each rank
// copies the others' reduced slices), pipelined in chunks. Each element is reduced once, in
// rank order, by one rank: bitwise identical everywhere. Buffers from comm_mem_alloc are read
// in place; ordinary ones go through cache-sized shared staging rings (copy in, copy out),
// which measured faster than process_vm_readv here: pinning the peer's pages on every call
// cost more than a copy that stays in cache.
#include "algorithms/collectives.h"
#include "algorithms/direct_run.h"

namespace comm::algo {

namespace {

bool can_run(const Context& ctx, const CollArgs& args) {
  if (args.kind != CollKind::kAllreduce) return false;
  transport::LocalAccess* la = ctx.transport.local();
  return la != nullptr && static_cast<int>(la->local_ranks().size()) == ctx.size;
}

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  DirectRun direct(ctx, args);
  COMM_RETURN_IF_ERROR(direct.start());
  COMM_RETURN_IF_ERROR(direct.run_one_host(ctx.size));
  return direct.finish();
}

}  // namespace

Algorithm shm_direct_allreduce() { return {"shm_direct", CollKind::kAllreduce, can_run, run}; }

}  // namespace comm::algo
