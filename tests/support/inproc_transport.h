// A test double for transport.h: ranks are threads of one process and a shared fabric holds
// one FIFO of messages per (src, dst) pair. isend copies the bytes and completes at once;
// irecv matches messages in posting order per peer; wait blocks on a condition variable,
// bounded by the timeout. Fast and TSan-friendly, for wide sweeps of the algorithms; the
// real transports have their own tests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "transport.h"

namespace comm::testing {

class InprocFabric {
 public:
  struct Message {
    transport::OpTag tag;
    std::vector<char> data;
  };

  explicit InprocFabric(int size) : size_(size), queues_(static_cast<size_t>(size) * size) {}
  int size() const { return size_; }

  void push(int src, int dst, Message m);
  // The oldest message from src to dst. False when none came before `deadline` or when
  // *stop turned true (checked on every wake-up).
  bool pop(int src, int dst, const Deadline& deadline, const std::atomic<bool>& stop, Message* out);
  bool try_pop(int src, int dst, Message* out);
  // Wakes every waiter, so that one whose transport was aborted notices.
  void wake_all();
  // Messages still queued anywhere (a finished collective leaves none behind).
  size_t pending() const;

 private:
  int size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Message>> queues_;
};

class InprocTransport final : public transport::Transport {
 public:
  InprocTransport(std::shared_ptr<InprocFabric> fabric, transport::Options options);

  const char* name() const override { return "inproc"; }
  Status wait(const transport::RequestId* ids, size_t n) override;
  Status test(transport::RequestId id, bool* done) override;
  void notify_peers(const Status&, uint64_t) override {}
  void abort() override;

  // Requests posted and not yet released by wait/test, now and at the most.
  size_t outstanding() const { return live_; }
  size_t peak_outstanding() const { return peak_; }

 private:
  struct Request {
    bool in_use = false;
    bool is_recv = false;
    bool done = false;
    int peer = -1;
    transport::OpTag tag;
    void* buf = nullptr;
    size_t bytes = 0;
  };

  // transport.h checked the arguments: a send copies and completes, a receive queues.
  Status post_request(const Post& call, transport::RequestId* id) override;
  Status alloc(transport::RequestId* id);
  void release(transport::RequestId id);
  // Completes the oldest posted receive from `peer` with the next message (blocking).
  Status deliver_oldest(int peer, bool block, bool* delivered);
  Status deliver(transport::RequestId id, InprocFabric::Message& m);
  Status fail(Status st);

  std::shared_ptr<InprocFabric> fabric_;
  std::vector<Request> requests_;
  std::vector<transport::RequestId> free_;
  std::vector<std::deque<transport::RequestId>> posted_;  // receives per peer, in posting order
  size_t live_ = 0;
  size_t peak_ = 0;
  Status failed_;
  std::atomic<bool> aborted_{false};
};

}  // namespace comm::testing
