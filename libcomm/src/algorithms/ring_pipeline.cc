#include "algorithms/ring_pipeline.h"

#include <algorithm>

#include "log.h"
#include "params.h"

namespace comm::algo {

namespace {

// One (step, chunk) of the schedule: what this rank sends right and receives from the left.
struct Item {
  bool reduce = false;   // a reduce-scatter item (received into staging, then reduced)
  bool last_rs = false;  // the owned block's final reduction
  const char* src = nullptr;
  size_t send_len = 0;
  char* dst = nullptr;  // allgather items: the final place; reduce-scatter: unused
  size_t recv_len = 0;
  int recv_block = 0;
  size_t chunk_off = 0;  // elements into the block
};

class RingRun {
 public:
  // COMM_RING_DEPTH: chunks in flight each way (receives posted ahead, sends not yet retired).
  static int depth_param() {
    static const int d = static_cast<int>(params::int_or_default("COMM_RING_DEPTH", log::kAlg));
    return d;
  }
  // COMM_RING_SENDS: sends in flight to the right neighbour. A send goes out as soon as its data
  // is final (its chunk of the previous step received and reduced), up to this many ahead, so
  // the kernel's socket buffer holds data to send while this rank waits for a CPU slice or for
  // its left neighbour: with only the chunk being worked on queued, a busy host idled the link.
  static int sends_param() {
    // The range is the registry's (params.cc); kMax is the window's capacity, which holds it.
    static const int d = static_cast<int>(
        std::min<int64_t>(params::int_or_default("COMM_RING_SENDS", log::kAlg), SendWindow::kMax));
    return d;
  }
  RingRun(Context& ctx, const CollArgs& args, const RingJob& job)
      : ctx_(ctx),
        args_(args),
        job_(job),
        depth_(depth_param()),
        sends_(ctx.transport, std::max(depth_param(), sends_param())) {}

  Status run() {
    const int n = ctx_.size;
    esz_ = elem_size(args_);
    ce_ = chunk_elems(ctx_, esz_);
    const size_t max_len = job_.layout.max_len();
    if (max_len == 0) return Status::Ok();
    nchunks_ = static_cast<long>((max_len + ce_ - 1) / ce_);
    left_ = mod(ctx_.rank - 1, n);
    right_ = mod(ctx_.rank + 1, n);
    owned_ = ring_owned_block(ctx_, job_);
    fn_ = reduce_fn(args_.dtype, args_.op);
    if (job_.rs_steps > 0) {
      void* staging = nullptr;
      COMM_RETURN_IF_ERROR(scratch_get(ctx_, static_cast<size_t>(depth_) * ce_ * esz_, 0, &staging));
      for (int i = 0; i < depth_; ++i) staging_[i] = static_cast<char*>(staging) + static_cast<size_t>(i) * ce_ * esz_;
    }
    const long total = total_items();
    const long ahead = depth_ - 1;
    for (long k = 0; k < ahead && k < total; ++k) COMM_RETURN_IF_ERROR(post_recv(k));
    for (long k = 0; k < total; ++k) {
      const Item it = item(k);
      // This item's send is due now (waiting for window room if need be); later ones whose data
      // is final go too while the window has room, never waiting: a rank blocked on a send
      // ahead of what its neighbour has posted receives for could wait on a ring of such waits.
      for (; next_send_ <= k; ++next_send_) COMM_RETURN_IF_ERROR(post_send(next_send_, item(next_send_)));
      COMM_RETURN_IF_ERROR(post_sends_ahead(k));
      // Posted before this chunk is reduced, so the next chunks' bytes land meanwhile.
      if (k + ahead < total) COMM_RETURN_IF_ERROR(post_recv(k + ahead));
      if (it.recv_len > 0) {
        COMM_RETURN_IF_ERROR(wait_one(ctx_.transport, recv_ids_[k % depth_]));
        if (it.reduce) finish_reduce(it, staging_[k % depth_]);
      }
    }
    return sends_.retire_all();
  }

 private:
  char* block_ptr(char* base, int b, size_t chunk_off) const { return base + (job_.layout.off(b) + chunk_off) * esz_; }
  const char* block_ptr(const char* base, int b, size_t chunk_off) const {
    return base + (job_.layout.off(b) + chunk_off) * esz_;
  }

