// Per-peer routing: ranks on this host over shared memory, the others over sockets, behind
// the same transport.h, so every algorithm runs unchanged over any mix of hosts. One-sided
// access (local()) is the shared-memory part's, for the algorithms that use it.
#pragma once

#include <memory>
#include <vector>

#include "transport.h"

namespace comm::transport {

// near: reaches every rank r with is_local[r]; far: every other rank (it may reach all).
std::unique_ptr<Transport> make_routed_transport(Options options, std::unique_ptr<Transport> near,
                                                 std::unique_ptr<Transport> far, std::vector<bool> is_local);

}  // namespace comm::transport
