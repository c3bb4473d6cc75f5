// What the gradient engine (engine/) needs from the core beyond the public header (comm.h): a
// communicator's rank and size, whether comm_abort was called on it, the one way to break it, and
// the tuning profile's entries matched to it at init. The engine includes this, never
// communicator.h, so the communicator's insides can change without touching the engine.
#pragma once

#include "comm/comm.h"
#include "status.h"
#include "tuning/apply.h"

namespace comm {

int rank_of(comm_t comm);
int size_of(comm_t comm);
// comm_abort was called on it (from any thread; an acquire load).
bool aborted(comm_t comm);
// The tuning profile's entries for its rank count and transport (null only before its init ends).
const tuning::Applied* tuning_of(comm_t comm);
// After each synced step of an engine created on comm (the trainer's): the step's numbers for the metrics
// (libcomm/src/observe/stats.h, Stats::engine_step; docs/observability.md).
void record_engine_step(comm_t comm, double step_us, double exposed_us, double comm_us);

// Records a failure that involved peers: the communicator is broken (the first failure sticks),
// its peers are told once, the failure is logged. The one way to break a communicator, for the
// core's calls, the device path and the engine alike. INVALID_ARGUMENT (found before anything
// moved) breaks nothing; after comm_abort the failure reads as ABORTED. Returns the failure.
// `order`: the failed call's OpTag::order, so that peers still in earlier calls finish them
// (transport.h, notify_peers); 0 when no call is known (every peer's wait fails at once).
Status fail_communicator(comm_t comm, Status st, uint64_t order = 0);

}  // namespace comm
