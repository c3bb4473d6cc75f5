// The host algorithms over real shared memory (ranks as threads, each with the transport a
// communicator would build): the one-sided all-reduces (shm_slots, shm_direct, hierarchical)
// for every dtype, op and count, and the two-sided algorithms of every collective over shm
// channels and over a mix of two "hosts" (shm inside, sockets between), against the same
// references and bit-for-bit comparisons as the in-process sweep.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "dtype.h"
#include "support/collective_check.h"
#include "ucx/ucx_transport.h"

using comm::transport::CollKind;
using namespace comm::testing;

namespace {

constexpr size_t kHuge = 1048579;
const comm_dtype_t kDtypes[] = {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16, COMM_INT8,
                                COMM_UINT8,   COMM_INT32,   COMM_UINT32,  COMM_INT64,    COMM_UINT64};
const comm_op_t kOps[] = {COMM_SUM, COMM_PROD, COMM_MIN, COMM_MAX, COMM_AVG};

// Restores the in-process wire when a test case ends, whatever happened.
struct WireScope {
  explicit WireScope(Wire w) : before(current_wire()) { set_wire(w); }
  ~WireScope() { set_wire(before); }
  Wire before;
};

// What select() picks when `algo` is forced: one-sided algorithms say "not me" outside their
// range, and the choice by size (shm_slots up to a slot; the default 64 KiB latency threshold
// between hosts) takes over.
std::string expected(const std::string& algo, size_t bytes, int n, Wire w) {
  const size_t slot = 16384, small = 65536;  // COMM_SHM_SLOT_BYTES' and COMM_SMALL_MSG_BYTES' defaults
  if (w == Wire::kShm) return algo == "shm_slots" && bytes > slot ? "shm_direct" : algo;
  const bool regular = n >= 4 && n % 2 == 0;  // two_hosts(): ranks alternate between two hosts
  if (algo == "hierarchical" && regular) return algo;
  if (algo.rfind("shm_", 0) == 0 || algo == "hierarchical") {
    if (bytes <= small) return "recursive_doubling";
    return regular ? "hierarchical" : "ring";
  }
  return algo;
}

void allreduce_sweep(Wire w, const std::vector<std::string>& algos, const std::vector<comm_dtype_t>& dtypes,
                     const std::vector<size_t>& counts, const std::vector<int>& ranks, bool every_op) {
  WireScope scope(w);
  if (std::getenv("COMM_SHM_SLOT_BYTES") || std::getenv("COMM_SMALL_MSG_BYTES")) return;  // expected() assumes defaults
  for (const auto& algo : algos)
    for (comm_dtype_t dt : dtypes)
      for (comm_op_t op : kOps) {
        if (!every_op && op != COMM_SUM && op != COMM_AVG) continue;
        for (size_t count : counts) {
          if (count == kHuge && op != COMM_SUM && dt != COMM_FLOAT32) continue;
          for (int n : ranks)
            for (bool in_place : {false, true}) {
              Case c;
              c.kind = CollKind::kAllreduce;
              c.algo = algo;
              c.expect_algo = expected(algo, count * comm::dtype_size(dt), n, w);
              c.dt = dt;
              c.op = op;
              c.count = count;
              c.n = n;
              c.in_place = in_place;
              INFO(c.label());
              CHECK(run_case(c) == "");
            }
        }
      }
}

struct Spec {
  CollKind kind;
  const char* name;
};
const Spec kTwoSided[] = {
    {CollKind::kAllreduce, "ring"},          {CollKind::kAllreduce, "recursive_doubling"},
    {CollKind::kBroadcast, "pipelined_chain"}, {CollKind::kBroadcast, "binomial_tree"},
    {CollKind::kReduce, "ring"},             {CollKind::kReduce, "binomial_tree"},
    {CollKind::kAllgather, "ring"},          {CollKind::kAllgather, "recursive_doubling"},
    {CollKind::kReduceScatter, "ring"},      {CollKind::kAlltoall, "pairwise"},
};

bool power_of_two(int n) { return (n & (n - 1)) == 0; }

// Every two-sided algorithm: a few dtypes, counts across the copy/zero-copy threshold.
void two_sided_sweep(Wire w, const std::vector<int>& ranks) {
  WireScope scope(w);
  for (const auto& spec : kTwoSided)
    for (comm_dtype_t dt : {COMM_FLOAT32, COMM_FLOAT16, COMM_INT64})
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{70001}})
        for (int n : ranks)
          for (bool in_place : {false, true}) {
            const bool reduces = spec.kind == CollKind::kAllreduce || spec.kind == CollKind::kReduce ||
                                 spec.kind == CollKind::kReduceScatter;
            Case c;
            c.kind = spec.kind;
            c.algo = spec.name;
            if (spec.kind == CollKind::kAllgather && c.algo == "recursive_doubling" && !power_of_two(n))
              c.expect_algo = "ring";
            c.dt = dt;
            c.op = reduces ? COMM_AVG : COMM_SUM;
            c.count = count;
            c.n = n;
            c.in_place = in_place;
            c.root = n - 1;
            INFO(c.label());
            CHECK(run_case(c) == "");
          }
}

}  // namespace

