// Host collective algorithms, written against transport.h only, and the registry that
// picks one per call ({name, can_run, run} with fallback; COMM_ALGO forces a choice).
#pragma once

#include <cstddef>
#include <vector>

#include "comm/comm.h"
#include "algorithms/scratch.h"
#include "status.h"
#include "transport.h"

namespace comm::algo {

using transport::CollKind;

// One collective call, already validated at the ABI.
struct CollArgs {
  CollKind kind = CollKind::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;  // NCCL's meaning per collective (allgather: per rank, ...)
  comm_dtype_t dtype = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
  int root = 0;  // broadcast / reduce
  int peer = -1; // send / recv
  transport::OpTag tag;  // filled by the communicator (seq, kind, count, dtype, op, root)
};

struct Context {
  transport::Transport& transport;
  int rank;
  int size;
  Scratch& scratch;      // staging memory, touched once and reused
  size_t chunk_bytes;    // pipelining granularity (COMM_CHUNK_BYTES, or the tuning profile)
  size_t shm_chunk_bytes = 0;  // shm_direct's chunk from the tuning profile; 0: COMM_SHM_CHUNK_BYTES
};

struct Algorithm {
  const char* name;
  CollKind kind;
  bool (*can_run)(const Context& ctx, const CollArgs& args);
  Status (*run)(Context& ctx, const CollArgs& args);
};

// Every registered algorithm, in preference order per kind.
const std::vector<Algorithm>& registry();

// Picks the algorithm for a call: `forced` (COMM_ALGO, may be "") names one; if it
// cannot run this call, the next that can is used and the fallback is logged.
// Unknown forced name: INVALID_ARGUMENT listing the known ones. `source` names where the
// forced name came from, for the fallback message ("COMM_ALGO", "tuning profile entry #3").
Status select(const Context& ctx, const CollArgs& args, const std::string& forced, const Algorithm** out,
              const char* source = "COMM_ALGO");

// Runs the call with the selected algorithm (size==1 and count==0 handled by the algorithms).
Status run_collective(Context& ctx, const CollArgs& args, const std::string& forced,
                      const char* source = "COMM_ALGO");

}  // namespace comm::algo
