// Reduce for small messages: a binomial tree towards `root`, chunked so staging stays
// small. Each node folds its children in a fixed order (nearest subtree first, its own
// operand leftmost), so the root's result is the same on every run. Double-buffered: the
// next chunk's receives are posted before the current chunk is reduced.
#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kReduce; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const int n = ctx.size;
  const int v = mod(ctx.rank - args.root, n);
  int children[32];
  int nchild = 0;
  int parent = -1;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      parent = mod(args.root + v - mask, n);
      break;
    }
    if (v + mask < n) children[nchild++] = mod(args.root + v + mask, n);
  }

  const size_t esz = elem_size(args);
  const size_t ce = chunk_elems(ctx, esz);
  const size_t chunk_bytes = ce * esz;
  const long nchunks = static_cast<long>((args.count + ce - 1) / ce);
  const ReduceFn fn = reduce_fn(args.dtype, args.op);
  const char* own = static_cast<const char*>(args.sendbuf);

  char* staging = nullptr;  // [parity][child] chunks
  char* acc_buf = nullptr;  // [parity] chunks, for inner nodes other than the root
  if (nchild > 0) {
    void* p = nullptr;
    COMM_RETURN_IF_ERROR(scratch_get(ctx, 2 * static_cast<size_t>(nchild) * chunk_bytes, 0, &p));
    staging = static_cast<char*>(p);
    if (parent >= 0) {
      COMM_RETURN_IF_ERROR(scratch_get(ctx, 2 * chunk_bytes, 1, &p));
      acc_buf = static_cast<char*>(p);
    }
  }

  transport::RequestId recv_ids[2][32];
  transport::RequestId send_ids[2];
  bool send_pending[2] = {false, false};
  auto post_recvs = [&](long c) -> Status {
    const size_t len = clip(args.count, static_cast<size_t>(c) * ce, ce);
    for (int i = 0; i < nchild; ++i)
      COMM_RETURN_IF_ERROR(ctx.transport.irecv(children[i], args.tag, staging + ((c % 2) * nchild + i) * chunk_bytes,
                                               len * esz, &recv_ids[c % 2][i]));
    return Status::Ok();
  };

  if (nchild > 0) COMM_RETURN_IF_ERROR(post_recvs(0));
  for (long c = 0; c < nchunks; ++c) {
    const size_t off = static_cast<size_t>(c) * ce;
    const size_t len = clip(args.count, off, ce);
    const int par = static_cast<int>(c % 2);
    const char* mine = own + off * esz;
    const char* result = mine;  // a leaf forwards its own operand untouched
    if (nchild > 0) {
      if (c + 1 < nchunks) COMM_RETURN_IF_ERROR(post_recvs(c + 1));
      char* acc;
      if (parent < 0) {
        acc = static_cast<char*>(args.recvbuf) + off * esz;
      } else {
        if (send_pending[par]) COMM_RETURN_IF_ERROR(wait_one(ctx.transport, send_ids[par]));
        send_pending[par] = false;
        acc = acc_buf + par * chunk_bytes;
      }
      for (int i = 0; i < nchild; ++i) {
        COMM_RETURN_IF_ERROR(wait_one(ctx.transport, recv_ids[par][i]));
        fn(acc, i == 0 ? mine : acc, staging + (par * nchild + i) * chunk_bytes, len);
      }
      if (parent < 0 && args.op == COMM_AVG) avg_finalize(acc, len, args.dtype, n);
      result = acc;
    }
    if (parent >= 0) {
      if (send_pending[par]) COMM_RETURN_IF_ERROR(wait_one(ctx.transport, send_ids[par]));
      COMM_RETURN_IF_ERROR(ctx.transport.isend(parent, args.tag, result, len * esz, &send_ids[par]));
      send_pending[par] = true;
    }
  }
  for (int par = 0; par < 2; ++par)
    if (send_pending[par]) COMM_RETURN_IF_ERROR(wait_one(ctx.transport, send_ids[par]));
  return Status::Ok();
}

}  // namespace

Algorithm binomial_tree_reduce() { return {"binomial_tree", CollKind::kReduce, can_run, run}; }

}  // namespace comm::algo
