// Small helpers shared by the algorithm files: block geometry, the trivial cases every
// collective handles the same way (count == 0, one rank), and request bookkeeping.
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>

#include "algorithms/algorithm.h"
#include "dtype.h"

namespace comm::algo {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline size_t elem_size(const CollArgs& a) { return dtype_size(a.dtype); }

// Elements per pipelining chunk: at least one, whatever COMM_CHUNK_BYTES says.
inline size_t chunk_elems(const Context& ctx, size_t elem) {
  size_t ce = elem == 0 ? 0 : ctx.chunk_bytes / elem;
  return ce == 0 ? 1 : ce;
}

// Elements of chunk starting at `offset` in a range of `len` elements (0 past the end).
inline size_t clip(size_t len, size_t offset, size_t chunk) {
  if (offset >= len) return 0;
  return len - offset < chunk ? len - offset : chunk;
}

// How a buffer is cut into one block per rank: `uniform` blocks of `count` each
// (reduce_scatter, allgather, alltoall) or `count` split as evenly as possible, the first
// count % n blocks one element longer (allreduce, reduce).
struct BlockLayout {
  size_t count = 0;
  int n = 1;
  bool uniform = false;

  size_t off(int b) const {
    if (uniform) return static_cast<size_t>(b) * count;
    size_t ub = static_cast<size_t>(b), base = count / n, rem = count % n;
    return ub * base + (ub < rem ? ub : rem);
  }
  size_t len(int b) const {
    if (uniform) return count;
    return count / n + (static_cast<size_t>(b) < count % n ? 1 : 0);
  }
  size_t max_len() const { return len(0); }
};

inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
}

// count == 0 (nothing moves; barrier excepted) and size == 1 (a local copy, and avg's
// division by one) are the same for every algorithm. *done says whether the call is over.
Status run_trivial(const Context& ctx, const CollArgs& args, bool* done);

// Staging memory or a clear error when it cannot be had.
Status scratch_get(Context& ctx, size_t bytes, int slot, void** out);

Status wait_one(transport::Transport& t, transport::RequestId id);

// Post one send and one receive (either may be zero bytes, then skipped) and wait for both.
Status exchange(Context& ctx, const CollArgs& args, int send_peer, const void* sendbuf, size_t send_bytes,
                int recv_peer, void* recvbuf, size_t recv_bytes);

// Up to `depth` (at most kMax) sends in flight, retired oldest first (a bounded use of the
// transport's request pool however many chunks a call has).
class SendWindow {
 public:
  static constexpr int kMax = 16;  // COMM_RING_SENDS' upper bound
  explicit SendWindow(transport::Transport& t, int depth = 2) : t_(t), depth_(depth < 1 ? 1 : depth > kMax ? kMax : depth) {}
  // Posts a send tagged with the caller's sequence index `idx` (increasing); when the window is
  // full, first waits for the oldest.
  Status post(int peer, const transport::OpTag& tag, const void* buf, size_t bytes, long idx);
  // Retires the sends that have completed, oldest first (transport progress without blocking),
  // and says whether post() would now go without waiting.
  Status has_room(bool* room);
  Status retire_oldest();
  // Waits every send whose index is <= idx (their buffers may then be overwritten).
  Status retire_through(long idx);
  Status retire_all() { return retire_through(std::numeric_limits<long>::max()); }

 private:
  transport::Transport& t_;
  int depth_ = 2;
  transport::RequestId ids_[kMax] = {};
  long idx_[kMax] = {};
  int head_ = 0;
  int count_ = 0;
};

}  // namespace comm::algo
