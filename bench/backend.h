// What the shared engine needs from a library: its collectives, and a few small helpers
// (barrier, a reduction of one number, an all-gather of bytes) to time and check them.
// comm-bench's backend is libcomm's C ABI; the peers (bench/peers/) are Gloo and Open MPI.
#pragma once

#include <comm/comm.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace bench {

struct Options;

class Backend {
 public:
  virtual ~Backend() = default;

  // Joins the job (rank and size from the launcher). "" on success, else why not.
  virtual std::string init(const Options& opt) = 0;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual std::string library() const = 0;    // "libcomm", "gloo", "mpi"
  virtual std::string version() const { return ""; }  // the library's release and commit, when it says
  virtual std::string transport() const = 0;  // what carries the bytes, as far as the library says
  virtual std::string algorithm() const = 0;  // what the library runs (or "auto (...)")
  // "" when this call can run, else why not (unsupported dtype, op, collective).
  virtual std::string unsupported(const char* coll, comm_dtype_t dtype, comm_op_t op) const = 0;

  // Buffers for the collectives; `registered`: the library's own allocator (-R 1).
  virtual void* alloc(size_t bytes, bool registered) = 0;
  virtual void release(void* ptr, bool registered) = 0;

  // The collectives, NCCL's counts and in-place rules. False: the call failed (see error()).
  virtual bool allreduce(const void* send, void* recv, size_t count, comm_dtype_t dt, comm_op_t op) = 0;
  virtual bool allgather(const void* send, void* recv, size_t sendcount, comm_dtype_t dt) = 0;
  virtual bool reduce_scatter(const void* send, void* recv, size_t recvcount, comm_dtype_t dt, comm_op_t op) = 0;
  virtual bool broadcast(const void* send, void* recv, size_t count, comm_dtype_t dt, int root) = 0;
  virtual bool reduce(const void* send, void* recv, size_t count, comm_dtype_t dt, comm_op_t op, int root) = 0;
  virtual bool alltoall(const void* send, void* recv, size_t count, comm_dtype_t dt) = 0;
  // Sends `count` elements to rank `to` while receiving as many from rank `from`.
  virtual bool sendrecv(const void* send, void* recv, size_t count, comm_dtype_t dt, int to, int from) = 0;

  // -z 0: calls between begin_batch and end_batch may return before they complete;
  // end_batch waits for all of them. Libraries without non-blocking calls ignore it.
  virtual bool begin_batch() { return true; }
  virtual bool end_batch() { return true; }

  virtual bool barrier() = 0;
  // One value reduced over all ranks (op: sum, min or max), for times and #wrong counts.
  virtual bool reduce_value(double in, comm_op_t op, double* out) = 0;
  // `bytes` from every rank into `out` (nranks * bytes), in rank order.
  virtual bool gather_bytes(const void* in, size_t bytes, void* out) = 0;
  // Every collective call made so far, per collective: "allreduce 123 calls 4567 bytes, ..." with
  // bytes as nccl-tests' size column counts them (what libcomm's metrics count); "" if not kept.
  virtual std::string calls_made() const { return ""; }

  // The last failure's message; abort() makes the other ranks fail fast instead of waiting.
  virtual std::string error() const = 0;
  virtual void abort() = 0;
  // Leaves the job gracefully. False: see error().
  virtual bool finish() = 0;
};

}  // namespace bench
