// One step: begin, each gradient reported (copied into its bucket or already a view of it),
// buckets all-reduced in order on the engine's thread while backward runs, and end.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dtype.h"
#include "engine/engine.h"
#include "engine/messages.h"
#include "log.h"
#include "engine/wire.h"
#include "engine_view.h"

namespace comm::engine {

Status Engine::zero_slot(int p) {
  const Bucket& bk = buckets_[static_cast<size_t>(param_bucket_[static_cast<size_t>(p)])];
  const size_t off = param_offset_[static_cast<size_t>(p)], n = params_[static_cast<size_t>(p)].count;
  // Device gradients: zeroed when the bucket runs, on the engine's stream after the producer
  // stream's event (the previous step's optimizer may still read the view there).
  if (dev_ != nullptr) return Status::Ok();
  if (bk.data.ptr != nullptr)
    std::memset(static_cast<char*>(bk.data.ptr) + off * dtype_size(bk.layout.dtype), 0, n * dtype_size(bk.layout.dtype));
  if (bk.wirebuf.ptr != nullptr)
    std::memset(static_cast<char*>(bk.wirebuf.ptr) + off * dtype_size(bk.wire), 0, n * dtype_size(bk.wire));
  return Status::Ok();
}

void Engine::mark_in_bucket(int p, double t_us) {
  for (int k : param_parts_[static_cast<size_t>(p)]) {
    Partition& pt = parts_[static_cast<size_t>(k)];
    if (--pt.pending == 0) {
      pt.ready = true;
      pt.ready_us = t_us;
      cv_.notify_all();  // the comm thread may hold a round now
    }
  }
  const auto b = static_cast<size_t>(param_bucket_[static_cast<size_t>(p)]);
  Bucket& bk = buckets_[b];
  if (--bk.pending == 0) {
    // Device gradients: every gradient of the bucket was produced on the producer stream before
    // this point, so one event recorded there now covers them all.
    if (dev_ != nullptr) bk.ready_error = dev_->ready(b);
    bk.ready = true;
    bk.ready_us = t_us;
    cv_.notify_all();
  }
}

Status Engine::begin(bool sync) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (!finalized_) return InvalidUsage(where("comm_engine_begin") + "call comm_engine_finalize first");
  if (in_step_)
    return InvalidUsage(where("comm_engine_begin") +
                        "a step is already open (begin twice without end); call comm_engine_end first");
  if (comm_active_) {  // overlap_forward: the last step's partitions still on the wire
    const double t0 = now_us();
    COMM_RETURN_IF_ERROR(wait_comm_idle(lock, "comm_engine_begin"));
    forward_wait_us_ += now_us() - t0;
  }
  if (step_unrecorded_) record_overlapped_step();
  if (dev_ != nullptr && !retired_.empty()) {
    // The engine's stream copied the reduced views out of them: let it finish before they go.
    Status st = dev_->synchronize("the copy out of the buckets a static-graph rebuild replaced");
    if (!st.ok()) return under(st, where("comm_engine_begin"), rank_);
  }
  retired_.clear();  // the views a static-graph rebuild replaced (freed once)
  std::fill(state_.begin(), state_.end(), ParamState::kWaiting);
  std::fill(grad_ptr_.begin(), grad_ptr_.end(), nullptr);
  in_step_ = true;
  ending_ = false;
  sync_ = sync;
  step_begin_us_ = now_us();
  if (!sync) return Status::Ok();
  for (Bucket& bk : buckets_) {
    bk.pending = static_cast<int>(bk.layout.params.size());
    bk.ready = false;
    bk.ready_us = bk.start_us = bk.done_us = 0;
  }
  for (Partition& pt : parts_) {
    pt.pending = static_cast<int>(pt.layout.params.size());
    pt.ready = pt.agreed = pt.started = pt.done = false;
    pt.wire_order = -1;
    pt.ready_us = pt.start_us = pt.done_us = 0;
  }
  done_parts_ = started_parts_ = agreed_waiting_ = known_parts_ = fifo_next_ = 0;
  bytes_since_round_ = 0;
  rounds_ = 0;
  round_us_ = forward_wait_us_ = 0;
  sched_step_ = steps_ + 1;
  comm_active_ = !parts_.empty();
  learning_ = opt_.static_graph && !learnt_;
  observed_.clear();
  last_unused_.clear();
  if (learnt_ && opt_.find_unused) {
    // Static graph: the unused set was learnt in the first step; those go in as zeros now.
    for (size_t p = 0; p < params_.size(); ++p)
      if (learnt_unused_[p]) {
        state_[p] = ParamState::kUnused;
        Status st = zero_slot(static_cast<int>(p));
        if (!st.ok()) {
          lock.unlock();
          return fail(under(st, where("comm_engine_begin"), rank_));
        }
        last_unused_.push_back(static_cast<int>(p));
        mark_in_bucket(static_cast<int>(p), step_begin_us_);
      }
  }
  return Status::Ok();
}

