// How many times this process's line has forked: 0 in the process that loaded libcomm, and one
// more in each child (pthread_atfork, registered at the first call). Something whose state must
// not be used twice -- a TLS connection's sequence numbers, whose nonces a child would seal again
// -- remembers the value when made and refuses to run where it differs.
#pragma once

#include <cstdint>

namespace comm::posix {

uint64_t fork_generation();

}  // namespace comm::posix
