// TCP helpers of the ground floor (as NCCL's src/misc/socket.cc): numeric addresses and
// listening sockets, for every floor that listens or dials (the socket transport, the init
// agreement's early listener, the verdict tree).
#pragma once

#include <sys/socket.h>

#include <string>

#include "posix/fd.h"
#include "posix/net_util.h"
#include "status.h"

namespace comm::posix {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

inline std::string format_address(const SockAddr& a) { return format_address(a.get(), a.len); }
Status parse_address(const std::string& text, SockAddr* out);

// A non-blocking, CLOEXEC listening socket on a numeric host, port chosen by the kernel.
Status listen_on(const std::string& host, int family, int backlog, Fd* out, SockAddr* bound);

// The remote end of a connected socket, for log lines ("unknown" when it cannot be read).
std::string peer_address(int fd);

// Latency over throughput for small frames; large ones are written whole anyway.
void set_nodelay(int fd);

}  // namespace comm::posix
