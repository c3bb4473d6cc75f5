// UCX transport: UCP tag messages between the ranks' workers, whose addresses are exchanged
// through the communicator's store. UCX picks the wire per peer (InfiniBand/RoCE verbs where an
// HCA is up; tcp, posix/sysv shared memory and cma otherwise; UCX_TLS narrows it).
#pragma once

#include <memory>
#include <string>

#include "transport.h"

namespace comm::transport {

// False when this build has no UCX (libucx-dev was not found): create fails with UNAVAILABLE.
bool ucx_built();
std::string ucx_why_not();  // why ucx_built() is false: not compiled in, or the library did not load

// Creates the worker, publishes its address in options.store, connects an endpoint to every
// peer. Bounded by timeout_ms; COMM_ERR_UNAVAILABLE when UCX cannot start here.
Status create_ucx_transport(const Options& options, std::unique_ptr<Transport>* out);

}  // namespace comm::transport
