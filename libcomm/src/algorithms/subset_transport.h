// A view of a transport restricted to some of its ranks, renumbered 0..k-1, so that an
// algorithm written for a whole communicator runs among a subset (the hierarchical
// all-reduce's one inter-host ring per local rank). Requests are the base transport's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "transports/transport.h"

namespace comm::algo {

class SubsetTransport final : public transport::Transport {
 public:
  // ranks[i]: the base rank of subset rank i; `me` is this rank's subset rank.
  SubsetTransport(transport::Transport& base, std::vector<int> ranks, int me, int timeout_ms)
      : Transport(options_for(ranks, me, timeout_ms)), base_(base), ranks_(std::move(ranks)) {}

  const char* name() const override { return base_.name(); }
  Status isend(int peer, const transport::OpTag& tag, const void* buf, size_t bytes, transport::RequestId* id) override {
    COMM_RETURN_IF_ERROR(check(peer));
    return base_.isend(ranks_[static_cast<size_t>(peer)], tag, buf, bytes, id);
  }
  Status irecv(int peer, const transport::OpTag& tag, void* buf, size_t bytes, transport::RequestId* id) override {
    COMM_RETURN_IF_ERROR(check(peer));
    return base_.irecv(ranks_[static_cast<size_t>(peer)], tag, buf, bytes, id);
  }
  Status wait(const transport::RequestId* ids, size_t n) override { return base_.wait(ids, n); }
  Status test(transport::RequestId id, bool* done) override { return base_.test(id, done); }
  Status wait_some(const transport::RequestId* ids, size_t n) override { return base_.wait_some(ids, n); }
  void wake() override { base_.wake(); }
  void notify_peers(const Status& failure) override { base_.notify_peers(failure); }
  void abort() override { base_.abort(); }

 private:
  static transport::Options options_for(const std::vector<int>& ranks, int me, int timeout_ms) {
    transport::Options o;
    o.rank = me;
    o.size = static_cast<int>(ranks.size());
    o.timeout_ms = timeout_ms;
    return o;
  }
  Status check(int peer) const {
    if (peer < 0 || peer >= size())
      return Internal("subset transport: peer " + std::to_string(peer) + " is not in [0, " + std::to_string(size()) + ")");
    return Status::Ok();
  }

  transport::Transport& base_;
  std::vector<int> ranks_;
};

}  // namespace comm::algo
