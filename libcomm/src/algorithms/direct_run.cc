#include "algorithms/direct_run.h"

#include <algorithm>

#include "algorithms/stream_copy.h"

#include "log.h"
#include "params.h"

namespace comm::algo {

using Mark = transport::LocalAccess::Mark;

size_t shm_chunk_bytes() {
  static const size_t value = static_cast<size_t>(params::int_or_default("COMM_SHM_CHUNK_BYTES", log::kAlg));
  return value;
}

DirectRun::DirectRun(Context& ctx, const CollArgs& args)
    : ctx_(ctx), args_(args), la_(*ctx.transport.local()) {
  n_ = static_cast<int>(la_.local_ranks().size());
  me_ = la_.local_index();
  esz_ = elem_size(args);
  ce_ = std::min(ctx.shm_chunk_bytes != 0 ? ctx.shm_chunk_bytes : shm_chunk_bytes(), ctx.chunk_bytes) / esz_;
  if (ce_ == 0) ce_ = 1;
  layout_ = BlockLayout{args.count, n_, false};
  steps_ = (layout_.max_len() + ce_ - 1) / ce_;
  in_ = static_cast<const char*>(args.sendbuf);
  out_ = static_cast<char*>(args.recvbuf);
}

// Into this rank's output: from a slot or a peer's result that nothing else writes meanwhile.
void DirectRun::copy_out(char* dst, const char* src, size_t bytes) const {
  if (stream_out_)
    copy_bytes_streaming(dst, src, bytes);
  else
    copy_bytes(dst, src, bytes);
}

Status DirectRun::start() {
  COMM_RETURN_IF_ERROR(la_.begin(args_.tag));
  COMM_RETURN_IF_ERROR(la_.expose(in_, out_, args_.count * esz_, ce_ * esz_));
  // An ordinary output, out of place, larger than the caches: nobody reads it during the call.
  const size_t bytes = args_.count * esz_;
  const bool disjoint = out_ + bytes <= in_ || in_ + bytes <= out_;
  stream_out_ = la_.mapped_output(me_) == nullptr && disjoint && bytes >= streaming_threshold_bytes();
  if (n_ > 2) {
    void* partial = nullptr;
    COMM_RETURN_IF_ERROR(scratch_get(ctx_, ce_ * esz_, 1, &partial));
    partial_ = static_cast<char*>(partial);
  }
  for (int i = 0; i < n_; ++i) COMM_RETURN_IF_ERROR(la_.wait_posted(i));
  return Status::Ok();
}

// This rank's input chunks of the others' slices into its ring, once their owners have
// reduced what the ring slot held `depth` steps ago.
Status DirectRun::stage(uint64_t step) {
  if (la_.mapped_input(me_) == nullptr) {
    const uint64_t depth = la_.ring_depth();
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      if (step >= depth) COMM_RETURN_IF_ERROR(la_.wait_mark(s, Mark::kConsumed, step - depth + 1));
      copy_bytes(la_.in_slot(me_, step, s), in_ + byte_off(s, step), len_at(s, step) * esz_);
    }
  }
  la_.publish(Mark::kStaged, step + 1);
  return Status::Ok();
}

Status DirectRun::reduce(uint64_t step, char* target, int divide_by) {
  const size_t l = len_at(me_, step);
  const size_t off = byte_off(me_, step);
  const ReduceFn fn = reduce_fn(args_.dtype, args_.op);
  auto operand = [&](int i, const char** out) -> Status {
    if (i == me_) {
      *out = in_ + off;
    } else if (const char* mapped = la_.mapped_input(i)) {
      *out = mapped + off;
    } else {
      COMM_RETURN_IF_ERROR(la_.wait_mark(i, Mark::kStaged, step + 1));
      *out = la_.in_slot(i, step, me_);
    }
    return Status::Ok();
  };
  if (l > 0) {
    // ((in_0 op in_1) op in_2) op ...: with more than two ranks the partial sums stay in a
    // cache-sized buffer and only the last step writes `target`, which may be this rank's own
    // input (in place): that operand is read before.
    const char *a = nullptr, *b = nullptr;
    COMM_RETURN_IF_ERROR(operand(0, &a));
    COMM_RETURN_IF_ERROR(operand(1, &b));
    char* partial = n_ == 2 ? target : partial_;
    fn(partial, a, b, l);
    for (int i = 2; i < n_; ++i) {
      COMM_RETURN_IF_ERROR(operand(i, &a));
      fn(i == n_ - 1 ? target : partial, partial, a, l);
    }
    if (divide_by > 0 && args_.op == COMM_AVG) avg_finalize(target, l, args_.dtype, divide_by);
  }
  la_.publish(Mark::kConsumed, step + 1);
  return Status::Ok();
}

