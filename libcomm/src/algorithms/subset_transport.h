// A view of a transport restricted to some of its ranks, renumbered 0..k-1, so that an
// algorithm written for a whole communicator runs among a subset (the hierarchical
// all-reduce's one inter-host ring per local rank). Requests are the base transport's.
// Built per call on the stack: it copies nothing and allocates nothing.
#pragma once

#include <string>

#include "transport.h"

namespace comm::algo {

class SubsetTransport final : public transport::Transport {
 public:
  // ranks[i] (i < count): the base rank of subset rank i; `me` is this rank's subset rank.
  SubsetTransport(transport::Transport& base, const int* ranks, int count, int me)
      : Transport(options_for(count, me)), base_(base), ranks_(ranks) {}

  const char* name() const override { return base_.name(); }
  Status wait(const transport::RequestId* ids, size_t n) override { return base_.wait(ids, n); }
  Status test(transport::RequestId id, bool* done) override { return base_.test(id, done); }
  Status wait_some(const transport::RequestId* ids, size_t n) override { return base_.wait_some(ids, n); }
  void wake() override { base_.wake(); }
  void notify_peers(const Status& failure, uint64_t order) override { base_.notify_peers(failure, order); }
  void abort() override { base_.abort(); }

 private:
  static transport::Options options_for(int count, int me) {
    transport::Options o;
    o.rank = me;
    o.size = count;
    return o;
  }
  // transport.h checked `call.peer` against the subset; the base checks its own rank.
  Status post_request(const Post& call, transport::RequestId* id) override {
    const int peer = ranks_[call.peer];
    return call.is_send ? base_.isend(peer, call.tag, call.buf, call.bytes, id)
                        : base_.irecv(peer, call.tag, call.buf, call.bytes, id);
  }

  transport::Transport& base_;
  const int* ranks_;
};

}  // namespace comm::algo
