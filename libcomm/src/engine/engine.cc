#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "communicator.h"
#include "dtype.h"
#include "engine/wire.h"
#include "log.h"

namespace comm::engine {

Buffer::Buffer(size_t n) : bytes(n) {
  if (n == 0) return;
  ptr = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (ptr == nullptr) throw std::bad_alloc();
  std::memset(ptr, 0, n);  // the first touch happens here, at finalize, never in a step
}
Status Buffer::on_device(size_t n, device::EngineStreams* dev, Buffer* out) {
  Buffer b;
  b.dev = dev;
  b.bytes = n;
  if (n > 0) COMM_RETURN_IF_ERROR(dev->alloc(n, &b.ptr));
  *out = std::move(b);
  return Status::Ok();
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(ptr, o.ptr);
  std::swap(bytes, o.bytes);
  std::swap(dev, o.dev);
  return *this;
}
Buffer::~Buffer() {
  if (dev != nullptr)
    dev->release(ptr);
  else
    std::free(ptr);
}

namespace {

Status from_call(comm_status_t s, const std::string& context) {
  if (s == COMM_OK) return Status::Ok();
  return Status(s, context + comm_last_error(nullptr));
}

const char* const kHeaderNames[] = {"number of parameters", "bucket_cap_bytes", "first_bucket_bytes", "op",
                                    "wire_dtype", "gradient_as_bucket_view", "static_graph",
                                    "find_unused_parameters", "device gradients (stream != NULL)"};
constexpr size_t kHeader = 9;

// "rank 2, comm_allreduce: why" from below, inside a message that names the rank already.
std::string without_rank(const std::string& m, int rank) {
  const std::string r = "rank " + std::to_string(rank) + ", ";
  return m.compare(0, r.size(), r) == 0 ? m.substr(r.size()) : m;
}
// The device side's failure (which names its rank and communicator) under the engine's context.
Status under(const Status& st, const std::string& context, int rank) {
  return st.ok() ? st : Status(st.code(), context + without_rank(st.message(), rank));
}

std::string dtype_text(int64_t d) {
  return dtype_valid(static_cast<int>(d)) ? dtype_name(static_cast<comm_dtype_t>(d)) : std::to_string(d);
}

}  // namespace

Status Engine::create(comm_t comm, const Options& opt, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> e(new Engine());
  e->opt_ = opt;
  e->epoch_ = std::chrono::steady_clock::now();
  // Our own communicator: the trainer's collectives can never interleave differently with the
  // bucket all-reduces on different ranks.
  COMM_RETURN_IF_ERROR(from_call(comm_dup(comm, &e->comm_), ""));
  e->parent_ = comm;
  e->rank_ = e->comm_->rank;
  e->size_ = e->comm_->size;
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
  broken_ = st;  // from now on the comm thread picks up no bucket
  cv_.notify_all();
  COMM_WARN(kColl, "%s", st.message().c_str());
  lock.unlock();
  if (interrupt) (void)comm_abort(comm_);  // any thread: ends the bucket in flight now
  lock.lock();
  // Only the thread that uses a communicator may tell its peers: wait until the comm thread's
  // bucket in flight ends (bounded by the timeout, or at once after the abort above).
  if (std::this_thread::get_id() != thread_.get_id()) cv_.wait(lock, [&] { return !running_; });
  lock.unlock();
  // Peers may be inside (or about to start) a bucket's all-reduce with us: tell them, then abort
  // our communicator, so every rank ends with an error within its timeout instead of hanging.
  {
    std::lock_guard<std::mutex> state(comm_->state_mu);
    comm_->set_broken_locked(st);
  }
  if (comm_->transport) comm_->transport->notify_peers(st);
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
  return Status::Ok();
}

Status Engine::check_agreement() {
  const std::string w = where("comm_engine_finalize");
  int64_t mine[kHeader] = {static_cast<int64_t>(params_.size()), static_cast<int64_t>(opt_.bucket_cap_bytes),
                           static_cast<int64_t>(opt_.first_bucket_bytes), opt_.op, opt_.wire_dtype,
                           opt_.grad_view, opt_.static_graph, opt_.find_unused, opt_.stream != nullptr};
  std::vector<int64_t> all(kHeader * static_cast<size_t>(size_));
  COMM_RETURN_IF_ERROR(from_call(comm_allgather(comm_, mine, all.data(), kHeader, COMM_INT64, nullptr), w));
  for (int r = 1; r < size_; ++r)
    for (size_t k = 0; k < kHeader; ++k)
      if (all[static_cast<size_t>(r) * kHeader + k] != all[k])
        return InvalidUsage(w + "ranks disagree on the engine: rank " + std::to_string(r) + " has " +
                            kHeaderNames[k] + " = " + std::to_string(all[static_cast<size_t>(r) * kHeader + k]) +
                            ", rank 0 has " + std::to_string(all[k]) +
                            "; every rank must register the same parameters with the same options");
  // Same length everywhere: compare each rank's list with rank 0's, then share the first
  // difference so that every rank fails naming it.
  const size_t n = params_.size();
  std::vector<int64_t> list(2 * n), rank0(2 * n);
  for (size_t i = 0; i < n; ++i) list[2 * i] = static_cast<int64_t>(params_[i].count), list[2 * i + 1] = params_[i].dtype;
  rank0 = list;
  if (n > 0) COMM_RETURN_IF_ERROR(from_call(comm_broadcast(comm_, rank0.data(), rank0.data(), 2 * n, COMM_INT64, 0, nullptr), w));
  int64_t diff[3] = {-1, 0, 0};
  for (size_t i = 0; i < n; ++i)
    if (list[2 * i] != rank0[2 * i] || list[2 * i + 1] != rank0[2 * i + 1]) {
      diff[0] = static_cast<int64_t>(i), diff[1] = list[2 * i], diff[2] = list[2 * i + 1];
      break;
    }
  std::vector<int64_t> diffs(3 * static_cast<size_t>(size_));
  COMM_RETURN_IF_ERROR(from_call(comm_allgather(comm_, diff, diffs.data(), 3, COMM_INT64, nullptr), w));
  for (int r = 0; r < size_; ++r) {
    const int64_t* d = &diffs[3 * static_cast<size_t>(r)];
    if (d[0] < 0) continue;
    const auto i = static_cast<size_t>(d[0]);
    if (i >= n) return Internal(w + "rank " + std::to_string(r) + " reported a difference at parameter " + std::to_string(d[0]));
    return InvalidUsage(w + "ranks registered different parameters: parameter " + std::to_string(i) + " is (count " +
                        std::to_string(d[1]) + ", " + dtype_text(d[2]) + ") on rank " + std::to_string(r) +
                        " but (count " + std::to_string(rank0[2 * i]) + ", " + dtype_text(rank0[2 * i + 1]) +
                        ") on rank 0; every rank must register the same list in the same order");
  }
  return Status::Ok();
}

Status Engine::make_buffer(size_t bytes, Buffer* out) {
  if (dev_ == nullptr) {
    *out = Buffer(bytes);
    return Status::Ok();
  }
  return Buffer::on_device(bytes, dev_.get(), out);
}

Status Engine::build(const std::vector<int>& order) {
  std::vector<BucketLayout> layouts = assign_buckets(params_, order, opt_.bucket_cap_bytes, opt_.first_bucket_bytes);
  std::vector<Bucket> buckets(layouts.size());
  param_bucket_.assign(params_.size(), -1);
  param_offset_.assign(params_.size(), 0);
  for (size_t b = 0; b < layouts.size(); ++b) {
    Bucket& bk = buckets[b];
    bk.layout = std::move(layouts[b]);
    bk.compressed = opt_.wire_dtype != COMM_UNSET && bk.layout.dtype == COMM_FLOAT32 &&
                    opt_.wire_dtype != COMM_FLOAT32;
    bk.wire = bk.compressed ? static_cast<comm_dtype_t>(opt_.wire_dtype) : bk.layout.dtype;
    // Gradients in their own dtype are needed as views, or as the staging the all-reduce runs
    // on; a compressed bucket without views goes straight from the gradient to the wire copy.
    if (opt_.grad_view || !bk.compressed)
      COMM_RETURN_IF_ERROR(make_buffer(bk.layout.count * dtype_size(bk.layout.dtype), &bk.data));
    if (bk.compressed) bk.wirebuf = Buffer(bk.layout.count * dtype_size(bk.wire));  // host only (options.cc)
    for (size_t i = 0; i < bk.layout.params.size(); ++i) {
      param_bucket_[static_cast<size_t>(bk.layout.params[i])] = static_cast<int>(b);
      param_offset_[static_cast<size_t>(bk.layout.params[i])] = bk.layout.offset[i];
    }
  }
  if (dev_ != nullptr) COMM_RETURN_IF_ERROR(dev_->reserve(buckets.size()));
  buckets_ = std::move(buckets);
  last_buckets_.assign(buckets_.size(), comm_engine_bucket_stats_t{});
  ++layout_version_;
  return Status::Ok();
}

Status Engine::finalize() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    if (finalized_) return InvalidUsage(where("comm_engine_finalize") + "already finalized");
  }
  Status st = check_agreement();
  if (!st.ok()) {
    // Every rank found the same difference: break the engine without aborting anything.
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = st;
    return st;
  }
  uint64_t total_bytes = 0;  // the model's gradients: what the profile's engine entries are keyed by
  for (const auto& p : params_) total_bytes += static_cast<uint64_t>(p.count) * dtype_size(p.dtype);
  apply_profile(comm_, total_bytes, &opt_);
  std::lock_guard<std::mutex> lock(mu_);
  if (Status built = build(reverse_order(params_.size())); !built.ok()) {
    broken_ = under(built, where("comm_engine_finalize"), rank_);
    return broken_;
  }
  const size_t n = params_.size();
  state_.assign(n, ParamState::kWaiting);
  grad_ptr_.assign(n, nullptr);
  observed_.reserve(n);
  last_unused_.reserve(n);
  learnt_unused_.assign(n, 0);
  finalized_ = true;
  thread_ = std::thread([this] { comm_loop(); });
  return Status::Ok();
}

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
  next_bucket_ = 0;
  done_buckets_ = 0;
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
  if (!sync_) {  // no_sync: the framework keeps accumulating; nothing moves
    state_[p] = ParamState::kReady;
    return Status::Ok();
  }
  if (ptr == nullptr && !opt_.grad_view && params_[p].count > 0)
    return InvalidArgument(where(fn) + "gradient " + std::to_string(index) +
                           ": ptr is NULL (only gradient_as_bucket_view engines accept NULL for the view)");
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

