// The comm thread: which partition goes on the wire next, the same sequence on every rank.
//
// Priority schedule (the default, host gradients). By default partitions go in index order
// (bucket order: backward's order), each once it is ready here; its all-reduce waits for the
// peers, as torch's DDP issues buckets, and needs no agreement. Every round_every_ bytes put on
// the wire (4 partitions' worth), the ranks hold a round: one small all-reduce (MIN over a byte per
// partition) of "ready here", as Horovod's coordinator agrees on ready tensors. A partition a
// round finds ready on every rank is *agreed*; agreed partitions run before the index order
// resumes, lowest priority value first (the parameter the next forward needs first; ties in
// partition order). So when communication falls behind backward, the first layers' partitions,
// ready last, overtake the backlog of later layers at the next round, and the next forward
// (overlap_forward) can start while the backlog is still on the wire.
//
// Everything that decides the sequence (bytes sent, round results, partitions started) is the same
// on every rank, so every rank issues the same collectives in the same order. Rounds are bounded
// by the bytes sent (no round is held twice without a partition in between), so ranks never spin
// in empty rounds, and a model smaller than round_every_ runs in index order with no round at all.
// (An earlier version held a round at each new readiness and between every two partitions: one
// extra collective per partition, whose wake-ups cost ~7 ms each on a busy 2-core host.)
//
// FIFO (COMM_ENGINE_SCHEDULE=fifo, and device gradients): index order only; no rounds.
#include <algorithm>
#include <cstring>

#include "dtype.h"
#include "engine/engine.h"
#include "engine/messages.h"
#include "engine/wire.h"
#include "engine_view.h"
#include "log.h"

