// The NCCL wrapper: creating an NCCL communicator and issuing NCCL calls on a stream, over the
// library opened with dlopen (libcomm/base/dl/nccl_library.h). It knows no libcomm
// communicator: the core's device path (libcomm/src/device/) decides when NCCL runs and owns
// the state; this is what it calls. Every wait is bounded and ended by an abort flag, because
// communicators are nonblocking (ncclConfig_t.blocking = 0).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "dl/nccl_library.h"
#include "status.h"
#include "store/store.h"
#include "transport.h"

namespace comm::nccl {

using dl::NcclLibrary;

// How to wait on a nonblocking NCCL communicator, and who we are in messages.
struct WaitPolicy {
  int timeout_ms = 600000;
  const std::atomic<bool>* aborted = nullptr;  // set by comm_abort: every wait ends
  std::string where;                           // "rank 2, comm 0: "
};

// Waits while r is ncclInProgress (asking comm for its async error), then converts the result:
// INVALID_ARGUMENT, INVALID_USAGE, REMOTE, SYSTEM or INTERNAL with NCCL's text and what to do.
Status settle(const NcclLibrary& nccl, ncclComm_t comm, ncclResult_t r, const char* what, const WaitPolicy& w);

// Rank 0 makes the unique id and publishes it under "nccl_id" in `store`; the others read it.
Status exchange_unique_id(const NcclLibrary& nccl, Store& store, int rank, const WaitPolicy& w, ncclUniqueId* id);

// ncclCommInitRankConfig, nonblocking, settled; *out stays null on failure. `name` must outlive
// the communicator (NCCL keeps the pointer).
Status init_comm(const NcclLibrary& nccl, int nranks, int rank, const ncclUniqueId& id, const char* name,
                 const WaitPolicy& w, ncclComm_t* out);

// ncclCommShrink (NCCL 2.27+), nonblocking, settled: the ranks of `comm` not in `excluded` make
// *out. abort_parent: NCCL_SHRINK_ABORT (the parent failed; its work is ended first).
// COMM_ERR_UNAVAILABLE when the loaded NCCL has no ncclCommShrink.
Status shrink_comm(const NcclLibrary& nccl, ncclComm_t comm, std::vector<int> excluded, bool abort_parent,
                   const char* name, const WaitPolicy& w, ncclComm_t* out);

// One call as NCCL sees it.
struct Call {
  transport::CollKind kind = transport::CollKind::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;
  comm_dtype_t dtype = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
  int root = 0;    // broadcast, reduce
  int peer = 0;    // send/recv (sendbuf set: a send)
  int nranks = 1;  // all-to-all: one send and one receive per rank
};
// Enqueues the call on `stream` (all-to-all as a group of sends and receives); *what names the
// NCCL call for messages; nullptr (and ncclInvalidUsage) for a collective NCCL has no call for.
ncclResult_t enqueue(const NcclLibrary& nccl, ncclComm_t comm, const Call& call, cudaStream_t stream,
                     const char** what);

// Graceful: ncclCommFinalize (flushes what is in flight, bounded) then destroy; otherwise, or
// when finalizing fails, abort.
void close_comm(const NcclLibrary& nccl, ncclComm_t comm, bool graceful, const WaitPolicy& w);

}  // namespace comm::nccl
