// The gradient engine's random cases (tests/engine/engine_case.cc): a Spec draws a parameter list,
// ready orders and the engine's configuration from its seed; run_engine_case runs it on ranks as
// threads and compares what the engine reduced with a plain comm_allreduce of each gradient.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/comm.h"

namespace engine_test {

struct Spec {
  int n = 2;
  uint64_t seed = 1;
  int max_params = 40;
  size_t max_count = 5000;
  size_t max_total = SIZE_MAX;  // elements in the whole list
  comm_op_t op = COMM_AVG;
  int wire = COMM_UNSET;
  bool view = false;
  bool static_graph = false;
  bool find_unused = false;
  bool per_rank_order = false;
  bool mixed_dtypes = false;
  int nosync_steps = 0;
  int steps = 2;
  int threads = 1;  // reporting threads per rank
  int64_t cap = 64 << 10, first = 16 << 10;
  int64_t partition = COMM_UNSET;  // bytes; small ones split parameters
  bool overlap = false;            // overlap_forward: comm_engine_wait(p) before reading p
  bool check_wire_order = false;   // every rank ran the partitions in the same order
  bool jitter = false;             // random pauses between reports (ranks differ in what is ready when)

  std::string label() const {
    return "n=" + std::to_string(n) + " seed=" + std::to_string(seed) + " op=" + std::to_string(op) +
           " wire=" + std::to_string(wire) + " view=" + std::to_string(view) + " static=" + std::to_string(static_graph) +
           " unused=" + std::to_string(find_unused) + " per_rank_order=" + std::to_string(per_rank_order) +
           " nosync=" + std::to_string(nosync_steps) + " threads=" + std::to_string(threads) +
           " partition=" + std::to_string(partition) + " overlap=" + std::to_string(overlap);
  }
};

// Runs spec on its own world; "" when every check passed.
std::string run_engine_case(const Spec& s);

}  // namespace engine_test
