// Shared-memory transport among the ranks of one host: per-communicator segments (slots,
// channels, counters) that every local rank maps, futex waits, process_vm_readv single copies,
// and one-sided access (LocalAccess) for the algorithms that read peers' buffers in place.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport.h"
#include "transport.h"

namespace comm::transport {

namespace shm {
class Domain;
}

struct ShmConfig {
  std::string comm_id;           // names this communicator's segments (unique per job)
  std::vector<int> world_ranks;  // world rank of every rank of this communicator (empty: the identity)
  bool create_domain = false;    // the world communicator: create the job's arenas
};

// The result of the communicator-wide agreement: shm is used only if every rank could set it up.
struct ShmOutcome {
  std::unique_ptr<Transport> transport;  // this rank's local peers (nullptr when it has none)
  bool usable = false;                   // every rank's setup worked (else why_not says what failed)
  std::string why_not;
};

// Every rank of the communicator calls it, those alone on their host too: the outcome is agreed
// communicator-wide through options.store (a store barrier, after which the segments are
// unlinked). `*domain`: the job's arenas, created here for the world communicator (nullptr on
// entry) and passed in for the communicators derived from it. Local peers come from
// options.host_of. A non-OK status means the store itself failed (nothing was agreed).
Status connect_shm(const Options& options, const ShmConfig& config, std::shared_ptr<shm::Domain>* domain,
                   ShmOutcome* out);
// The same through the registry (registry.cc): the domain is the request's job memory.
Status connect_shm(const ConnectRequest& request, Connected* out);

}  // namespace comm::transport
