// Real transports for ranks that are threads of this process: shared memory among ranks of one
// "host" (the host of each rank is given, so one process can hold several hosts) and sockets
// between hosts (per-peer routing), set up exactly as a communicator sets them up.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "status.h"
#include "transport.h"

namespace comm::testing {

// Creates one transport per rank (ranks as threads, over a fresh in-memory store).
// host_of[r]: rank r's host; ranks on one host talk over `near` (shm, socket or ucx), ranks on
// different hosts over `far` (socket or ucx); one transport for all when they are the same.
// heartbeat_ms > 0: idle detection judges silence (no watcher beats here: a test calls beat()).
Status make_real_transports(const std::vector<int>& host_of, int timeout_ms,
                            std::vector<std::unique_ptr<transport::Transport>>* out,
                            const std::string& near = "shm", const std::string& far = "socket", int heartbeat_ms = 0);

// host_of for n ranks on one host, or on two hosts with ranks alternating between them.
std::vector<int> one_host(int n);
std::vector<int> two_hosts(int n);

}  // namespace comm::testing
