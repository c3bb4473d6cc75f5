// Per-peer routing: ranks on this host over shared memory, the others over sockets, behind
// the same transport.h, so every algorithm runs unchanged over any mix of hosts. One-sided
// access (local()) is the shared-memory part's, for the algorithms that use it.
// make_routed_transport() is declared in registry.h: the core combines transports through the
// registry and never includes a transport's folder.
#pragma once

#include "registry.h"
