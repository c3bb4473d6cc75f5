#include "support/inproc_transport.h"

#include <cstring>
#include <string>

namespace comm::testing {

void InprocFabric::push(int src, int dst, Message m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_[static_cast<size_t>(src) * size_ + dst].push_back(std::move(m));
  }
  cv_.notify_all();
}

bool InprocFabric::pop(int src, int dst, const Deadline& deadline, const std::atomic<bool>& stop, Message* out) {
  std::unique_lock<std::mutex> lock(mu_);
  auto& q = queues_[static_cast<size_t>(src) * size_ + dst];
  while (q.empty()) {
    if (stop.load() || deadline.expired()) return false;
    cv_.wait_until(lock, deadline.at());
  }
  *out = std::move(q.front());
  q.pop_front();
  return true;
}

bool InprocFabric::try_pop(int src, int dst, Message* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& q = queues_[static_cast<size_t>(src) * size_ + dst];
  if (q.empty()) return false;
  *out = std::move(q.front());
  q.pop_front();
  return true;
}

void InprocFabric::wake_all() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

size_t InprocFabric::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& q : queues_) n += q.size();
  return n;
}

InprocTransport::InprocTransport(std::shared_ptr<InprocFabric> fabric, transport::Options options)
    : Transport(std::move(options)), fabric_(std::move(fabric)), posted_(static_cast<size_t>(options_.size)) {
  requests_.reserve(64);
}

Status InprocTransport::alloc(transport::RequestId* id) {
  if (free_.empty()) {
    requests_.emplace_back();
    free_.push_back(static_cast<transport::RequestId>(requests_.size() - 1));
  }
  *id = free_.back();
  free_.pop_back();
  requests_[*id] = Request{};
  requests_[*id].in_use = true;
  ++live_;
  if (live_ > peak_) peak_ = live_;
  return Status::Ok();
}

void InprocTransport::release(transport::RequestId id) {
  requests_[id].in_use = false;
  free_.push_back(id);
  --live_;
}

Status InprocTransport::fail(Status st) {
  if (failed_.ok()) failed_ = st;
  return failed_;
}

Status InprocTransport::post_request(const Post& call, transport::RequestId* id) {
  if (aborted_.load()) return Aborted("inproc: transport aborted");
  if (!failed_.ok()) return failed_;
  const auto [is_send, peer, tag, buf, bytes] = call;
  COMM_RETURN_IF_ERROR(alloc(id));
  if (!is_send) {
    Request& r = requests_[*id];
    r.is_recv = true;
    r.peer = peer;
    r.tag = tag;
    r.buf = buf;
    r.bytes = bytes;
    posted_[peer].push_back(*id);
    return Status::Ok();
  }
  InprocFabric::Message m;
  m.tag = tag;
  m.data.resize(bytes);
  if (bytes > 0) std::memcpy(m.data.data(), buf, bytes);
  fabric_->push(rank(), peer, std::move(m));
  requests_[*id].done = true;
  return Status::Ok();
}

Status InprocTransport::deliver(transport::RequestId id, InprocFabric::Message& m) {
  Request& r = requests_[id];
  if (!(m.tag == r.tag))
    return fail(InvalidUsage("rank " + std::to_string(rank()) + " posted " + transport::describe(r.tag) + " but rank " +
                             std::to_string(r.peer) + " sent " + transport::describe(m.tag)));
  if (m.data.size() != r.bytes)
    return fail(InvalidUsage("rank " + std::to_string(rank()) + " expected " + std::to_string(r.bytes) +
                             " bytes from rank " + std::to_string(r.peer) + " for " + transport::describe(r.tag) +
                             " but got " + std::to_string(m.data.size())));
  if (r.bytes > 0) std::memcpy(r.buf, m.data.data(), r.bytes);
  r.done = true;
  return Status::Ok();
}

Status InprocTransport::deliver_oldest(int peer, bool block, bool* delivered) {
  *delivered = false;
  auto& q = posted_[peer];
  if (q.empty()) return Internal("inproc: no receive posted from rank " + std::to_string(peer));
  InprocFabric::Message m;
  if (block) {
    const auto deadline = Deadline::after_ms(options_.timeout_ms);
    if (!fabric_->pop(peer, rank(), deadline, aborted_, &m)) {
      if (aborted_.load()) return fail(Aborted("inproc: transport aborted"));
      return fail(Timeout("rank " + std::to_string(rank()) + " waited " + std::to_string(options_.timeout_ms) +
                          " ms for rank " + std::to_string(peer) + " (" +
                          transport::describe(requests_[q.front()].tag) + ")"));
    }
  } else if (!fabric_->try_pop(peer, rank(), &m)) {
    return Status::Ok();
  }
  const transport::RequestId id = q.front();
  q.pop_front();
  COMM_RETURN_IF_ERROR(deliver(id, m));
  *delivered = true;
  return Status::Ok();
}

Status InprocTransport::wait(const transport::RequestId* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= requests_.size() || !requests_[ids[i]].in_use)
      return fail(Internal("inproc: wait on unknown request " + std::to_string(ids[i])));
  }
  for (size_t i = 0; i < n; ++i) {
    if (aborted_.load()) return fail(Aborted("inproc: transport aborted"));
    if (!failed_.ok()) return failed_;
    Request& r = requests_[ids[i]];
    bool delivered = false;
    while (!r.done) COMM_RETURN_IF_ERROR(deliver_oldest(r.peer, true, &delivered));
  }
  for (size_t i = 0; i < n; ++i) release(ids[i]);
  return Status::Ok();
}

Status InprocTransport::test(transport::RequestId id, bool* done) {
  *done = false;
  if (aborted_.load()) return fail(Aborted("inproc: transport aborted"));
  if (!failed_.ok()) return failed_;
  if (id >= requests_.size() || !requests_[id].in_use)
    return fail(Internal("inproc: test on unknown request " + std::to_string(id)));
  Request& r = requests_[id];
  bool delivered = true;
  while (!r.done && delivered) COMM_RETURN_IF_ERROR(deliver_oldest(r.peer, false, &delivered));
  if (r.done) {
    release(id);
    *done = true;
  }
  return Status::Ok();
}

void InprocTransport::abort() {
  aborted_.store(true);
  fabric_->wake_all();
}

}  // namespace comm::testing
