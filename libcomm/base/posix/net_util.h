// Helpers both TCP users (the store and the socket transport) need: printable addresses
// for log lines, and secret comparison that leaks nothing through timing.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

namespace comm::posix {

// "192.0.2.2:4242" or "[fd00::2]:4242"; "unknown" for anything else.
std::string format_address(const sockaddr* addr, socklen_t len);

// Constant time in the content: a stranger learns nothing from how fast it is refused.
bool constant_time_equal(std::string_view a, std::string_view b);

// EMFILE / ENFILE: the process (or the system) has no file descriptor left.
bool out_of_fds(int err);
// "ran out of file descriptors (ulimit -n 256) while accepting a connection: raise the limit
// (ulimit -n, LimitNOFILE=) ..." -- the cause and the fix, for every place a socket is made.
std::string out_of_fds_text(int err, const std::string& doing);

}  // namespace comm::posix