void Engine::copy_in(int p, const void* ptr) {
  const Bucket& bk = buckets_[static_cast<size_t>(param_bucket_[static_cast<size_t>(p)])];
  const size_t off = param_offset_[static_cast<size_t>(p)], n = params_[static_cast<size_t>(p)].count;
  const size_t es = dtype_size(bk.layout.dtype);
  char* view = bk.data.ptr != nullptr ? static_cast<char*>(bk.data.ptr) + off * es : nullptr;
  if (bk.compressed) {
    const void* src = ptr != nullptr ? ptr : view;
    compress(static_cast<const float*>(src), static_cast<char*>(bk.wirebuf.ptr) + off * dtype_size(bk.wire), n, bk.wire);
  } else if (ptr != nullptr && ptr != view && n > 0) {
    std::memcpy(view, ptr, n * es);
  }
}

Status Engine::grad_ready(int index, void* ptr) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const char* fn = "comm_engine_grad_ready";
  if (!finalized_) return InvalidUsage(where(fn) + "call comm_engine_finalize first");
  if (index < 0 || static_cast<size_t>(index) >= params_.size())
    return InvalidArgument(where(fn) + "index " + std::to_string(index) + " is out of range (" +
                           std::to_string(params_.size()) + " parameters registered)");
  if (!in_step_ || ending_)
    return InvalidUsage(where(fn) + "gradient " + std::to_string(index) +
                        " reported outside a step; call comm_engine_begin before backward and report every "
                        "gradient before comm_engine_end");
  const auto p = static_cast<size_t>(index);
  if (state_[p] == ParamState::kUnused)
    return InvalidUsage(where(fn) + "gradient " + std::to_string(index) +
                        " was unused in the first step; with static_graph the set of used parameters must not "
                        "change (it was reduced as zeros this step)");
  if (state_[p] != ParamState::kWaiting)
    return InvalidUsage(where(fn) + "gradient " + std::to_string(index) +
                        " reported twice in one step; the second call is ignored (report each gradient once, "
                        "when it is final)");
  if (ptr == nullptr && !opt_.grad_view && params_[p].count > 0)
    return InvalidArgument(where(fn) + "gradient " + std::to_string(index) +
                           ": ptr is NULL (only gradient_as_bucket_view engines accept NULL for the view)");
  if (!sync_) {  // no_sync: the framework keeps accumulating; nothing moves
    state_[p] = ParamState::kReady;
    return Status::Ok();
  }
  state_[p] = ParamState::kCopying;
  grad_ptr_[p] = ptr;
  if (learning_) observed_.push_back(index);
  lock.unlock();
  // Outside the lock: hooks on several threads copy at once. Device gradients are copied on the
  // engine's stream when their bucket runs (after the producer stream's event).
  if (dev_ == nullptr) copy_in(index, ptr);
  const double t = now_us();
  lock.lock();
  state_[p] = ParamState::kReady;
  mark_in_bucket(index, t);
  cv_.notify_all();  // end() may wait for copies in progress
  return Status::Ok();
}

