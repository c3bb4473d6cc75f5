// All-reduce across hosts with several ranks each: a direct reduce-scatter over shared memory
// inside each host (local rank j owns slice j), an all-reduce of slice j among the j-th ranks
// of every host over the network (one inter-host ring per local rank, so every rank's link
// and core work at once), then a direct all-gather inside each host. Bitwise identical on
// every rank: each host sums in local rank order, the inter-host ring reduces each element
// once and distributes it, and the all-gather copies.
#include <algorithm>

#include "algorithms/collectives.h"
#include "algorithms/shm_direct.h"
#include "algorithms/subset_transport.h"

namespace comm::algo {

namespace {

// Hosts with the same number of ranks, at least two hosts and two ranks per host.
bool regular_layout(const std::vector<int>& host_of, int* hosts, int* per_host) {
  if (host_of.empty()) return false;
  const int h = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<int> count(static_cast<size_t>(h), 0);
  for (int x : host_of) {
    if (x < 0) return false;
    ++count[static_cast<size_t>(x)];
  }
  *hosts = h;
  *per_host = count[0];
  return h >= 2 && count[0] >= 2 && std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; });
}

bool can_run(const Context& ctx, const CollArgs& args) {
  if (args.kind != CollKind::kAllreduce) return false;
  transport::LocalAccess* la = ctx.transport.local();
  int hosts = 0, per_host = 0;
  return la != nullptr && static_cast<int>(la->host_of().size()) == ctx.size &&
         regular_layout(la->host_of(), &hosts, &per_host) && static_cast<int>(la->local_ranks().size()) == per_host;
}

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();
  transport::LocalAccess& la = *ctx.transport.local();
  const std::vector<int>& host_of = la.host_of();
  int hosts = 0, per_host = 0;
  regular_layout(host_of, &hosts, &per_host);

  DirectRun direct(ctx, args);
  COMM_RETURN_IF_ERROR(direct.start());
  COMM_RETURN_IF_ERROR(direct.reduce_slice(false, 0));

  // The j-th rank of every host (j = this rank's local index), ordered by host.
  const int j = la.local_index();
  std::vector<int> ring(static_cast<size_t>(hosts), -1), seen(static_cast<size_t>(hosts), 0);
  for (int r = 0; r < ctx.size; ++r) {
    const auto h = static_cast<size_t>(host_of[static_cast<size_t>(r)]);
    if (seen[h]++ == j) ring[h] = r;
  }
  const int my_host = host_of[static_cast<size_t>(ctx.rank)];
  if (direct.my_len() > 0) {
    SubsetTransport sub(ctx.transport, ring, my_host, 0);
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
  direct.publish_slice();
  return direct.gather_and_finish();
}

}  // namespace

Algorithm hierarchical_allreduce() { return {"hierarchical", CollKind::kAllreduce, can_run, run}; }

}  // namespace comm::algo
