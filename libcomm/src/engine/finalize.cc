// Registration ends here: every rank checks it registered the same list and options, the
// buckets are laid out and allocated once; a static graph rebuilds them once from rank 0's
// observed order.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dtype.h"
#include "engine/engine.h"
#include "engine/messages.h"
#include "engine_view.h"
#include "hash.h"
#include "log.h"

namespace comm::engine {
namespace {

// What every rank's registration must agree on, in the order check_agreement gathers it.
const char* const kHeaderNames[] = {"number of parameters", "bucket_cap_bytes", "first_bucket_bytes", "op",
                                    "wire_dtype", "gradient_as_bucket_view", "static_graph",
                                    "find_unused_parameters", "device gradients (stream != NULL)",
                                    "partition_bytes", "overlap_forward", "COMM_ENGINE_SCHEDULE=fifo",
                                    "a priority (comm_engine_set_priority)"};
constexpr size_t kHeader = 13;

}  // namespace

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

Status Engine::check_agreement() {
  const std::string w = where("comm_engine_finalize");
  int64_t mine[kHeader] = {static_cast<int64_t>(params_.size()), static_cast<int64_t>(opt_.bucket_cap_bytes),
                           static_cast<int64_t>(opt_.first_bucket_bytes), opt_.op, opt_.wire_dtype,
                           opt_.grad_view, opt_.static_graph, opt_.find_unused, opt_.stream != nullptr,
                           static_cast<int64_t>(std::min<size_t>(opt_.partition_bytes, INT64_MAX)),
                           opt_.overlap_forward, opt_.fifo, 0};
  // The priorities decide the wire order: a digest of them is compared like the options.
  mine[kHeader - 1] = static_cast<int64_t>(fnv1a(priority_.data(), priority_.size() * sizeof(int)) >> 1);
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
  std::vector<BucketLayout> layouts_again(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) layouts_again[b] = buckets[b].layout;
  std::vector<PartitionLayout> cut = cut_partitions(layouts_again, params_, priority_, opt_.partition_bytes);
  parts_.assign(cut.size(), Partition{});
  param_parts_.assign(params_.size(), {});
  for (size_t k = 0; k < cut.size(); ++k) {
    for (int p : cut[k].params) param_parts_[static_cast<size_t>(p)].push_back(static_cast<int>(k));
    parts_[k].layout = std::move(cut[k]);
  }
  round_buf_.assign(parts_.size(), 0);
  // A round every 4 partitions' worth of bytes: often enough for late first layers to overtake a
  // backlog, rare enough to cost little (libcomm/src/engine/schedule.cc).
  round_every_ = opt_.partition_bytes > SIZE_MAX / 4 ? SIZE_MAX : 4 * opt_.partition_bytes;
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

}  // namespace comm::engine
