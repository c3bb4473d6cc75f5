// All-reduce across hosts with several ranks each: a direct reduce-scatter over shared memory
// inside each host (local rank j owns slice j), an all-reduce of slice j among the j-th ranks
// of every host over the network (one inter-host ring per local rank, so every rank's link
// and core work at once), then a direct all-gather inside each host. Bitwise identical on
// every rank: each host sums in local rank order, the inter-host ring reduces each element
// once and distributes it, and the all-gather copies.
#include <algorithm>

#include "algorithms/collectives.h"
#include "algorithms/direct_run.h"
#include "algorithms/subset_transport.h"

namespace comm::algo {

namespace {

// Hosts with the same number of ranks, at least two hosts and two ranks per host.
bool can_run(const Context& ctx, const CollArgs& args) {
  if (args.kind != CollKind::kAllreduce) return false;
  transport::LocalAccess* la = ctx.transport.local();
  return la != nullptr && static_cast<int>(la->host_of().size()) == ctx.size && la->hosts() >= 2 &&
         la->ranks_per_host() >= 2 && static_cast<int>(la->local_ranks().size()) == la->ranks_per_host();
}

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  transport::LocalAccess& la = *ctx.transport.local();
  const std::vector<int>& host_of = la.host_of();
  const int hosts = la.hosts();

  DirectRun direct(ctx, args);
  COMM_RETURN_IF_ERROR(direct.start());
  COMM_RETURN_IF_ERROR(direct.reduce_scatter());

  // The j-th rank of every host (j = this rank's local index), ordered by host; the list and
  // the counts live in scratch slot 3 (no allocation per call).
  const int j = la.local_index();
  void* mem = nullptr;
  COMM_RETURN_IF_ERROR(scratch_get(ctx, 2 * static_cast<size_t>(hosts) * sizeof(int), 3, &mem));
  int* ring = static_cast<int*>(mem);
  int* seen = ring + hosts;
  std::fill(seen, seen + hosts, 0);
  for (int r = 0; r < ctx.size; ++r) {
    const int h = host_of[static_cast<size_t>(r)];
    if (seen[h]++ == j) ring[h] = r;
  }
  const int my_host = host_of[static_cast<size_t>(ctx.rank)];
  if (direct.my_len() > 0) {
    SubsetTransport sub(ctx.transport, ring, hosts, my_host);
    Context sub_ctx{sub, my_host, hosts, ctx.scratch, ctx.chunk_bytes};
    CollArgs slice = args;  // the same tag: peers check it
    slice.sendbuf = slice.recvbuf = direct.my_slice();
    slice.count = direct.my_len();
    slice.op = args.op == COMM_AVG ? COMM_SUM : args.op;  // avg divides once, by every rank
    const Algorithm inter = slice.count * elem_size(args) <= ctx.chunk_bytes ? recursive_doubling_allreduce()
                                                                              : ring_allreduce();
    COMM_RETURN_IF_ERROR(inter.run(sub_ctx, slice));
    if (args.op == COMM_AVG) avg_finalize(direct.my_slice(), direct.my_len(), args.dtype, ctx.size);
  }
  COMM_RETURN_IF_ERROR(direct.share_and_gather());
  return direct.finish();
}

}  // namespace

Algorithm hierarchical_allreduce() { return {"hierarchical", CollKind::kAllreduce, can_run, run}; }

}  // namespace comm::algo
