// Checking harness for the collective algorithms: ranks as threads over InprocFabric, inputs
// a function of (rank, index), references in float64 (floats, with a tolerance) or in the
// integer type with wrap-around, and a bit-for-bit comparison of the ranks' results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"

namespace comm::testing {

using comm::algo::Context;
using comm::transport::CollKind;

constexpr size_t kDefaultChunk = 524288;
constexpr int kTimeoutMs = 20000;
// Ring, by default: two receives (COMM_RING_DEPTH) and eight sends (COMM_RING_SENDS); binomial
// reduce: two chunks of each child's data + sends.
constexpr size_t kMaxRequestsInFlight = 10;

size_t esize(comm_dtype_t dt);
// One Scratch per rank kept across cases, as a communicator keeps its own.
comm::algo::Scratch& rank_scratch(int rank);

bool is_reduction(CollKind k);

struct RunResult {
  std::vector<Status> status;
  std::vector<std::string> chosen;  // the algorithm select() picked on each rank
  size_t peak_requests = 0;
  size_t leftover = 0;  // requests never released plus messages never received
};

// Runs body on n rank threads, each with its own InprocTransport over one fresh fabric.
RunResult run_ranks(int n, size_t chunk_bytes, int timeout_ms, const std::function<Status(Context&, RunResult&)>& body);

// What run_case() runs over: the in-process double (default), or real transports kept per
// rank count and reused across cases (recreated after a failure): shared memory among ranks
// of one host, or ranks alternating between two "hosts" (shm inside, sockets between); UCX
// everywhere, or UCX mixed with shared memory or sockets (inside a host / between hosts).
enum class Wire { kInproc, kShm, kTwoHosts, kUcx, kShmUcx, kSocketUcx, kUcxSocket };
void set_wire(Wire w);
Wire current_wire();  // COMM_TEST_WIRE's (default: in-process) unless set
// Drops the cached real transports (e.g. after changing COMM_SHM_* in the environment).
void reset_wire_cache();

struct Case {
  CollKind kind = CollKind::kAllreduce;
  std::string algo;         // forced name
  std::string expect_algo;  // what select() must pick ("" = algo)
  comm_dtype_t dt = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
  size_t count = 0;
  int n = 1;
  bool in_place = false;
  int root = 0;
  size_t chunk = kDefaultChunk;

  std::string label() const;
};

// Runs one case on every rank through select()'s forced name and checks it; "" when every
// check passed, else what went wrong.
std::string run_case(const Case& c);

}  // namespace comm::testing
