// Reachability proven at init (docs/topology.md, "Reachability proven at init";
// issue 34): after the init verdict and before any transport connects, the first rank of each
// multi-homed host dials every published address of a few other hosts (a TCP handshake each,
// libcomm/base/posix/path_probe.h), one more store round tells every rank every outcome, and
// each rank seeds the process's path memory (posix/path_memory.h) with both directions: a path is
// trusted only where the handshake went through both ways. COMM_DEBUG=INFO says once per rank
// which interfaces reach which peers and why the others were dropped. Rank 0's summary of the
// round goes down the init verdict's tree (init_agreement.h, read_down_tree), not to every rank
// from its store (docs/design/base.md, "Hot keys").
#pragma once

#include <string>
#include <vector>

#include "init_agreement.h"
#include "params.h"
#include "status.h"
#include "store/store.h"

namespace comm {

struct ReachInput {
  int rank = 0;
  std::vector<int> host_of;        // every rank's host number (the verdict's)
  std::vector<std::string> table;  // every rank's published listener addresses (posix/endpoints.h); empty: none
  int timeout_ms = 0;              // COMM_TIMEOUT_MS: the round's store reads
  int connect_timeout_ms = params::kSocketConnectTimeoutDefaultMs;  // COMM_SOCKET_CONNECT_TIMEOUT_MS: one probe
  InitTree* tree = nullptr;  // the verdict's (Agreed::tree), for the summary; null: every rank reads the store
};

// Every rank calls it alike (what it does follows from the verdict alone). Nothing to do, and no
// store round, unless ranks are on several hosts and some host publishes more than one address.
// Fails only when the round itself fails (a prober gone: rank 0 says so to every rank).
Status prove_reachability(Store& store, const ReachInput& in);

}  // namespace comm
