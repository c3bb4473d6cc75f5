// Running calls in issue order: inline on the caller's thread when nothing is queued,
// otherwise through the communicator's worker thread (non-blocking calls).
#include <cstring>
#include <deque>

#include "blame.h"
#include "communicator.h"
#include "dtype.h"
#include "log.h"
#include "observe/call.h"
#include "strict.h"
#include "watch.h"

namespace comm {

std::string context(comm_t c, const algo::CollArgs& args) {
  if (args.kind == transport::CollKind::kSendRecv && args.peer == COMM_ANY_SOURCE)
    return "rank " + std::to_string(c->rank) + ", receive from any rank (COMM_ANY_SOURCE, count " +
           std::to_string(args.count) + ", " + dtype_name(args.dtype) + "): ";
  return "rank " + std::to_string(c->rank) + ", " + transport::describe(args.tag) + ": ";
}

Status check_usable(comm_t c) {
  if (c->aborted.load(std::memory_order_acquire))
    return Aborted("rank " + std::to_string(c->rank) + ": the communicator was aborted (comm_abort); destroy it");
  if (!c->is_broken.load(std::memory_order_acquire)) return Status::Ok();  // no lock per call
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
    if (args->sendbuf != nullptr) tag.seq = c->send_seq[static_cast<size_t>(args->peer)]++;
    tag.op = 0;
    tag.order = 2 * c->next_seq - 1;  // after collective #next_seq-1, before #next_seq (transport.h)
    return;
  }
  if (args->kind == transport::CollKind::kBroadcast || args->kind == transport::CollKind::kReduce)
    tag.root = args->root;
  if (args->kind == transport::CollKind::kBroadcast || args->kind == transport::CollKind::kAllgather ||
      args->kind == transport::CollKind::kAlltoall || args->kind == transport::CollKind::kBarrier)
    tag.op = 0;  // no reduction: the op is not part of what ranks must agree on
  tag.seq = c->next_seq++;
  tag.order = 2 * tag.seq;
}

void stamp_receive(comm_t c, algo::CollArgs* args) {
  if (args->kind != transport::CollKind::kSendRecv || args->sendbuf != nullptr || args->peer < 0) return;
  args->tag.seq = c->recv_seq[static_cast<size_t>(args->peer)]++;
}

// Peers are told so that ranks waiting on someone else end promptly too (communicator.h).
Status fail_communicator(comm_t c, Status st, uint64_t order) {
  if (c->aborted.load(std::memory_order_acquire) && st.code() != COMM_ERR_ABORTED)
    st = Aborted(st.message() + " (the communicator was aborted)");
  if (st.code() == COMM_ERR_INVALID_ARGUMENT) return st;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(c->state_mu);
    first = c->set_broken_locked(st);
  }
  if (first && c->transport) {
    // Tell the peers first, so that their waits end too and they publish theirs; then follow
    // the chain of waits to the rank that stalls (blame.h) and keep that verdict. A hang is
    // reported as a timeout, also when a peer's report told us of it, so that every rank it
    // reaches traces it too.
    const bool hang = c->transport->wait_failure().hang && st.code() == COMM_ERR_REMOTE;
    c->transport->notify_peers(hang ? Status(COMM_ERR_TIMEOUT, st.message()) : st, order);
    Status traced = trace_hang(c, st);
    if (traced.message() != st.message()) {
      std::lock_guard<std::mutex> lock(c->state_mu);
      c->broken = traced;
      st = traced;
    }
  }
  COMM_WARN(kColl, "%s", st.message().c_str());
  if (first) {
    std::string written;
    Status dumped = dump_flight_recorder(c, "", &written);  // COMM_FLIGHT_RECORDER_FILE, when set
    if (!dumped.ok()) COMM_WARN(kColl, "%s", dumped.message().c_str());
  }
  return st;
}

