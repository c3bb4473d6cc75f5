#include "algorithms/shm_direct.h"

#include <unistd.h>

#include <algorithm>

#include "log.h"
#include "params.h"

namespace comm::algo {

size_t shm_chunk_bytes() {
  static const size_t value = [] {
    int64_t v = 262144;
    Status st = params::get_int("COMM_SHM_CHUNK_BYTES", 4096, int64_t{1} << 30, &v);
    if (!st.ok()) {
      COMM_WARN(kAlg, "%s; using 262144", st.message().c_str());
      v = 262144;
    }
    return static_cast<size_t>(v);
  }();
  return value;
}

DirectRun::DirectRun(Context& ctx, const CollArgs& args)
    : ctx_(ctx), args_(args), la_(*ctx.transport.local()) {
  n_ = static_cast<int>(la_.local_ranks().size());
  me_ = la_.local_index();
  esz_ = elem_size(args);
  ce_ = std::min(shm_chunk_bytes(), ctx.chunk_bytes) / esz_;
  if (ce_ == 0) ce_ = 1;
  // With more local ranks than cores, copying a peer's chunk as soon as it is reduced means a
  // sleep and a wake-up per chunk; gather at the end instead, when the peers are done.
  interleave_ = n_ <= sysconf(_SC_NPROCESSORS_ONLN);
  layout_ = BlockLayout{args.count, n_, false};
}

Status DirectRun::start() {
  COMM_RETURN_IF_ERROR(la_.begin(args_.tag));
  const size_t bytes = args_.count * esz_;
  COMM_RETURN_IF_ERROR(la_.expose(args_.sendbuf, args_.recvbuf, bytes, &work_));
  void* gathered = nullptr;
  COMM_RETURN_IF_ERROR(scratch_get(ctx_, static_cast<size_t>(n_) * sizeof(size_t), 2, &gathered));
  gathered_ = static_cast<size_t*>(gathered);
  std::fill(gathered_, gathered_ + n_, size_t{0});
  void* staging = nullptr;
  COMM_RETURN_IF_ERROR(scratch_get(ctx_, 3 * ce_ * esz_, 1, &staging));
  staging_[0] = static_cast<char*>(staging);
  staging_[1] = staging_[0] + ce_ * esz_;
  staging_[2] = staging_[1] + ce_ * esz_;
  for (int i = 0; i < n_; ++i) COMM_RETURN_IF_ERROR(la_.wait_posted(i));
  return Status::Ok();
}

Status DirectRun::operand(int i, size_t off, size_t len, int k, const char** out) {
  const size_t boff = off * esz_, blen = len * esz_;
  if (const char* p = la_.peer_addr(i, transport::Region::kInput, boff, blen)) {
    *out = p;
    return Status::Ok();
  }
  COMM_RETURN_IF_ERROR(la_.read(i, transport::Region::kInput, boff, staging_[k], blen));
  *out = staging_[k];
  return Status::Ok();
}

Status DirectRun::reduce_slice(bool publish, int divide_by) {
  const ReduceFn fn = reduce_fn(args_.dtype, args_.op);
  const size_t first = layout_.off(me_), len = layout_.len(me_);
  for (size_t c = 0; c < len; c += ce_) {
    const size_t l = clip(len, c, ce_);
    char* acc = work_ + (first + c) * esz_;
    // Every element: ((in_0 op in_1) op in_2) op ... -- one association, on one rank. With
    // more than two ranks the partial sums stay in cache-resident staging and only the last
    // step writes `acc`, which may be this rank's own input (in place): it is read first.
    const char *a = nullptr, *b = nullptr;
    COMM_RETURN_IF_ERROR(operand(0, first + c, l, 0, &a));
    COMM_RETURN_IF_ERROR(operand(1, first + c, l, 1, &b));
    char* partial = n_ == 2 ? acc : staging_[2];
    fn(partial, a, b, l);
    for (int i = 2; i < n_; ++i) {
      COMM_RETURN_IF_ERROR(operand(i, first + c, l, i % 2, &a));
      fn(i == n_ - 1 ? acc : partial, partial, a, l);
    }
    if (divide_by > 0 && args_.op == COMM_AVG) avg_finalize(acc, l, args_.dtype, divide_by);
    if (!publish) continue;
    la_.publish_progress(c + l);
    if (!interleave_) continue;
    // One chunk behind: the peers are reducing the chunk we just did.
    for (int p = 0; p < n_; ++p)
      if (p != me_) COMM_RETURN_IF_ERROR(gather_upto(p, c < layout_.len(p) ? c : layout_.len(p)));
  }
  return Status::Ok();
}

void DirectRun::publish_slice() { la_.publish_progress(layout_.len(me_)); }

Status DirectRun::gather_upto(int p, size_t elems) {
  size_t& got = gathered_[static_cast<size_t>(p)];
  if (elems <= got) return Status::Ok();
  COMM_RETURN_IF_ERROR(la_.wait_progress(p, elems));
  const size_t off = (layout_.off(p) + got) * esz_;
  COMM_RETURN_IF_ERROR(
      la_.read(p, transport::Region::kOutput, off, static_cast<char*>(args_.recvbuf) + off, (elems - got) * esz_));
  got = elems;
  return Status::Ok();
}

Status DirectRun::gather_and_finish() {
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    const size_t len = layout_.len(p);
    for (size_t c = gathered_[static_cast<size_t>(p)]; c < len;) {  // chunk by chunk: progress shows early
      const size_t upto = c + ce_ < len ? c + ce_ : len;
      COMM_RETURN_IF_ERROR(gather_upto(p, upto));
      c = upto;
    }
  }
  char* out = static_cast<char*>(args_.recvbuf);
  const size_t off = layout_.off(me_) * esz_;
  copy_bytes(out + off, work_ + off, layout_.len(me_) * esz_);  // shared staging: our own slice too
  return la_.finish();
}

}  // namespace comm::algo
