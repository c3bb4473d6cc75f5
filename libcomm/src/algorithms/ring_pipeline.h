// The ring engine behind allreduce, reduce_scatter, allgather and the ring reduce: a
// reduce-scatter phase (each block reduced once, at one owner) followed by an allgather
// phase (the owner's bits copied everywhere), cut into chunks and pipelined so that the
// next chunk's receive is posted before the current one is reduced.
#pragma once

#include "algorithms/common.h"

namespace comm::algo {

struct RingJob {
  BlockLayout layout;
  int rs_steps = 0;  // 0 or size-1
  int ag_steps = 0;  // 0 or size-1
  // Reduce-scatter step s sends block rank + shift - s; the block a rank owns afterwards
  // (the one it holds fully reduced, and sends first in the allgather) is rank + shift - rs_steps.
  int shift = 0;
  const char* in = nullptr;   // contributions, in block layout (reduce-scatter only)
  char* work = nullptr;       // partial sums, and the allgather's buffer, in block layout
  char* owned_out = nullptr;  // final value of the owned block; nullptr: its place in work
};

inline int ring_owned_block(const Context& ctx, const RingJob& job) {
  return mod(ctx.rank + job.shift - job.rs_steps, ctx.size);
}

// Runs the job with args.tag on every message; AVG is divided once, by the owner, when the
// owned block's last reduction lands. Scratch slot 0 holds the receive staging.
Status run_ring(Context& ctx, const CollArgs& args, const RingJob& job);

}  // namespace comm::algo