// The one place a bucket goes on the wire.
Status Engine::run_bucket(int b) {
  if (dev_ != nullptr) {
    Status st = run_bucket_device(b);
    if (st.ok()) return st;
    return Status(st.code(), "rank " + std::to_string(rank_) + ", comm_engine bucket " + std::to_string(b) + " of step " +
                                 std::to_string(steps_ + 1) + " (device gradients): " + without_rank(st.message(), rank_) +
                                 (st.code() == COMM_ERR_TIMEOUT || st.code() == COMM_ERR_REMOTE
                                      ? " (a peer that reported a different set of gradients, called begin with a "
                                        "different sync flag or never called end leaves this bucket waiting)"
                                      : ""));
  }
  Bucket& bk = buckets_[static_cast<size_t>(b)];
  void* buf = bk.compressed ? bk.wirebuf.ptr : bk.data.ptr;
  comm_status_t s = comm_allreduce(comm_, buf, buf, bk.layout.count, bk.wire, opt_.op, nullptr);
  if (s != COMM_OK)
    return Status(s, "rank " + std::to_string(rank_) + ", comm_engine bucket " + std::to_string(b) + " of step " +
                         std::to_string(steps_ + 1) + ": " + without_rank(comm_last_error(nullptr), rank_) +
                         " (a peer that reported a different set of gradients, called begin with a different "
                         "sync flag or never called end leaves this bucket waiting)");
  const size_t es = dtype_size(bk.layout.dtype);
  for (size_t i = 0; i < bk.layout.params.size(); ++i) {
    const auto p = static_cast<size_t>(bk.layout.params[i]);
    const size_t off = bk.layout.offset[i], n = params_[p].count;
    if (n == 0) continue;
    char* view = bk.data.ptr != nullptr ? static_cast<char*>(bk.data.ptr) + off * es : nullptr;
    void* dst = grad_ptr_[p];
    if (bk.compressed) {
      const char* wire = static_cast<const char*>(bk.wirebuf.ptr) + off * dtype_size(bk.wire);
      if (view != nullptr) decompress(wire, reinterpret_cast<float*>(view), n, bk.wire);
      if (dst != nullptr && dst != view) {
        if (view != nullptr) std::memcpy(dst, view, n * es);
        else decompress(wire, static_cast<float*>(dst), n, bk.wire);
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
    cv_.wait(lock, [&] {
      return stop_ || (in_step_ && sync_ && broken_.ok() && next_bucket_ < static_cast<int>(buckets_.size()) &&
                       buckets_[static_cast<size_t>(next_bucket_)].ready);
    });
    if (stop_) return;
    // Buckets in index order, whatever order they became ready in: the same on every rank.
    const int b = next_bucket_++;
    buckets_[static_cast<size_t>(b)].start_us = now_us();
    running_ = true;
    lock.unlock();
    Status st = run_bucket(b);
    const double t = now_us();
    lock.lock();
    running_ = false;
    buckets_[static_cast<size_t>(b)].done_us = t;
    ++done_buckets_;
    cv_.notify_all();
    if (!st.ok()) {
      lock.unlock();
      (void)fail(st);
      lock.lock();
    }
  }
}

Status Engine::rebuild_from_rank0() {
  const std::string w = where("comm_engine_end");
  const size_t n = params_.size();
  std::vector<int32_t> order(observed_.begin(), observed_.end());
  for (size_t i = n; i-- > 0;)
    if (state_[i] == ParamState::kUnused) order.push_back(static_cast<int32_t>(i));
  if (order.size() != n) return Internal(w + "static graph: observed " + std::to_string(order.size()) + " of " + std::to_string(n) + " gradients");
  if (n > 0) COMM_RETURN_IF_ERROR(from_call(comm_broadcast(comm_, order.data(), order.data(), n, COMM_INT32, 0, nullptr), w + "static graph layout: "));
  std::vector<uint8_t> seen(n, 0);
  for (int32_t p : order) {
    if (p < 0 || static_cast<size_t>(p) >= n || seen[static_cast<size_t>(p)])
      return Internal(w + "static graph: rank 0's order is not a permutation of the parameters");
    seen[static_cast<size_t>(p)] = 1;
  }
  for (size_t p = 0; p < n; ++p) learnt_unused_[p] = state_[p] == ParamState::kUnused ? 1 : 0;
  // Views hold this step's reduced gradients, which the optimizer is about to read: carry them over.
  std::vector<Bucket> old = std::move(buckets_);
  std::vector<int> old_bucket = param_bucket_;
  std::vector<size_t> old_offset = param_offset_;
  COMM_RETURN_IF_ERROR(under(build(std::vector<int>(order.begin(), order.end())), w, rank_));
  if (opt_.grad_view)
    for (size_t p = 0; p < n; ++p) {
      const size_t es = dtype_size(params_[p].dtype);
      const Bucket& from = old[static_cast<size_t>(old_bucket[p])];
      const Bucket& to = buckets_[static_cast<size_t>(param_bucket_[p])];
      if (params_[p].count == 0) continue;
      char* dst = static_cast<char*>(to.data.ptr) + param_offset_[p] * es;
      const char* src = static_cast<const char*>(from.data.ptr) + old_offset[p] * es;
      if (dev_ != nullptr)  // after the old buckets' all-reduces, on the engine's stream
        COMM_RETURN_IF_ERROR(under(dev_->copy(dst, src, params_[p].count * es), w, rank_));
      else
        std::memcpy(dst, src, params_[p].count * es);
    }
  // The framework's gradients still point into the old views until it fetches the new ones
  // (after this end(), before the next begin()): they stay valid, with the reduced values, until then.
  retired_ = std::move(old);
  learnt_ = true;
  learning_ = false;
  COMM_INFO(kColl, "rank %d: static graph: buckets rebuilt from rank 0's ready order (%zu buckets)", rank_,
            buckets_.size());
  return Status::Ok();
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
  size_t missing = 0;
  int first_missing = -1;
  for (size_t p = 0; p < params_.size(); ++p)
    if (state_[p] == ParamState::kWaiting) {
      if (first_missing < 0) first_missing = static_cast<int>(p);
      ++missing;
    }
  if (missing > 0 && !opt_.find_unused) {
    Status st = InvalidUsage(where(fn) + std::to_string(missing) + " of " + std::to_string(params_.size()) +
                             " gradients were never reported (the first: index " + std::to_string(first_missing) +
                             "); report every gradient each step, or set find_unused_parameters = 1. The engine "
                             "is aborted so the other ranks fail too; destroy it");
    lock.unlock();
    return fail(st);
  }
  for (size_t p = 0; p < params_.size() && missing > 0; ++p)
    if (state_[p] == ParamState::kWaiting) {
      state_[p] = ParamState::kUnused;
      if (Status st = zero_slot(static_cast<int>(p)); !st.ok()) {
        lock.unlock();
        return fail(under(st, where(fn), rank_));
      }
      last_unused_.push_back(static_cast<int>(p));
      mark_in_bucket(static_cast<int>(p), t_end);
    }
  std::sort(last_unused_.begin(), last_unused_.end());
  const double t_wait = now_us();
  // Bounded: every bucket is ready now and each all-reduce ends within the timeout. A comm_abort
  // on the trainer's communicator (the user cannot reach ours) ends the wait at once.
  auto finished = [&] { return done_buckets_ == static_cast<int>(buckets_.size()) || !broken_.ok(); };
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), finished)) {
    if (parent_->aborted.load(std::memory_order_acquire)) {
      lock.unlock();
      return fail(Aborted(where(fn) + "the communicator the engine was created on was aborted (comm_abort)"), true);
    }
  }
  const double t_done = now_us();
  if (!broken_.ok()) return broken_;
  // Numbers of this step, before a rebuild replaces the buckets.
  last_bytes_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    last_bytes_ += bk.layout.count * dtype_size(bk.wire);
    comm_engine_bucket_stats_t& s = last_buckets_[b];
    s.first_param = bk.layout.params.empty() ? -1 : bk.layout.params.front();
    s.num_params = static_cast<int>(bk.layout.params.size());
    s.bytes = bk.layout.count * dtype_size(bk.wire);
    s.ready_us = bk.ready_us - step_begin_us_;
    s.start_us = bk.start_us - step_begin_us_;
    s.done_us = bk.done_us - step_begin_us_;
    trace_.span(Trace::kBucketQueued, static_cast<int64_t>(b), steps_ + 1, bk.ready_us, bk.start_us);
    trace_.span(Trace::kBucketRun, static_cast<int64_t>(b), steps_ + 1, bk.start_us, bk.done_us);
  }
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
  trace_.span(Trace::kStep, static_cast<int64_t>(steps_ + 1), steps_ + 1, step_begin_us_, t_out);
  trace_.span(Trace::kEndWait, static_cast<int64_t>(steps_ + 1), steps_ + 1, t_wait, t_done);
  last_synced_ = true;
  ++steps_;
  ++synced_steps_;
  in_step_ = false;
  return Status::Ok();
}

