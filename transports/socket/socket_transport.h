// TCP transport: a full mesh of non-blocking connections (several per peer), set up
// through the communicator's store, every connection authenticated with the job secret.
#pragma once

#include <memory>

#include "transport.h"

namespace comm::transport {

// Listens on the interface COMM_SOCKET_IFNAME / NCCL_SOCKET_IFNAME selects (NCCL's rules),
// publishes the address in options.store, connects to every peer. Bounded by timeout_ms.
Status create_socket_transport(const Options& options, std::unique_ptr<Transport>* out);

}  // namespace comm::transport