TEST_CASE("shm allreduce: shm_slots and shm_direct, every dtype, op and count, bitwise identical on all ranks",
          "[shm]") {
  std::vector<comm_dtype_t> all(std::begin(kDtypes), std::end(kDtypes));
  allreduce_sweep(Wire::kShm, {"shm_slots", "shm_direct"}, all, {0, 1, 7, 1023, 4099, kHuge}, {1, 2, 3, 4, 5}, true);
}

TEST_CASE("shm allreduce: the default choice is shm_slots up to a slot, shm_direct above", "[shm]") {
  WireScope scope(Wire::kShm);
  if (std::getenv("COMM_SHM_SLOT_BYTES") != nullptr) return;
  for (size_t count : {size_t{1}, size_t{4096}, size_t{4097}, kHuge}) {
    Case c;
    c.count = count;
    c.n = 3;
    c.expect_algo = count * 4 <= 16384 ? "shm_slots" : "shm_direct";
    INFO(c.label());
    CHECK(run_case(c) == "");
  }
}

TEST_CASE("shm: every two-sided algorithm of every collective runs unchanged over shared memory", "[shm]") {
  two_sided_sweep(Wire::kShm, {2, 3, 5});
}

TEST_CASE("two hosts x ranks: hierarchical allreduce (shm inside, sockets between), every dtype and op",
          "[shm]") {
  allreduce_sweep(Wire::kTwoHosts, {"hierarchical"}, {COMM_FLOAT32, COMM_FLOAT16, COMM_BFLOAT16, COMM_INT8, COMM_INT64},
                  {0, 1, 7, 1023, 70001, kHuge}, {4, 6, 3}, true);
}

TEST_CASE("two hosts x ranks: every algorithm of every collective over the shm+socket mix", "[shm]") {
  allreduce_sweep(Wire::kTwoHosts, {"shm_slots", "shm_direct"}, {COMM_FLOAT32}, {7, 70001}, {4}, false);
  two_sided_sweep(Wire::kTwoHosts, {4, 5});
}

TEST_CASE("shm pipelining: chunks of one element, short and empty last chunks", "[shm]") {
  for (Wire w : {Wire::kShm, Wire::kTwoHosts}) {
    WireScope scope(w);
    const std::pair<size_t, size_t> shapes[] = {{4, 7}, {8, 1023}, {24, 1023}, {1000, 70001}};
    for (const auto& [chunk, count] : shapes)
      for (comm_dtype_t dt : {COMM_FLOAT32, COMM_FLOAT64})
        for (int n : {2, 3, 4})
          for (bool in_place : {false, true}) {
            Case c;
            c.algo = w == Wire::kShm ? "shm_direct" : "hierarchical";
            c.expect_algo = expected(c.algo, count * comm::dtype_size(dt), n, w);
            c.dt = dt;
            c.op = COMM_AVG;
            c.count = count;
            c.n = n;
            c.in_place = in_place;
            c.chunk = chunk;
            INFO(c.label());
            CHECK(run_case(c) == "");
          }
  }
}

TEST_CASE("shm without process_vm_readv (COMM_SHM_CMA=0): the direct allreduce and the channels copy through "
          "shared staging",
          "[shm]") {
  setenv("COMM_SHM_CMA", "0", 1);
  reset_wire_cache();
  allreduce_sweep(Wire::kShm, {"shm_direct", "ring"}, {COMM_FLOAT32, COMM_FLOAT16, COMM_INT64}, {1, 1023, 70001, kHuge},
                  {2, 3}, false);
  two_sided_sweep(Wire::kShm, {3});
  unsetenv("COMM_SHM_CMA");
  reset_wire_cache();
}

// The same sweeps over UCX (issue 7): every rank pair over UCX, and UCX mixed with shared memory
// or sockets, hosts told apart per rank (ranks alternate between two "hosts").
TEST_CASE("ucx: every two-sided algorithm of every collective runs unchanged over UCX, 2 to 5 ranks",
          "[ucx_algorithms]") {
  if (!comm::transport::ucx_built()) return;
  two_sided_sweep(Wire::kUcx, {2, 3, 4, 5});
}

TEST_CASE("two hosts x ranks: shared memory inside, UCX between (the plan on InfiniBand/RoCE hosts)",
          "[ucx_algorithms]") {
  if (!comm::transport::ucx_built()) return;
  allreduce_sweep(Wire::kShmUcx, {"hierarchical"}, {COMM_FLOAT32, COMM_BFLOAT16, COMM_INT64}, {0, 7, 70001, kHuge},
                  {4, 3}, false);
  two_sided_sweep(Wire::kShmUcx, {4, 5});
}

TEST_CASE("two hosts x ranks: UCX and sockets mixed (sockets inside and UCX between, and the reverse)",
          "[ucx_algorithms]") {
  if (!comm::transport::ucx_built()) return;
  two_sided_sweep(Wire::kSocketUcx, {4});
  two_sided_sweep(Wire::kUcxSocket, {3, 5});
}