namespace {

// Which entry a call applied and why, once per entry and communicator (COMM_DEBUG=INFO).
void note_first_use(comm_t c, const tuning::CallTuning& t, uint64_t bytes) {
  if (t.logged.load(std::memory_order_relaxed) || t.logged.exchange(true)) return;
  const tuning::Entry& e = *t.entry;
  char gain[64] = "";
  if (e.gain > 0) snprintf(gain, sizeof gain, "; the sweep measured %.3fx the default's busbw", e.gain);
  COMM_INFO(kAlg, "comm %s rank %d: %s of %llu bytes applies tuning profile %s: %s; why: it is the first entry "
            "for this collective, rank count, transport and size, and the environment does not set these knobs%s",
            c->id.c_str(), c->rank, transport::coll_name(e.kind), static_cast<unsigned long long>(bytes),
            e.label().c_str(), t.applied.c_str(), gain);
}

}  // namespace

Status execute(comm_t c, const algo::CollArgs& args) {
  Driving driving(c);  // first: a failure the watcher found meanwhile is seen by check_usable
  COMM_RETURN_IF_ERROR(check_usable(c));
  algo::Context ctx{*c->transport, c->rank, c->size, c->scratch, c->settings.chunk_bytes};
  algo::Overrides overrides;
  overrides.forced = c->settings.forced_algo;
  const uint64_t bytes = tuning::call_bytes(args.kind, args.count, args.dtype, c->size);
  if (const tuning::CallTuning* t = c->tuning ? c->tuning->for_call(args.kind, bytes) : nullptr) {
    overrides.profile = t->algo;  // empty when COMM_ALGO is set: the environment beats the profile
    overrides.profile_source = t->source.c_str();
    if (t->chunk_bytes != 0) ctx.chunk_bytes = t->chunk_bytes;
    if (t->shm_chunk_bytes != 0) ctx.shm_chunk_bytes = t->shm_chunk_bytes;
    note_first_use(c, *t, bytes);
  }
  const size_t slot = c->recorder.begin(args.tag);
  observe::begin_call(c, slot, args.tag);
  const char* algorithm = nullptr;
  Status st = algo::run_collective(ctx, args, overrides, &algorithm);
  if (st.ok() && c->settings.check_collectives && args.tag.coll != transport::CollKind::kInternal)
    st = confirm_signature(c, ctx, args);
  c->recorder.set_algorithm(slot, algorithm);
  c->recorder.end(slot, st, st.ok() ? nullptr : &c->transport->wait_failure());
  observe::end_call(c, slot, args.tag.coll, bytes, algorithm, st);
  if (st.ok()) return st;
  return fail_communicator(c, st.prefixed(context(c, args)), args.tag.order);
}

Status execute_p2p_batch(comm_t c, std::vector<algo::CollArgs> calls) {
  Driving driving(c);
  COMM_RETURN_IF_ERROR(check_usable(c));
  if (calls.empty()) return Status::Ok();
  for (auto& call : calls) stamp_receive(c, &call);  // the worker is idle: group_end waited for it
  std::vector<transport::RequestId> ids;
  ids.reserve(calls.size());
  Status st;
  // Sends to oneself (allowed inside a group, as in NCCL) pair with receives from oneself
  // in issue order: a copy, no transport.
  std::vector<const algo::CollArgs*> self_sends, self_recvs;
  for (const auto& call : calls)
    if (call.peer == c->rank) (call.sendbuf != nullptr ? self_sends : self_recvs).push_back(&call);
  if (self_sends.size() != self_recvs.size())
    return InvalidUsage(context(c, calls.front()) + std::to_string(self_sends.size()) + " send(s) to this rank but " +
                        std::to_string(self_recvs.size()) + " receive(s) from it in one group; they must pair up");
  for (size_t i = 0; i < self_sends.size(); ++i) {
    size_t send_bytes = self_sends[i]->count * dtype_size(self_sends[i]->dtype);
    size_t recv_bytes = self_recvs[i]->count * dtype_size(self_recvs[i]->dtype);
    if (send_bytes != recv_bytes)
      return InvalidUsage(context(c, *self_recvs[i]) + "send to self of " + std::to_string(send_bytes) +
                          " bytes but receive from self of " + std::to_string(recv_bytes) + " bytes");
    if (send_bytes > 0) std::memmove(self_recvs[i]->recvbuf, self_sends[i]->sendbuf, send_bytes);
  }
  for (const auto& call : calls) {
    size_t bytes = call.count * dtype_size(call.dtype);
    if (bytes == 0 || call.peer == c->rank) continue;
    transport::RequestId id = 0;
    st = call.sendbuf != nullptr ? c->transport->isend(call.peer, call.tag, call.sendbuf, bytes, &id)
                                 : c->transport->irecv(call.peer, call.tag, call.recvbuf, bytes, &id);
    if (!st.ok()) break;
    ids.push_back(id);
  }
  const size_t slot = c->recorder.begin(calls.front().tag);
  c->recorder.set_algorithm(slot, "p2p_group");
  if (st.ok() && !ids.empty()) st = c->transport->wait(ids.data(), ids.size());
  c->recorder.end(slot, st, st.ok() ? nullptr : &c->transport->wait_failure());
  if (st.ok()) return st;
  return fail_communicator(c, st.prefixed(context(c, calls.front())), calls.front().tag.order);
}

