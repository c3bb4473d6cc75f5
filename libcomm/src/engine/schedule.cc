// The comm thread: which partition goes on the wire next, the same sequence on every rank.
//
// Priority schedule (the default, host gradients): a partition may go on the wire once every rank
// has it ready. Ranks agree on that in rounds: one small all-reduce (MIN over a byte per partition)
// of "ready here". Between two partitions there is a round while some partition is not yet agreed,
// so a late-ready first layer overtakes queued later layers; among the agreed partitions the lowest
// priority value (the parameter the next forward needs first) runs next, ties in partition order.
// Everything that decides the sequence (agreed set, rounds held, partitions run) is the same on
// every rank, so every rank issues the same collectives in the same order.
//
// When nothing agreed is left to run, a rank comes to the next round only once it can move the
// agreement on: it has a partition ready that it has not contributed yet; or the last round
// agreed on less than it contributed (a peer lacked something) and either that round agreed on
// something new or this rank has everything ready (it can only wait for the others). A rank that
// stays away has something not ready yet, and comes as soon as it has more: every rank's
// gradients are ready by its end() (unreported ones are settled there), so the step finishes;
// and a round without progress is followed only by one that some rank's new readiness starts, so
// ranks never spin in empty rounds.
//
// FIFO (COMM_ENGINE_SCHEDULE=fifo, and device gradients): partitions in index order (bucket order)
// as each becomes ready on this rank, as torch's DDP issues buckets; no rounds.
#include <algorithm>
#include <cstring>

#include "communicator.h"
#include "dtype.h"
#include "engine/engine.h"
#include "engine/messages.h"
#include "engine/wire.h"
#include "log.h"

namespace comm::engine {

int Engine::next_move() {
  const int n = static_cast<int>(parts_.size());
  if (done_parts_ == n || started_parts_ == n) return kIdle;
  if (opt_.fifo) {
    const Partition& next = parts_[static_cast<size_t>(started_parts_)];
    return next.ready ? started_parts_ : kIdle;
  }
  const int pending_agreed = agreed_parts_ - started_parts_;
  if (pending_agreed > 0 && (agreed_parts_ == n || just_rounded_)) {
    int best = -1;
    for (int k = 0; k < n; ++k) {
      const Partition& pt = parts_[static_cast<size_t>(k)];
      if (pt.agreed && !pt.started && (best < 0 || pt.layout.priority < parts_[static_cast<size_t>(best)].layout.priority))
        best = k;
    }
    return best;
  }
  if (pending_agreed > 0) return kRound;  // every rank knows it: they all come
  // Nothing agreed left to run: a round only when it can move the agreement on (see the top).
  const bool grown = ready_parts_ > contributed_, complete = ready_parts_ == n;
  return (grown || (mismatch_ && (last_round_progress_ || complete))) ? kRound : kIdle;
}

Status Engine::agree_round(std::unique_lock<std::mutex>& lock) {
  const size_t n = parts_.size();
  round_buf_.resize(n);
  int mine = 0;
  for (size_t k = 0; k < n; ++k) {
    round_buf_[k] = parts_[k].ready ? 1 : 0;
    mine += round_buf_[k];
  }
  const double t0 = now_us();
  running_ = true;
  lock.unlock();
  // Only the comm thread touches round_buf_ and the agreed flags' inputs below.
  comm_status_t s = comm_allreduce(comm_, round_buf_.data(), round_buf_.data(), n, COMM_UINT8, COMM_MIN, nullptr);
  const double t1 = now_us();
  lock.lock();
  running_ = false;
  ++rounds_;
  round_us_ += t1 - t0;
  trace_.span(Trace::kRound, static_cast<int64_t>(rounds_), sched_step_, t0, t1);
  if (s != COMM_OK)
    return Status(s, "rank " + std::to_string(rank_) + ", comm_engine readiness round of step " + std::to_string(sched_step_) +
                         ": " + without_rank(comm_last_error(nullptr), rank_) +
                         " (a peer that reported a different set of gradients, called begin with a different sync "
                         "flag or never called end leaves this round waiting)");
  int agreed = 0;
  const int agreed_before = agreed_parts_;
  for (size_t k = 0; k < n; ++k) {
    if (round_buf_[k] == 0) continue;
    ++agreed;
    if (!parts_[k].agreed) {
      parts_[k].agreed = true;
      ++agreed_parts_;
    }
  }
  last_round_progress_ = agreed_parts_ > agreed_before;
  contributed_ = mine;
  mismatch_ = agreed < mine;
  just_rounded_ = true;
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
      pt.started = true;
      pt.wire_order = started_parts_++;
      pt.start_us = now_us();
      just_rounded_ = false;
      running_ = true;
      lock.unlock();
      st = run_partition(move);
      const double t = now_us();
      lock.lock();
      running_ = false;
      pt.done = true;
      pt.done_us = t;
      if (++done_parts_ == static_cast<int>(parts_.size())) comm_active_ = false;
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
    if (parent_->aborted.load(std::memory_order_acquire)) {
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

Status Engine::wait(int index) {
  std::unique_lock<std::mutex> lock(mu_);
  const char* fn = "comm_engine_wait";
  if (!broken_.ok()) return broken_;
  if (!finalized_) return InvalidUsage(where(fn) + "call comm_engine_finalize first");
  if (index < 0 || static_cast<size_t>(index) >= params_.size())
    return InvalidArgument(where(fn) + "index " + std::to_string(index) + " is out of range (" +
                           std::to_string(params_.size()) + " parameters registered)");
  const auto p = static_cast<size_t>(index);
  if (in_step_ && sync_ && state_[p] == ParamState::kWaiting)
    return InvalidUsage(where(fn) + "gradient " + std::to_string(index) +
                        " is not reported yet in this step; report it (comm_engine_grad_ready) before waiting for it");
  auto done = [&] {
    if (!comm_active_ || !broken_.ok()) return true;
    for (int k : param_parts_[p])
      if (!parts_[static_cast<size_t>(k)].done) return false;
    return true;
  };
  if (done()) return broken_;
  const double t0 = now_us();
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), done)) {
    if (parent_->aborted.load(std::memory_order_acquire)) {
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
