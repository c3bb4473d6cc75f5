// Allreduce for small messages: log2(n) exchanges of the whole buffer. Partners combine
// their vectors in rank order (lower rank's operand first), so both compute the same bits
// even where an op is not bitwise commutative (min/max of NaN or signed zeros). With n not
// a power of two, the first 2*extra ranks pair up: the even one hands its data to the odd
// one before the exchanges and gets the finished result back after them.
#include <bit>

#include "algorithms/collectives.h"

namespace comm::algo {

namespace {

bool can_run(const Context&, const CollArgs& args) { return args.kind == CollKind::kAllreduce; }

// The real rank behind index `v` among the power-of-two participants.
int participant_rank(int v, int extra) { return v < extra ? 2 * v + 1 : v + extra; }

Status run(Context& ctx, const CollArgs& args) {
  bool done = false;
  COMM_RETURN_IF_ERROR(run_trivial(ctx, args, &done));
  if (done) return Status::Ok();

  const int n = ctx.size, rank = ctx.rank;
  const size_t bytes = args.count * elem_size(args);
  const ReduceFn fn = reduce_fn(args.dtype, args.op);
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  char* acc = static_cast<char*>(args.recvbuf);
  void* other = nullptr;
  COMM_RETURN_IF_ERROR(scratch_get(ctx, bytes, 0, &other));

  if (rank < 2 * extra && rank % 2 == 0) {
    // Folded out: contribute, then wait for the answer. The send must finish before the
    // receive may land in the same buffer (in place).
    transport::RequestId id;
    COMM_RETURN_IF_ERROR(ctx.transport.isend(rank + 1, args.tag, args.sendbuf, bytes, &id));
    COMM_RETURN_IF_ERROR(wait_one(ctx.transport, id));
    COMM_RETURN_IF_ERROR(ctx.transport.irecv(rank + 1, args.tag, acc, bytes, &id));
    return wait_one(ctx.transport, id);
  }

  int v;
  if (rank < 2 * extra) {
    transport::RequestId id;
    COMM_RETURN_IF_ERROR(ctx.transport.irecv(rank - 1, args.tag, other, bytes, &id));
    COMM_RETURN_IF_ERROR(wait_one(ctx.transport, id));
    fn(acc, other, args.sendbuf, args.count);  // rank - 1's operand first
    v = rank / 2;
  } else {
    copy_bytes(acc, args.sendbuf, bytes);
    v = rank - extra;
  }

  for (int mask = 1; mask < p; mask <<= 1) {
    const int pv = v ^ mask;
    const int partner = participant_rank(pv, extra);
    COMM_RETURN_IF_ERROR(exchange(ctx, args, partner, acc, bytes, partner, other, bytes));
    if (v < pv)
      fn(acc, acc, other, args.count);
    else
      fn(acc, other, acc, args.count);
  }
  if (args.op == COMM_AVG) avg_finalize(acc, args.count, args.dtype, n);

  if (rank < 2 * extra) {
    transport::RequestId id;
    COMM_RETURN_IF_ERROR(ctx.transport.isend(rank - 1, args.tag, acc, bytes, &id));
    return wait_one(ctx.transport, id);
  }
  return Status::Ok();
}

}  // namespace

Algorithm recursive_doubling_allreduce() { return {"recursive_doubling", CollKind::kAllreduce, can_run, run}; }

}  // namespace comm::algo
