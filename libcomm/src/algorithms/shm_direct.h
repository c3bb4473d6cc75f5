// The direct reduce-scatter / all-gather over LocalAccess that the one-host and the
// hierarchical all-reduce share: local rank j reduces slice j of the buffer, reading every
// local peer's input in place (or by process_vm_readv), in local rank order for every element,
// pipelined in chunks; then every rank copies the reduced slices it does not own.
#pragma once

#include "algorithms/common.h"

namespace comm::algo {

class DirectRun {
 public:
  DirectRun(Context& ctx, const CollArgs& args);

  // begin + expose + wait until every local peer has posted the same call.
  Status start();
  // Reduces this rank's slice into work() (pipelined); with publish, peers may copy each
  // chunk as soon as it is done (and avg is divided, by `divide_by` ranks; 0: not at all).
  Status reduce_slice(bool publish, int divide_by);
  // Publishes the whole slice at once (after the hierarchical algorithm's inter-host step).
  void publish_slice();
  // Copies every other local rank's slice into recvbuf as it is published, then finishes the
  // call (no peer reads this rank's buffers any more afterwards).
  Status gather_and_finish();

  char* my_slice() const { return work_ + layout_.off(me_) * esz_; }
  size_t my_len() const { return layout_.len(me_); }

 private:
  // Local rank i's input at element `off` (len elements): in place, or read into staging[k].
  Status operand(int i, size_t off, size_t len, int k, const char** out);
  Status gather_upto(int p, size_t elems);

  Context& ctx_;
  const CollArgs& args_;
  transport::LocalAccess& la_;
  int n_ = 0;
  int me_ = 0;
  size_t esz_ = 0;
  size_t ce_ = 1;  // chunk, elements
  bool interleave_ = true;  // copy peers' chunks while reducing ours (not when ranks outnumber cores)
  BlockLayout layout_;
  char* work_ = nullptr;
  char* staging_[3] = {nullptr, nullptr, nullptr};  // two operands read by copy, partial sums
  size_t* gathered_ = nullptr;  // elements of each local rank's slice copied so far (scratch slot 2)
};

size_t shm_chunk_bytes();

}  // namespace comm::algo
