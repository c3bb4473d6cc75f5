// Host collective algorithms, written against transport.h only: the registry
// ({name, can_run, run}, registry.cc) and the one selector that picks one per call (select.cc).
#pragma once

#include <cstddef>
#include <string_view>
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
  int peer = -1; // send / recv; COMM_ANY_SOURCE: a receive from whichever rank sends first
  int* source = nullptr;  // a receive from any rank: where the rank it came from goes (may be null)
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

// Every registered algorithm; within a collective, in fallback order.
const std::vector<Algorithm>& registry();

// OK when `name` is a registered algorithm (of any collective); else INVALID_ARGUMENT naming
// `source` ("COMM_ALGO", "tuning profile entry #3 ...") and listing every algorithm per collective.
Status check_name(std::string_view name, const char* source);

// What may override the default rules for one call, in the order select() tries them.
struct Overrides {
  std::string_view forced;   // COMM_ALGO; empty: none
  std::string_view profile;  // the tuning profile entry's algo for this call's size; empty: none
  const char* profile_source = "tuning profile";  // "tuning profile entry #3 (...)", for log lines
};

// Picks the algorithm for a call (select.cc): the forced name, then the profile's, if that
// algorithm can run this call; else the default rules; else the first algorithm of the
// collective, in registry order, that can run it. A named algorithm that cannot run is logged
// (one warning per algorithm). An unknown name: INVALID_ARGUMENT listing the known ones.
Status select(const Context& ctx, const CollArgs& args, const Overrides& overrides, const Algorithm** out);

// Runs the call with the selected algorithm (size==1 and count==0 handled by the algorithms).
// *chosen (when not null): the algorithm's name, for the flight recorder.
Status run_collective(Context& ctx, const CollArgs& args, const Overrides& overrides, const char** chosen = nullptr);

// The same with only a forced name (tests).
inline Status select(const Context& ctx, const CollArgs& args, std::string_view forced, const Algorithm** out) {
  Overrides overrides;
  overrides.forced = forced;
  return select(ctx, args, overrides, out);
}
inline Status run_collective(Context& ctx, const CollArgs& args, std::string_view forced) {
  Overrides overrides;
  overrides.forced = forced;
  return run_collective(ctx, args, overrides);
}

}  // namespace comm::algo