Status Engine::grad_view(int index, void** ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const char* fn = "comm_engine_grad_view";
  if (!opt_.grad_view) return InvalidUsage(where(fn) + "needs gradient_as_bucket_view = 1 in the engine's config");
  if (!finalized_) return InvalidUsage(where(fn) + "call comm_engine_finalize first: the buckets do not exist yet");
  if (index < 0 || static_cast<size_t>(index) >= params_.size())
    return InvalidArgument(where(fn) + "index " + std::to_string(index) + " is out of range (" +
                           std::to_string(params_.size()) + " parameters registered)");
  const auto p = static_cast<size_t>(index);
  const Bucket& bk = buckets_[static_cast<size_t>(param_bucket_[p])];
  *ptr = static_cast<char*>(bk.data.ptr) + param_offset_[p] * dtype_size(bk.layout.dtype);
  return Status::Ok();
}

// Device gradients: everything is enqueued on the engine's stream, after the producer stream's
// event for this bucket: the copies in, one comm_allreduce of the flat bucket with that stream
// (NCCL on the stream, or staged through pinned host memory), the copies out.
Status Engine::run_bucket_device(int b) {
  Bucket& bk = buckets_[static_cast<size_t>(b)];
  COMM_RETURN_IF_ERROR(bk.ready_error);
  COMM_RETURN_IF_ERROR(dev_->wait_ready(static_cast<size_t>(b)));
  const size_t es = dtype_size(bk.layout.dtype);
  // A bucket of one gradient (a large parameter) is reduced where the gradient lies: no copies.
  const bool direct = !opt_.grad_view && bk.layout.params.size() == 1 &&
                      grad_ptr_[static_cast<size_t>(bk.layout.params[0])] != nullptr;
  void* buf = direct ? grad_ptr_[static_cast<size_t>(bk.layout.params[0])] : bk.data.ptr;
  if (!direct)
    for (size_t i = 0; i < bk.layout.params.size(); ++i) {
      const auto p = static_cast<size_t>(bk.layout.params[i]);
      char* slot = static_cast<char*>(bk.data.ptr) + bk.layout.offset[i] * es;
      // state_ and grad_ptr_ of this bucket's gradients are fixed once it is ready, until the next begin().
      if (state_[p] == ParamState::kUnused)
        COMM_RETURN_IF_ERROR(dev_->zero(slot, params_[p].count * es));
      else if (grad_ptr_[p] != nullptr)
        COMM_RETURN_IF_ERROR(dev_->copy(slot, grad_ptr_[p], params_[p].count * es));
    }
  comm_status_t s = comm_allreduce(comm_, buf, buf, bk.layout.count, bk.wire, opt_.op, dev_->stream());
  if (s != COMM_OK) return Status(s, without_rank(comm_last_error(nullptr), rank_));
  if (!direct)
    for (size_t i = 0; i < bk.layout.params.size(); ++i) {
      const auto p = static_cast<size_t>(bk.layout.params[i]);
      if (grad_ptr_[p] != nullptr)
        COMM_RETURN_IF_ERROR(dev_->copy(grad_ptr_[p], static_cast<char*>(bk.data.ptr) + bk.layout.offset[i] * es, params_[p].count * es));
    }
  return Status::Ok();
}

// end()'s gradients never reported this step: an error without find_unused_parameters (the
// caller then fails the engine); else each is unused: zeroed in its bucket, which may then be
// ready. Called with mu_ held.
Status Engine::settle_unreported(const char* fn, double t_end) {
  size_t missing = 0;
  int first_missing = -1;
  for (size_t p = 0; p < params_.size(); ++p)
    if (state_[p] == ParamState::kWaiting) {
      if (first_missing < 0) first_missing = static_cast<int>(p);
      ++missing;
    }
  if (missing > 0 && !opt_.find_unused)
    return InvalidUsage(where(fn) + std::to_string(missing) + " of " + std::to_string(params_.size()) +
                        " gradients were never reported (the first: index " + std::to_string(first_missing) +
                        "); report every gradient each step, or set find_unused_parameters = 1. The engine "
                        "is aborted so the other ranks fail too; destroy it");
  for (size_t p = 0; p < params_.size() && missing > 0; ++p)
    if (state_[p] == ParamState::kWaiting) {
      state_[p] = ParamState::kUnused;
      if (Status st = zero_slot(static_cast<int>(p)); !st.ok()) return under(st, where(fn), rank_);
      last_unused_.push_back(static_cast<int>(p));
      mark_in_bucket(static_cast<int>(p), t_end);
    }
  std::sort(last_unused_.begin(), last_unused_.end());
  return Status::Ok();
}

