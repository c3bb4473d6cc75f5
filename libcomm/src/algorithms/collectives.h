// The algorithms the registry knows, one per file; registry.cc lists them in fallback order.
#pragma once

#include "algorithms/algorithm.h"
#include "algorithms/common.h"

namespace comm::algo {

Algorithm ring_allreduce();
Algorithm recursive_doubling_allreduce();
Algorithm pipelined_chain_broadcast();
Algorithm binomial_tree_broadcast();
Algorithm binomial_tree_reduce();
Algorithm ring_reduce();
Algorithm ring_allgather();
Algorithm recursive_doubling_allgather();
Algorithm ring_reduce_scatter();
Algorithm pairwise_alltoall();
Algorithm dissemination_barrier();
Algorithm direct_sendrecv();
// Over one-sided shared memory (LocalAccess), where the transport offers it.
Algorithm shm_slots_allreduce();
Algorithm shm_direct_allreduce();
Algorithm hierarchical_allreduce();

}  // namespace comm::algo
