// DirectRun, a helper rather than an algorithm: the direct reduce-scatter / all-gather over
// LocalAccess that the one-host all-reduce (allreduce_shm_direct.cc) and the hierarchical one
// (allreduce_hierarchical.cc) share. Local rank j owns slice j of the buffer; the call runs in
// steps of one chunk per slice. Each step: every rank stages its input chunks of the others'
// slices into its shared ring (unless peers read its input in place: comm_mem_alloc), each
// owner reduces its chunk in local rank order (0, 1, 2, ... for every element, on one rank:
// bitwise identical everywhere) and publishes it, and every rank copies the others' results.
// The rings are a few steps deep and cache-sized, so staged data is read from cache.
#pragma once

#include "algorithms/common.h"

namespace comm::algo {

class DirectRun {
 public:
  DirectRun(Context& ctx, const CollArgs& args);

  // begin + expose + wait until every local peer has posted the same call.
  Status start();
  // One host: reduce-scatter and all-gather interleaved, step by step; avg divided by
  // `divide_by` ranks as each chunk is reduced.
  Status run_one_host(int divide_by);
  // Hierarchical, phase 1: this rank's slice, reduced over the local ranks, lands in its own
  // output (my_slice()); nothing is published as a result yet.
  Status reduce_scatter();
  // Hierarchical, phase 3: publishes my_slice() (after the inter-host step) and copies every
  // other local rank's slice into the output.
  Status share_and_gather();
  // Every local rank's reads are over (call last).
  Status finish();

  char* my_slice() const { return out_ + layout_.off(me_) * esz_; }
  size_t my_len() const { return layout_.len(me_); }

 private:
  size_t len_at(int owner, uint64_t step) const { return clip(layout_.len(owner), step * ce_, ce_); }
  size_t byte_off(int owner, uint64_t step) const { return (layout_.off(owner) + step * ce_) * esz_; }
  Status stage(uint64_t step);
  // Reduces this rank's chunk of `step` into `target`.
  Status reduce(uint64_t step, char* target, int divide_by);
  // Copies this rank's result chunk of `step` from its output into its out-slot (peers read it).
  Status share(uint64_t step);
  Status gather(uint64_t step);
  void copy_out(char* dst, const char* src, size_t bytes) const;

  Context& ctx_;
  const CollArgs& args_;
  transport::LocalAccess& la_;
  int n_ = 0;
  int me_ = 0;
  size_t esz_ = 0;
  size_t ce_ = 1;       // chunk, elements
  uint64_t steps_ = 0;  // chunks of the longest slice
  BlockLayout layout_;
  const char* in_ = nullptr;
  char* out_ = nullptr;
  char* partial_ = nullptr;  // partial sums of more than two ranks (scratch, cache-sized)
  bool stream_out_ = false;  // results into an ordinary output with streaming stores
};

size_t shm_chunk_bytes();

}  // namespace comm::algo
