// The engine's lifetime and failure: create (on its own duplicate communicator), register,
// fail (breaking the engine and its communicator on every rank), destroy. Registration ends in
// finalize.cc, a step is step.cc, the numbers are stats.cc.
#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dtype.h"
#include "engine/wire.h"
#include "engine/messages.h"
#include "engine_view.h"
#include "log.h"

namespace comm::engine {

Status Engine::create(comm_t comm, const Options& opt, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> e(new Engine());
  e->opt_ = opt;
  e->epoch_ = std::chrono::steady_clock::now();
  // Our own communicator: the trainer's collectives can never interleave differently with the
  // bucket all-reduces on different ranks.
  COMM_RETURN_IF_ERROR(from_call(comm_dup(comm, &e->comm_), ""));
  e->parent_ = comm;
  e->rank_ = rank_of(e->comm_);
  e->size_ = size_of(e->comm_);
  if (opt.stream != nullptr) {
    COMM_RETURN_IF_ERROR(device::open_engine_streams(e->comm_, opt.stream, &e->dev_));
    if (e->dev_->staged())
      COMM_INFO(kColl, "rank %d: the engine's device gradients are staged through pinned host memory onto the host "
                       "transport (one copy each way per bucket, the host waits for each bucket's copy in): %s",
                e->rank_, e->dev_->why().c_str());
    else
      COMM_INFO(kColl, "rank %d: the engine's device gradients are all-reduced by %s on the engine's own stream",
                e->rank_, e->dev_->why().c_str());
  }
  e->trace_.open(opt.trace_file, e->rank_);
  *out = std::move(e);
  return Status::Ok();
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (comm_ != nullptr) (void)comm_destroy(comm_);
}

double Engine::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
}

std::string Engine::where(const char* fn) const {
  return "rank " + std::to_string(rank_) + ", " + fn + " (step " + std::to_string(steps_ + 1) + "): ";
}

Status Engine::fail(Status st, bool interrupt) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  broken_ = st;  // from now on the comm thread picks up no bucket (fail_communicator logs it below)
  cv_.notify_all();
  lock.unlock();
  if (interrupt) (void)comm_abort(comm_);  // any thread: ends the bucket in flight now
  lock.lock();
  // Only the thread that uses a communicator may tell its peers: wait until the comm thread's
  // bucket in flight ends (bounded by the timeout, or at once after the abort above).
  if (std::this_thread::get_id() != thread_.get_id()) cv_.wait(lock, [&] { return !running_; });
  lock.unlock();
  // Peers may be inside (or about to start) a bucket's all-reduce with us: tell them, then abort
  // our communicator, so every rank ends with an error within its timeout instead of hanging.
  (void)fail_communicator(comm_, st);
  (void)comm_abort(comm_);
  return st;
}

Status Engine::add_param(size_t count, comm_dtype_t dtype, int* index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (finalized_)
    return InvalidUsage(where("comm_engine_register") +
                        "the engine is finalized: parameters are fixed once the buckets are built; register every "
                        "parameter before comm_engine_finalize, or create a new engine");
  if (!dtype_valid(dtype))
    return InvalidArgument(where("comm_engine_register") + "dtype " + std::to_string(static_cast<int>(dtype)) +
                           " is not a comm_dtype_t");
  if (count > (SIZE_MAX / 2) / dtype_size(dtype))
    return InvalidArgument(where("comm_engine_register") + "count " + std::to_string(count) + " overflows");
  params_.push_back({count, dtype});
  *index = static_cast<int>(params_.size() - 1);
  priority_.push_back(*index);  // registration order = forward order, unless set_priority says otherwise
  return Status::Ok();
}

Status Engine::set_priority(int index, int priority) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const char* fn = "comm_engine_set_priority";
  if (finalized_)
    return InvalidUsage(where(fn) + "the engine is finalized: the partitions' priorities are fixed; set them before "
                        "comm_engine_finalize");
  if (index < 0 || static_cast<size_t>(index) >= params_.size())
    return InvalidArgument(where(fn) + "index " + std::to_string(index) + " is out of range (" +
                           std::to_string(params_.size()) + " parameters registered)");
  priority_[static_cast<size_t>(index)] = priority;
  return Status::Ok();
}

Status Engine::set_reduce_hook(comm_engine_reduce_hook_t fn, void* user) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const char* fn_name = "comm_engine_set_reduce_hook";
  if (finalized_)
    return InvalidUsage(where(fn_name) + "the engine is finalized: set the reduce hook before comm_engine_finalize");
  if (opt_.stream != nullptr)
    return Unavailable(where(fn_name) + "device gradients (a stream) are reduced on the engine's stream; a reduce hook "
                                        "works on host gradients only");
  hook_ = fn;
  hook_user_ = user;
  return Status::Ok();
}

Status Engine::destroy() {
  bool mid_step;
  {
    std::unique_lock<std::mutex> lock(mu_);
    mid_step = in_step_ && sync_ && broken_.ok();
    // overlap_forward: the last step's partitions may still be on the wire; they finish first.
    if (!mid_step && comm_active_ && broken_.ok()) (void)wait_comm_idle(lock, "comm_engine_destroy");
    if (step_unrecorded_ && !comm_active_ && broken_.ok()) record_overlapped_step();
  }
  // Peers waiting on our next buckets would otherwise hang until their timeout.
  if (mid_step) (void)fail(InvalidUsage(where("comm_engine_destroy") + "destroyed in the middle of a synced step"), true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Status drained;
  if (dev_ != nullptr && !mid_step) {
    // The bucket memory goes with the engine: the engine's stream finishes with it first.
    bool broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken = !broken_.ok();
    }
    if (!broken) drained = dev_->synchronize("the engine's last bucket on its stream");
  }
  std::string err = trace_.write();
  if (!err.empty()) COMM_WARN(kColl, "rank %d, comm_engine_destroy: %s", rank_, err.c_str());
  comm_status_t s = comm_destroy(comm_);
  comm_ = nullptr;
  if (!drained.ok()) return under(drained, where("comm_engine_destroy"), rank_);
  return from_call(s, where("comm_engine_destroy"));
}

}  // namespace comm::engine
