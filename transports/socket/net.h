// The socket transport's names for the ground floor's TCP helpers (posix/socket.h).
#pragma once

#include "posix/socket.h"

namespace comm::transport::sock {

using posix::Fd;
using posix::format_address;
using posix::listen_on;
using posix::parse_address;
using posix::peer_address;
using posix::set_nodelay;
using posix::SockAddr;

}  // namespace comm::transport::sock
