// Idle detection's silence rule, one for every transport that beats (docs/design/core.md, "Idle
// detection"): sockets send HEARTBEAT frames (socket/heartbeat.cc), shared memory bumps a
// counter in its control segment (shm/shm_transport.cc). A peer that gave no sign of life for
// silence_limit_ms() is stopped (SIGSTOP, a debugger) or hung; silence_verdict() says so.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "status.h"

namespace comm::transport {

// How late a beat may come after its period: a socket wait's poll() blocks up to a second
// between beats (socket_transport_impl.h, kMaxBlockMs), and a watcher thread on a loaded host
// wakes late. A merely slow peer must never be taken for a stopped one.
constexpr int64_t kBeatLateMs = 1000;

// Silence is judged after the timeout, but never before two periods with their late beats.
inline int64_t silence_limit_ms(int64_t timeout_ms, int64_t heartbeat_ms) {
  return std::max<int64_t>(timeout_ms, 2 * (heartbeat_ms + kBeatLateMs));
}

// The verdict on a silent peer: `who` ("rank 2") gave no `sign` ("sent nothing, not even a
// heartbeat") for silent_ms.
inline Status silence_verdict(const std::string& who, const std::string& sign, int64_t silent_ms,
                              int64_t heartbeat_ms, int64_t timeout_ms) {
  return Timeout(who + " " + sign + " (every " + std::to_string(heartbeat_ms) + " ms, COMM_HEARTBEAT_MS), for " +
                 std::to_string(silent_ms) + " ms (COMM_TIMEOUT_MS " + std::to_string(timeout_ms) +
                 ", and at least two heartbeats each up to " + std::to_string(kBeatLateMs) + " ms late) while the communicator was idle: is it stopped "
                 "(SIGSTOP, a debugger) or hung?");
}

}  // namespace comm::transport