namespace comm::engine {

int Engine::next_move() {
  const int n = static_cast<int>(parts_.size());
  if (started_parts_ == n) return kIdle;
  if (!opt_.fifo) {
    if (known_parts_ < n && bytes_since_round_ >= round_every_) return kRound;  // every rank knows it
    if (agreed_waiting_ > 0) {
      int best = -1;
      for (int k = 0; k < n; ++k) {
        const Partition& pt = parts_[static_cast<size_t>(k)];
        if (pt.agreed && !pt.started &&
            (best < 0 || pt.layout.priority < parts_[static_cast<size_t>(best)].layout.priority))
          best = k;
      }
      return best;
    }
  }
  while (parts_[static_cast<size_t>(fifo_next_)].started) ++fifo_next_;  // some ran out of order
  return parts_[static_cast<size_t>(fifo_next_)].ready ? fifo_next_ : kIdle;
}

Status Engine::agree_round(std::unique_lock<std::mutex>& lock) {
  const size_t n = parts_.size();
  round_buf_.resize(n);
  for (size_t k = 0; k < n; ++k) round_buf_[k] = parts_[k].ready ? 1 : 0;
  const double t0 = now_us();
  running_ = true;
  lock.unlock();
  // Only the comm thread touches round_buf_.
  comm_status_t s = comm_allreduce(comm_, round_buf_.data(), round_buf_.data(), n, COMM_UINT8, COMM_MIN, nullptr);
  const double t1 = now_us();
  lock.lock();
  running_ = false;
  ++rounds_;
  round_us_ += t1 - t0;
  bytes_since_round_ = 0;
  trace_.span(Trace::kRound, static_cast<int64_t>(rounds_), sched_step_, t0, t1);
  if (s != COMM_OK)
    return Status(s, "rank " + std::to_string(rank_) + ", comm_engine readiness round of step " + std::to_string(sched_step_) +
                         ": " + without_rank(comm_last_error(nullptr), rank_) +
                         " (a peer that reported a different set of gradients, called begin with a different sync "
                         "flag or never called end leaves this round waiting)");
  for (size_t k = 0; k < n; ++k) {
    Partition& pt = parts_[k];
    if (round_buf_[k] == 0 || pt.agreed || pt.started) continue;
    pt.agreed = true;
    ++agreed_waiting_;
    ++known_parts_;
  }
  return Status::Ok();
}

// The one place a host partition goes on the wire: all-reduce of its range, then each
// parameter's share of it copied back (decompressed) into the framework's gradient.
Status Engine::run_partition(int k) {
  const Partition& pt = parts_[static_cast<size_t>(k)];
  const int b = pt.layout.bucket;
  if (dev_ != nullptr) {  // one partition per bucket (options.cc)
    Status st = run_bucket_device(b);
    if (st.ok()) return st;
    return Status(st.code(), "rank " + std::to_string(rank_) + ", comm_engine bucket " + std::to_string(b) + " of step " +
                                 std::to_string(sched_step_) + " (device gradients): " + without_rank(st.message(), rank_) +
                                 (st.code() == COMM_ERR_TIMEOUT || st.code() == COMM_ERR_REMOTE
                                      ? " (a peer that reported a different set of gradients, called begin with a "
                                        "different sync flag or never called end leaves this bucket waiting)"
                                      : ""));
  }
  Bucket& bk = buckets_[static_cast<size_t>(b)];
  const size_t es = dtype_size(bk.layout.dtype), ws = dtype_size(bk.wire);
  char* base = static_cast<char*>(bk.compressed ? bk.wirebuf.ptr : bk.data.ptr);
  void* buf = base != nullptr ? base + pt.layout.begin * ws : nullptr;
  comm_status_t s = COMM_OK;
  if (hook_ != nullptr) {  // the framework's comm hook reduces it instead (comm_engine_set_reduce_hook)
    const comm_engine_hook_args_t args{buf, pt.layout.count, bk.wire, k, b, pt.layout.params.data(),
                                       static_cast<int>(pt.layout.params.size()), pt.wire_order,
                                       static_cast<int>(parts_.size())};
    s = hook_(&args, hook_user_);
    if (s != COMM_OK)
      return Status(s, "rank " + std::to_string(rank_) + ", comm_engine bucket " + std::to_string(b) + " (partition " +
                           std::to_string(k) + ") of step " + std::to_string(sched_step_) + ": the reduce hook returned " +
                           comm_status_string(s) + " (comm_engine_set_reduce_hook)");
  } else {
    s = comm_allreduce(comm_, buf, buf, pt.layout.count, bk.wire, opt_.op, nullptr);
  }
  if (s != COMM_OK)
    return Status(s, "rank " + std::to_string(rank_) + ", comm_engine bucket " + std::to_string(b) + " (partition " +
                         std::to_string(k) + ") of step " + std::to_string(sched_step_) + ": " +
                         without_rank(comm_last_error(nullptr), rank_) +
                         " (a peer that reported a different set of gradients, called begin with a different "
                         "sync flag or never called end leaves this bucket waiting)");
  const size_t lo_part = pt.layout.begin, hi_part = pt.layout.begin + pt.layout.count;
  for (int p : pt.layout.params) {
    const auto pi = static_cast<size_t>(p);
    const size_t off = param_offset_[pi];
    const size_t lo = std::max(off, lo_part), hi = std::min(off + params_[pi].count, hi_part);
    if (hi <= lo) continue;
    const size_t n = hi - lo;
    char* view = bk.data.ptr != nullptr ? static_cast<char*>(bk.data.ptr) + lo * es : nullptr;
    char* dst = grad_ptr_[pi] != nullptr ? static_cast<char*>(grad_ptr_[pi]) + (lo - off) * es : nullptr;
    if (bk.compressed) {
      const char* wire = static_cast<const char*>(bk.wirebuf.ptr) + lo * ws;
      if (view != nullptr) decompress(wire, reinterpret_cast<float*>(view), n, bk.wire);
      if (dst != nullptr && dst != view) {
        if (view != nullptr) std::memcpy(dst, view, n * es);
        else decompress(wire, reinterpret_cast<float*>(dst), n, bk.wire);
      }
    } else if (dst != nullptr && dst != view) {
      std::memcpy(dst, view, n * es);
    }
  }
  return Status::Ok();
}

void Engine::comm_loop() {
  log::set_thread_rank(rank_);
  if (dev_ != nullptr) dev_->bind_thread();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    int move = kIdle;
    cv_.wait(lock, [&] {
      if (stop_) return true;
      if (!comm_active_ || !broken_.ok()) return false;
      move = next_move();
      return move != kIdle;
    });
    if (stop_) return;
    Status st;
    if (move == kRound) {
      st = agree_round(lock);
    } else {
      Partition& pt = parts_[static_cast<size_t>(move)];
      if (pt.agreed) --agreed_waiting_;
      else ++known_parts_;
      pt.started = true;
      pt.wire_order = started_parts_++;
      pt.start_us = now_us();
      bytes_since_round_ += pt.layout.count * dtype_size(buckets_[static_cast<size_t>(pt.layout.bucket)].wire);
      running_ = true;
      lock.unlock();
      st = run_partition(move);
      const double t = now_us();
      lock.lock();
      running_ = false;
      pt.done = true;
      pt.done_us = t;
      // A failed partition leaves the step active until fail() below has set broken_: end()
      // waits for "idle or broken", and idle first made it return OK with unreduced gradients.
      if (st.ok() && ++done_parts_ == static_cast<int>(parts_.size())) comm_active_ = false;
    }
    cv_.notify_all();
    if (!st.ok()) {
      lock.unlock();
      (void)fail(st);
      lock.lock();
    }
  }
}