  Item item(long k) const {
    const int n = ctx_.size;
    const int step = static_cast<int>(k / nchunks_);
    Item it;
    it.chunk_off = static_cast<size_t>(k % nchunks_) * ce_;
    if (step < job_.rs_steps) {
      const int sb = mod(ctx_.rank + job_.shift - step, n);
      it.reduce = true;
      it.last_rs = step == job_.rs_steps - 1;
      it.send_len = clip(job_.layout.len(sb), it.chunk_off, ce_);
      // Step 0 sends this rank's own contribution; later steps forward what was just reduced.
      it.src = step == 0 ? block_ptr(job_.in, sb, it.chunk_off) : block_ptr(job_.work, sb, it.chunk_off);
      it.recv_block = mod(sb - 1, n);
    } else {
      const int sb = mod(owned_ - (step - job_.rs_steps), n);
      it.send_len = clip(job_.layout.len(sb), it.chunk_off, ce_);
      it.src = block_ptr(job_.work, sb, it.chunk_off);
      it.recv_block = mod(sb - 1, n);
      it.dst = block_ptr(job_.work, it.recv_block, it.chunk_off);
    }
    it.recv_len = clip(job_.layout.len(it.recv_block), it.chunk_off, ce_);
    return it;
  }

  Status post_send(long j, const Item& it) {
    if (it.send_len == 0) return Status::Ok();
    return sends_.post(right_, args_.tag, it.src, it.send_len * esz_, j);
  }

  // Item j sends what item j - nchunks received (and reduced): final once the loop is past it,
  // so at item k the sends through k + nchunks - 1 may go. Step 0 sends this rank's own input.
  Status post_sends_ahead(long k) {
    const long last = std::min(total_items() - 1, k + nchunks_ - 1);
    while (next_send_ <= last) {
      const Item it = item(next_send_);
      if (it.send_len > 0) {
        bool room = false;
        COMM_RETURN_IF_ERROR(sends_.has_room(&room));
        if (!room) break;
      }
      COMM_RETURN_IF_ERROR(post_send(next_send_, it));
      ++next_send_;
    }
    return Status::Ok();
  }

  long total_items() const { return nchunks_ * (job_.rs_steps + job_.ag_steps); }

  Status post_recv(long k) {
    const Item it = item(k);
    if (it.recv_len == 0) return Status::Ok();
    char* dst = it.dst;
    if (it.reduce) {
      dst = staging_[k % depth_];
    } else if (job_.rs_steps > 0) {
      // This chunk of `work` (or of `in`, in place) went out during the reduce-scatter,
      // exactly rs_steps * nchunks items ago; that send must be done before it is overwritten.
      COMM_RETURN_IF_ERROR(sends_.retire_through(k - job_.rs_steps * nchunks_));
    }
    return ctx_.transport.irecv(left_, args_.tag, dst, it.recv_len * esz_, &recv_ids_[k % depth_]);
  }

  void finish_reduce(const Item& it, const char* received) {
    char* out = it.last_rs && job_.owned_out != nullptr ? job_.owned_out + it.chunk_off * esz_
                                                        : block_ptr(job_.work, it.recv_block, it.chunk_off);
    fn_(out, block_ptr(job_.in, it.recv_block, it.chunk_off), received, it.recv_len);
    if (it.last_rs && args_.op == COMM_AVG) avg_finalize(out, it.recv_len, args_.dtype, ctx_.size);
  }

  Context& ctx_;
  const CollArgs& args_;
  const RingJob& job_;
  int depth_ = 2;  // receives posted (and sends in flight) per direction
  SendWindow sends_;
  size_t esz_ = 0;
  size_t ce_ = 1;
  long nchunks_ = 0;
  long next_send_ = 0;  // items below it have their send posted
  int left_ = 0;
  int right_ = 0;
  int owned_ = 0;
  ReduceFn fn_ = nullptr;
  char* staging_[SendWindow::kMax] = {};
  transport::RequestId recv_ids_[SendWindow::kMax] = {};
};

}  // namespace

Status run_ring(Context& ctx, const CollArgs& args, const RingJob& job) {
  RingRun run(ctx, args, job);
  return run.run();
}

}  // namespace comm::algo
