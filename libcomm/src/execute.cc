// Running calls in issue order: inline on the caller's thread when nothing is queued,
// otherwise through the communicator's worker thread (non-blocking calls).
#include "communicator.h"
#include "dtype.h"
#include "log.h"

namespace comm {

std::string context(comm_t c, const algo::CollArgs& args) {
  return "rank " + std::to_string(c->rank) + ", " + transport::describe(args.tag) + ": ";
}

Status check_usable(comm_t c) {
  if (c->aborted.load(std::memory_order_acquire))
    return Aborted("rank " + std::to_string(c->rank) + ": the communicator was aborted (comm_abort); destroy it");
  std::lock_guard<std::mutex> lock(c->state_mu);
  return c->broken;
}

void stamp(comm_t c, algo::CollArgs* args) {
  transport::OpTag& tag = args->tag;
  tag.coll = args->kind;
  tag.dtype = static_cast<uint8_t>(args->dtype);
  tag.op = static_cast<uint8_t>(args->op);
  tag.count = args->count;
  tag.root = -1;
  if (args->kind == transport::CollKind::kSendRecv) {
    auto peer = static_cast<size_t>(args->peer);
    tag.seq = args->sendbuf != nullptr ? c->send_seq[peer]++ : c->recv_seq[peer]++;
    tag.op = 0;
    return;
  }
  if (args->kind == transport::CollKind::kBroadcast || args->kind == transport::CollKind::kReduce)
    tag.root = args->root;
  if (args->kind == transport::CollKind::kBroadcast || args->kind == transport::CollKind::kAllgather ||
      args->kind == transport::CollKind::kAlltoall || args->kind == transport::CollKind::kBarrier)
    tag.op = 0;  // no reduction: the op is not part of what ranks must agree on
  tag.seq = c->next_seq++;
}

namespace {

// A failure that involved peers breaks the communicator; tell the peers so that ranks
// waiting on someone else end promptly too.
Status record_failure(comm_t c, Status st) {
  if (c->aborted.load(std::memory_order_acquire) && st.code() != COMM_ERR_ABORTED)
    st = Aborted(st.message() + " (the communicator was aborted)");
  if (st.code() == COMM_ERR_INVALID_ARGUMENT) return st;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(c->state_mu);
    if (c->broken.ok()) {
      c->broken = st;
      first = true;
    }
  }
  if (first && c->transport) c->transport->notify_peers(st);
  COMM_WARN(kColl, "%s", st.message().c_str());
  return st;
}

}  // namespace

Status execute(comm_t c, const algo::CollArgs& args) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  algo::Context ctx{*c->transport, c->rank, c->size, c->scratch, c->settings.chunk_bytes};
  Status st = algo::run_collective(ctx, args, c->settings.forced_algo);
  if (st.ok()) return st;
  return record_failure(c, st.prefixed(context(c, args)));
}

Status execute_p2p_batch(comm_t c, const std::vector<algo::CollArgs>& calls) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  if (calls.empty()) return Status::Ok();
  std::vector<transport::RequestId> ids;
  ids.reserve(calls.size());
  Status st;
  for (const auto& call : calls) {
    size_t bytes = call.count * dtype_size(call.dtype);
    if (bytes == 0) continue;
    transport::RequestId id = 0;
    st = call.sendbuf != nullptr ? c->transport->isend(call.peer, call.tag, call.sendbuf, bytes, &id)
                                 : c->transport->irecv(call.peer, call.tag, call.recvbuf, bytes, &id);
    if (!st.ok()) break;
    ids.push_back(id);
  }
  if (st.ok() && !ids.empty()) st = c->transport->wait(ids.data(), ids.size());
  if (st.ok()) return st;
  return record_failure(c, st.prefixed(context(c, calls.front())));
}

Status run_blocking(comm_t c, algo::CollArgs args) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  stamp(c, &args);
  {
    // Issue order: earlier non-blocking calls finish first (each is bounded by the timeout).
    std::unique_lock<std::mutex> lock(c->queue_mu);
    c->queue_cv.wait(lock, [&] { return c->queue.empty() && !c->worker_busy; });
  }
  return execute(c, args);
}

namespace {

void worker_loop(comm_t c) {
  log::set_thread_rank(c->rank);
  std::unique_lock<std::mutex> lock(c->queue_mu);
  for (;;) {
    c->queue_cv.wait(lock, [&] { return !c->queue.empty() || c->worker_stop; });
    if (c->queue.empty()) return;  // stop requested and drained
    comm_request_s* req = c->queue.front();
    c->queue.pop_front();
    c->worker_busy = true;
    lock.unlock();
    Status st = execute(c, req->args);
    if (!st.ok()) {
      std::lock_guard<std::mutex> state(c->state_mu);
      if (c->async_error.ok()) c->async_error = st;
    }
    lock.lock();
    req->status = st;
    req->done = true;
    c->worker_busy = false;
    c->queue_cv.notify_all();
  }
}

}  // namespace

Status enqueue(comm_t c, algo::CollArgs args, comm_request_s** out) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  stamp(c, &args);
  std::lock_guard<std::mutex> lock(c->queue_mu);
  comm_request_s* req;
  if (!c->free_requests.empty()) {
    req = c->free_requests.back();
    c->free_requests.pop_back();
  } else {
    req = new comm_request_s;
  }
  req->comm = c;
  req->args = args;
  req->done = false;
  req->status = Status::Ok();
  c->queue.push_back(req);
  if (!c->worker.joinable()) c->worker = std::thread(worker_loop, c);
  c->queue_cv.notify_all();
  *out = req;
  return Status::Ok();
}

Status wait_request(comm_request_s* req) {
  comm_t c = req->comm;
  std::unique_lock<std::mutex> lock(c->queue_mu);
  c->queue_cv.wait(lock, [&] { return req->done; });
  Status st = req->status;
  c->free_requests.push_back(req);
  return st;
}

Status test_request(comm_request_s* req, bool* done) {
  comm_t c = req->comm;
  std::lock_guard<std::mutex> lock(c->queue_mu);
  *done = req->done;
  if (!req->done) return Status::Ok();
  Status st = req->status;
  c->free_requests.push_back(req);
  return st;
}

}  // namespace comm