Status run_blocking(comm_t c, algo::CollArgs args) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  bool worker_active = false;
  if (c->worker_active.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(c->queue_mu);
    worker_active = !c->queue.empty() || c->worker_busy;
  }
  if (worker_active) {
    // Issue order, and progress for the non-blocking sends/receives still in flight
    // (isend; recv; wait must not deadlock): the worker runs this call after them.
    comm_request_s* req = nullptr;
    COMM_RETURN_IF_ERROR(enqueue(c, args, &req));
    return wait_request(req);
  }
  stamp(c, &args);
  stamp_receive(c, &args);  // the worker is idle: nothing else posts receives now
  return execute(c, args);
}

namespace {

void complete(comm_t c, comm_request_s* req, const Status& st) {
  if (!st.ok()) {
    std::lock_guard<std::mutex> state(c->state_mu);
    if (c->async_error.ok()) c->async_error = st;
  }
  std::lock_guard<std::mutex> lock(c->queue_mu);
  req->status = st;
  req->done = true;
  c->queue_cv.notify_all();
}

// Non-blocking sends and receives are posted at once and left in flight, so that a later
// call (the matching receive, a send the other way) is posted too before anyone waits.
struct InFlight {
  comm_request_s* req;
  transport::RequestId id;
};

// The worker's sends and receives. While a receive from any rank (COMM_ANY_SOURCE) has not
// completed, receives issued after it wait here, unposted: a message then goes to the earliest
// receive that can take it, as in MPI (one from any rank takes a message from rank p only when
// no receive posted before it waits for p), and the sequence number a receive from p expects is
// known when it is posted. Sends never wait.
struct P2p {
  std::vector<InFlight> inflight;
  std::deque<comm_request_s*> held;  // receives issued after any_open, in issue order
  comm_request_s* any_open = nullptr;
};

void post_now(comm_t c, comm_request_s* req, P2p* p2p) {
  Driving driving(c);
  algo::CollArgs& a = req->args;
  Status st = check_usable(c);
  stamp_receive(c, &a);
  size_t bytes = a.count * dtype_size(a.dtype);
  if (st.ok() && bytes == 0) return complete(c, req, st);
  transport::RequestId id = 0;
  const bool any = a.sendbuf == nullptr && a.peer == COMM_ANY_SOURCE;
  req->matched = -1;
  if (st.ok()) {
    if (a.sendbuf != nullptr)
      st = c->transport->isend(a.peer, a.tag, a.sendbuf, bytes, &id);
    else if (any)
      st = c->transport->irecv_any(a.tag, c->recv_seq.data(), a.recvbuf, bytes, &req->matched, &id);
    else
      st = c->transport->irecv(a.peer, a.tag, a.recvbuf, bytes, &id);
  }
  if (!st.ok()) return complete(c, req, fail_communicator(c, st.prefixed(context(c, a)), a.tag.order));
  if (any) p2p->any_open = req;
  p2p->inflight.push_back({req, id});
}

void post_p2p(comm_t c, comm_request_s* req, P2p* p2p) {
  if (req->args.sendbuf == nullptr && (p2p->any_open != nullptr || !p2p->held.empty())) {
    p2p->held.push_back(req);
    return;
  }
  post_now(c, req, p2p);
}

// Completes whatever has finished, then posts the receives a completed receive from any rank
// held back; on a failure, every request in flight or held fails with it.
void collect(comm_t c, P2p* p2p, Status st) {
  Driving driving(c);
  auto& inflight = p2p->inflight;
  for (size_t i = 0; i < inflight.size() && st.ok();) {
    bool done = false;
    st = c->transport->test(inflight[i].id, &done);
    if (st.ok() && done) {
      comm_request_s* req = inflight[i].req;
      if (req == p2p->any_open) {  // the rank it came from: its next receive expects the next number
        const int source = req->matched;
        ++c->recv_seq[static_cast<size_t>(source)];
        if (req->args.source != nullptr) *req->args.source = source;
        p2p->any_open = nullptr;
      }
      complete(c, req, st);
      inflight.erase(inflight.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (st.ok()) {
    while (p2p->any_open == nullptr && !p2p->held.empty()) {
      comm_request_s* req = p2p->held.front();
      p2p->held.pop_front();
      post_now(c, req, p2p);
    }
    return;
  }
  for (auto& f : inflight)
    complete(c, f.req, fail_communicator(c, st.prefixed(context(c, f.req->args)), f.req->args.tag.order));
  inflight.clear();
  for (comm_request_s* req : p2p->held)
    complete(c, req, fail_communicator(c, st.prefixed(context(c, req->args)), req->args.tag.order));
  p2p->held.clear();
  p2p->any_open = nullptr;
}

// A lazy worker wakes every kLazyPoll, up to kLazyWindow / kLazyPoll times after the last inline
// run: worth it only when inline runs come faster than kLazyGap (a tight issue-then-wait loop),
// not for a trainer's call every 10-50 ms, which one wake-up per call costs less.
constexpr auto kLazyGap = std::chrono::milliseconds(1);
constexpr auto kLazyWindow = std::chrono::milliseconds(10);
constexpr auto kLazyPoll = std::chrono::milliseconds(1);

// A thread about to block on the worker must not wait for its next look.
void wake_lazy_worker(comm_t c) {
  if (c->worker_lazy) c->queue_cv.notify_all();
}

// comm_wait returns: the worker may take what is still queued. A lazy worker is not woken: it
// looks within kLazyPoll, and a caller in a wait loop claims the next call before that (a wake-up
// here made the worker take each next call just as the caller came to wait for it).
void hand_back(comm_t c) {
  if (c->worker_stop || (!c->queue.empty() && !c->worker_lazy)) c->queue_cv.notify_all();
}

void worker_loop(comm_t c) {
  log::set_thread_rank(c->rank);
  P2p p2p;
  std::vector<InFlight>& inflight = p2p.inflight;
  std::vector<transport::RequestId> ids;
  std::unique_lock<std::mutex> lock(c->queue_mu);
  auto can_take = [&] {
    if (c->queue.empty() || c->helping) return false;
    // A waiting caller runs the collectives itself (wait_request); sends/receives stay here, and
    // so do collectives while sends/receives are in flight (they may need each other's progress).
    return !c->claim_wanted || !inflight.empty() || c->queue.front()->args.kind == transport::CollKind::kSendRecv;
  };
  auto wake_up = [&] { return can_take() || (c->worker_stop && !c->helping); };
  for (;;) {
    if (!can_take() && inflight.empty()) {
      c->worker_busy = false;
      c->worker_active.store(!c->queue.empty() || c->helping, std::memory_order_release);
      c->queue_cv.notify_all();
      while (!wake_up()) {
        if (c->inline_gap < kLazyGap && std::chrono::steady_clock::now() - c->last_inline_run < kLazyWindow) {
          c->worker_lazy = true;  // comm_wait runs calls itself: look now and then, unwoken
          c->queue_cv.wait_for(lock, kLazyPoll, wake_up);
          c->worker_lazy = false;
        } else {
          c->queue_cv.wait(lock, wake_up);
        }
      }
      if (!can_take()) return;  // stop requested and drained
    }
    c->worker_busy = true;
    if (can_take()) {
      comm_request_s* req = c->queue.front();
      c->queue.pop_front();
      lock.unlock();
      if (req->args.kind == transport::CollKind::kSendRecv) {
        post_p2p(c, req, &p2p);
      } else {
        // A collective's wait moves the in-flight sends/receives too (one transport).
        complete(c, req, execute(c, req->args));
      }
      if (!inflight.empty()) collect(c, &p2p, Status::Ok());
      lock.lock();
      continue;
    }
    // Only sends/receives in flight: block until one finishes or a new call arrives.
    c->worker_in_transport = true;
    lock.unlock();
    ids.clear();
    for (const auto& f : inflight) ids.push_back(f.id);
    Status st;
    {
      Driving driving(c);
      st = c->transport->wait_some(ids.data(), ids.size());
    }
    lock.lock();
    c->worker_in_transport = false;
    lock.unlock();
    collect(c, &p2p, st);
    lock.lock();
  }
}

}  // namespace

Status enqueue(comm_t c, algo::CollArgs args, comm_request_s** out) {
  COMM_RETURN_IF_ERROR(check_usable(c));
  stamp(c, &args);
  bool in_transport = false;
  {
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
    c->worker_active.store(true, std::memory_order_release);
    if (!c->worker.joinable()) c->worker = std::thread(worker_loop, c);
    // A lazy worker finds a collective within kLazyPoll, if comm_wait has not run it by then;
    // sends and receives are never run inline, so they wake it.
    if (!c->worker_lazy || args.kind == transport::CollKind::kSendRecv) c->queue_cv.notify_all();
    *out = req;
    in_transport = c->worker_in_transport;
  }
  if (in_transport) c->transport->wake();  // a worker blocked in wait_some picks the new call up
  return Status::Ok();
}

// Collectives the worker has not taken yet, up to and including this request, run on this thread
// in issue order whenever the worker runs nothing: no hand-off to the worker and back per call
// (two wake-ups; comm_i* + comm_wait cost 1.2 us against 0.2 us blocking for 8 B), and when many
// calls were issued before the first wait (comm-bench -z 0, nccl-tests' default), the worker
// stops after its current call and this thread runs the rest, instead of a wake-up per completion.
// Sends/receives stay with the worker, which keeps them in flight together.
Status wait_request(comm_request_s* req) {
  comm_t c = req->comm;
  std::unique_lock<std::mutex> lock(c->queue_mu);
  auto can_claim = [&] {
    return !c->worker_busy && !c->helping && !c->queue.empty() &&
           c->queue.front()->args.kind != transport::CollKind::kSendRecv;
  };
  while (!req->done) {
    if (!can_claim()) {
      c->claim_wanted = true;
      wake_lazy_worker(c);  // a call ahead of this one (or this one, a send/receive) must start now
      c->queue_cv.wait(lock, [&] { return req->done || can_claim(); });
      continue;
    }
    comm_request_s* next = c->queue.front();
    c->queue.pop_front();
    c->helping = true;
    const auto now = std::chrono::steady_clock::now();
    c->inline_gap = now - c->last_inline_run;
    c->last_inline_run = now;
    lock.unlock();
    Status st = execute(c, next->args);
    if (next != req) {  // an earlier call: done for its own comm_wait / comm_test
      complete(c, next, st);
      lock.lock();
      c->helping = false;
      continue;
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> state(c->state_mu);
      if (c->async_error.ok()) c->async_error = st;
    }
    lock.lock();
    c->helping = false;
    c->claim_wanted = false;
    c->worker_active.store(!c->queue.empty() || c->worker_busy, std::memory_order_release);
    c->free_requests.push_back(req);
    hand_back(c);
    return st;
  }
  c->claim_wanted = false;
  hand_back(c);
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