// overlap_forward: the numbers of the step whose end() returned early, once its partitions are
// done (the next begin(), or destroy). mu_ held.
void Engine::record_overlapped_step() {
  step_unrecorded_ = false;
  complete_step();
  last_forward_wait_us_ = forward_wait_us_;
  last_exposed_us_ = forward_wait_us_;
  publish_step();
}

// The last synced step's numbers to the metrics (engine_view.h): as comm_engine_stats reports them,
// on the trainer's communicator (it outlives the engine's dup, so the final counts written when the
// last communicator goes, COMM_METRICS_TEXTFILE, still carry them).
void Engine::publish_step() {
  double comm_us = 0;
  for (const auto& p : last_parts_) comm_us += p.done_us - p.start_us;
  record_engine_step(parent_, last_step_us_, last_exposed_us_, comm_us);
}

Status Engine::end() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const char* fn = "comm_engine_end";
  if (!finalized_) return InvalidUsage(where(fn) + "call comm_engine_finalize first");
  if (!in_step_ || ending_) return InvalidUsage(where(fn) + "no step is open; call comm_engine_begin first");
  ending_ = true;
  const double t_end = now_us();
  if (!sync_) {
    in_step_ = false;
    ++steps_;
    last_synced_ = false;
    return Status::Ok();
  }
  // A hook still copying on another thread finishes first.
  cv_.wait(lock, [&] {
    return std::none_of(state_.begin(), state_.end(), [](ParamState s) { return s == ParamState::kCopying; });
  });
  if (Status st = settle_unreported(fn, t_end); !st.ok()) {
    lock.unlock();
    return fail(st);
  }
  const double t_wait = now_us();
  if (opt_.overlap_forward && !learning_) {
    // The partitions finish on the comm thread; comm_engine_wait(i) and the next begin() wait for them.
    t_end_ = t_wait;
    last_step_us_ = t_wait - step_begin_us_;
    trace_.span(Trace::kStep, static_cast<int64_t>(steps_ + 1), steps_ + 1, step_begin_us_, t_wait);
    step_unrecorded_ = true;
    last_synced_ = true;
    ++steps_;
    ++synced_steps_;
    in_step_ = false;
    cv_.notify_all();
    return Status::Ok();
  }
  if (Status st = wait_comm_idle(lock, fn); !st.ok()) return st;
  const double t_done = now_us();
  complete_step();  // before a rebuild replaces the buckets
  last_forward_wait_us_ = 0;
  if (learning_) {
    Status st = rebuild_from_rank0();
    if (!st.ok()) {
      lock.unlock();
      return fail(st);
    }
  }
  // Device gradients: the producer stream waits for the engine's (the optimizer, enqueued after
  // this call, sees the reduced gradients); the host does not wait.
  if (dev_ != nullptr) {
    Status st = dev_->join();
    if (!st.ok()) {
      lock.unlock();
      return fail(under(st, where(fn), rank_));
    }
  }
  const double t_out = now_us();
  last_exposed_us_ = t_done - t_wait;
  last_step_us_ = t_out - step_begin_us_;
  publish_step();
  trace_.span(Trace::kStep, static_cast<int64_t>(steps_ + 1), steps_ + 1, step_begin_us_, t_out);
  trace_.span(Trace::kEndWait, static_cast<int64_t>(steps_ + 1), steps_ + 1, t_wait, t_done);
  last_synced_ = true;
  ++steps_;
  ++synced_steps_;
  in_step_ = false;
  return Status::Ok();
}

}  // namespace comm::engine
