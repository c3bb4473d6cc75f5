// The algorithm table. Within a collective, the order is the fallback order: when neither a
// forced name nor the default rules give an algorithm that can run a call, select.cc takes the
// first one here whose can_run says yes.
#include "algorithms/collectives.h"

namespace comm::algo {

const std::vector<Algorithm>& registry() {
  static const std::vector<Algorithm> table = {
      ring_allreduce(),
      recursive_doubling_allreduce(),
      pipelined_chain_broadcast(),
      binomial_tree_broadcast(),
      ring_reduce(),
      binomial_tree_reduce(),
      ring_allgather(),
      recursive_doubling_allgather(),
      ring_reduce_scatter(),
      pairwise_alltoall(),
      dissemination_barrier(),
      direct_sendrecv(),
      shm_slots_allreduce(),
      shm_direct_allreduce(),
      hierarchical_allreduce(),
  };
  return table;
}

}  // namespace comm::algo