Status DirectRun::share(uint64_t step) {
  if (la_.mapped_output(me_) == nullptr) {
    const uint64_t depth = la_.ring_depth();
    if (step >= depth)
      for (int p = 0; p < n_; ++p)
        if (p != me_) COMM_RETURN_IF_ERROR(la_.wait_mark(p, Mark::kGathered, step - depth + 1));
    copy_bytes(la_.out_slot(me_, step), out_ + byte_off(me_, step), len_at(me_, step) * esz_);
  }
  la_.publish(Mark::kResult, step + 1);
  return Status::Ok();
}

Status DirectRun::gather(uint64_t step) {
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    const size_t l = len_at(p, step);
    COMM_RETURN_IF_ERROR(la_.wait_mark(p, Mark::kResult, step + 1));
    const size_t off = byte_off(p, step);
    const char* mapped = la_.mapped_output(p);
    copy_out(out_ + off, mapped != nullptr ? mapped + off : la_.out_slot(p, step), l * esz_);
  }
  la_.publish(Mark::kGathered, step + 1);
  return Status::Ok();
}

Status DirectRun::run_one_host(int divide_by) {
  const bool out_shared = la_.mapped_output(me_) != nullptr;
  const uint64_t depth = la_.ring_depth();
  for (uint64_t step = 0; step < steps_; ++step) {
    COMM_RETURN_IF_ERROR(stage(step));
    if (out_shared) {
      // Peers read the result where it lands.
      COMM_RETURN_IF_ERROR(reduce(step, out_ + byte_off(me_, step), divide_by));
      la_.publish(Mark::kResult, step + 1);
    } else {
      // Into the out-slot peers read, once they have copied what it held `depth` steps ago;
      // then into our own output.
      if (step >= depth)
        for (int p = 0; p < n_; ++p)
          if (p != me_) COMM_RETURN_IF_ERROR(la_.wait_mark(p, Mark::kGathered, step - depth + 1));
      char* slot = la_.out_slot(me_, step);
      COMM_RETURN_IF_ERROR(reduce(step, slot, divide_by));
      la_.publish(Mark::kResult, step + 1);
      copy_out(out_ + byte_off(me_, step), slot, len_at(me_, step) * esz_);
    }
    // One step behind: the peers are reducing the step we just did.
    if (step > 0) COMM_RETURN_IF_ERROR(gather(step - 1));
  }
  if (steps_ > 0) COMM_RETURN_IF_ERROR(gather(steps_ - 1));
  return Status::Ok();
}

Status DirectRun::reduce_scatter() {
  for (uint64_t step = 0; step < steps_; ++step) {
    COMM_RETURN_IF_ERROR(stage(step));
    COMM_RETURN_IF_ERROR(reduce(step, out_ + byte_off(me_, step), 0));
  }
  return Status::Ok();
}

Status DirectRun::share_and_gather() {
  for (uint64_t step = 0; step < steps_; ++step) {
    COMM_RETURN_IF_ERROR(share(step));
    if (step > 0) COMM_RETURN_IF_ERROR(gather(step - 1));
  }
  if (steps_ > 0) COMM_RETURN_IF_ERROR(gather(steps_ - 1));
  return Status::Ok();
}

Status DirectRun::finish() {
  if (stream_out_) streaming_fence();  // the caller (and any later publish) sees the result
  COMM_RETURN_IF_ERROR(la_.finish());
  // Per-peer bytes, once per call and peer (docs/observability.md, "Per-peer bytes over shared
  // memory"): from local rank p came its input of this rank's slice and its result slice; to it
  // went this rank's input of p's slice and this rank's result slice.
  const uint64_t mine = layout_.len(me_) * esz_;
  for (int p = 0; p < n_; ++p)
    if (p != me_) la_.count_bytes(p, layout_.len(p) * esz_ + mine, mine + layout_.len(p) * esz_);
  return Status::Ok();
}

}  // namespace comm::algo
