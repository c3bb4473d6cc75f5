// Connecting a communicator's ranks: the host transport for ranks on this host and for ranks on
// other hosts, from the topology plan (or the forced one), looked up in the transport registry.
#pragma once

#include "communicator.h"
#include "status.h"

namespace comm {

// Matches the tuning profile to the communicator, then connects every rank (a routed transport
// when local and remote peers take different transports). Every rank of the communicator calls
// it and decides alike: the host map is the same everywhere, a host-local setup is agreed.
Status connect_transport(comm_t c);

}  // namespace comm