void Engine::stats(comm_engine_stats_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_engine_stats_t s{};
  s.size = out->size;
  s.version = COMM_ENGINE_STATS_VERSION;
  s.steps = steps_;
  s.synced_steps = synced_steps_;
  s.last_synced = last_synced_ ? 1 : 0;
  s.num_buckets = static_cast<int>(buckets_.size());
  s.layout_version = layout_version_;
  if (synced_steps_ > 0) {
    s.bytes = last_bytes_;
    s.step_us = last_step_us_;
    s.exposed_comm_us = last_exposed_us_;
    const size_t nb = std::min(last_buckets_.size(), static_cast<size_t>(COMM_ENGINE_STATS_MAX_BUCKETS));
    for (const auto& b : last_buckets_) {
      s.comm_us += b.done_us - b.start_us;
      s.wait_us += b.start_us - b.ready_us;
    }
    s.num_bucket_stats = static_cast<int>(nb);
    std::copy(last_buckets_.begin(), last_buckets_.begin() + static_cast<std::ptrdiff_t>(nb), s.buckets);
    s.num_unused = static_cast<int>(last_unused_.size());
    for (size_t i = 0; i < last_unused_.size() && i < COMM_ENGINE_STATS_MAX_UNUSED; ++i) s.unused[i] = last_unused_[i];
  }
  s.overlap_ratio = s.comm_us > 0 ? std::clamp(1.0 - s.exposed_comm_us / s.comm_us, 0.0, 1.0) : 1.0;
  std::memcpy(out, &s, std::min(out->size, sizeof s));
}

Status Engine::unused(int* indices, int capacity, int* count) {
  std::lock_guard<std::mutex> lock(mu_);
  *count = static_cast<int>(last_unused_.size());
  for (int i = 0; i < capacity && i < *count; ++i) indices[i] = last_unused_[static_cast<size_t>(i)];
  return Status::Ok();
}

Status Engine::destroy() {
  bool mid_step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mid_step = in_step_ && sync_ && broken_.ok();
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