Status Engine::wait_comm_idle(std::unique_lock<std::mutex>& lock, const char* fn) {
  // Bounded: every partition is ready on this rank, and each all-reduce (and round) ends within
  // the timeout. A comm_abort on the trainer's communicator (the user cannot reach ours) ends it at once.
  auto finished = [&] { return !comm_active_ || !broken_.ok(); };
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), finished)) {
    if (aborted(parent_)) {
      lock.unlock();
      Status st = fail(Aborted(where(fn) + "the communicator the engine was created on was aborted (comm_abort)"), true);
      lock.lock();
      return st;
    }
  }
  return broken_;
}

// The step's numbers per bucket and partition (stats and trace). mu_ held, every partition done.
void Engine::complete_step() {
  last_bytes_ = 0;
  for (auto& s : last_buckets_) s = comm_engine_bucket_stats_t{};
  last_parts_.assign(parts_.size(), comm_engine_partition_stats_t{});
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    comm_engine_bucket_stats_t& s = last_buckets_[b];
    s.first_param = bk.layout.params.empty() ? -1 : bk.layout.params.front();
    s.num_params = static_cast<int>(bk.layout.params.size());
    s.bytes = bk.layout.count * dtype_size(bk.wire);
    s.ready_us = bk.ready_us - step_begin_us_;
    s.start_us = -1;
    last_bytes_ += s.bytes;
  }
  for (size_t k = 0; k < parts_.size(); ++k) {
    const Partition& pt = parts_[k];
    const Bucket& bk = buckets_[static_cast<size_t>(pt.layout.bucket)];
    comm_engine_partition_stats_t& s = last_parts_[k];
    s.bucket = pt.layout.bucket;
    s.priority = pt.layout.priority;
    s.first_param = pt.layout.params.front();
    s.num_params = static_cast<int>(pt.layout.params.size());
    s.bytes = pt.layout.count * dtype_size(bk.wire);
    s.wire_order = pt.wire_order;
    s.ready_us = pt.ready_us - step_begin_us_;
    s.start_us = pt.start_us - step_begin_us_;
    s.done_us = pt.done_us - step_begin_us_;
    comm_engine_bucket_stats_t& bs = last_buckets_[static_cast<size_t>(pt.layout.bucket)];
    if (bs.start_us < 0 || s.start_us < bs.start_us) bs.start_us = s.start_us;
    bs.done_us = std::max(bs.done_us, s.done_us);
    trace_.span(Trace::kBucketQueued, static_cast<int64_t>(k), sched_step_, pt.ready_us, pt.start_us);
    trace_.span(Trace::kBucketRun, static_cast<int64_t>(k), sched_step_, pt.start_us, pt.done_us);
  }
  last_rounds_ = rounds_;
  last_round_us_ = round_us_;
}

// The checks wait() and test() share; *done: gradient `index` holds this step's reduced value.
Status Engine::check_reduced(const char* fn, int index, bool* done) {
  if (!broken_.ok()) return broken_;
  if (!finalized_) return InvalidUsage(where(fn) + "call comm_engine_finalize first");
  if (index < 0 || static_cast<size_t>(index) >= params_.size())
    return InvalidArgument(where(fn) + "index " + std::to_string(index) + " is out of range (" +
                           std::to_string(params_.size()) + " parameters registered)");
  const auto p = static_cast<size_t>(index);
  if (in_step_ && sync_ && state_[p] == ParamState::kWaiting)
    return InvalidUsage(where(fn) + "gradient " + std::to_string(index) +
                        " is not reported yet in this step; report it (comm_engine_grad_ready) before waiting for it");
  *done = param_reduced(p);
  return Status::Ok();
}

bool Engine::param_reduced(size_t p) const {
  if (!comm_active_) return true;
  for (int k : param_parts_[p])
    if (!parts_[static_cast<size_t>(k)].done) return false;
  return true;
}

Status Engine::test(int index, int* done) {
  const char* fn = "comm_engine_test";
  if (done == nullptr) return InvalidArgument(where(fn) + "done is NULL; pass an int to receive the answer");
  std::lock_guard<std::mutex> lock(mu_);
  bool reduced = false;
  COMM_RETURN_IF_ERROR(check_reduced(fn, index, &reduced));
  *done = reduced ? 1 : 0;
  return Status::Ok();
}

Status Engine::wait(int index) {
  std::unique_lock<std::mutex> lock(mu_);
  const char* fn = "comm_engine_wait";
  bool reduced = false;
  COMM_RETURN_IF_ERROR(check_reduced(fn, index, &reduced));
  if (reduced) return broken_;
  const auto p = static_cast<size_t>(index);
  auto done = [&] { return !broken_.ok() || param_reduced(p); };
  const double t0 = now_us();
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), done)) {
    if (aborted(parent_)) {
      lock.unlock();
      return fail(Aborted(where(fn) + "the communicator the engine was created on was aborted (comm_abort)"), true);
    }
  }
  const double t1 = now_us();
  forward_wait_us_ += t1 - t0;
  trace_.span(Trace::kForwardWait, index, sched_step_, t0, t1);
  return broken_;
}

}  // namespace comm::engine
