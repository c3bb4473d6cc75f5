#include "posix/socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace comm::posix {

Status parse_address(const std::string& text, SockAddr* out) {
  *out = SockAddr{};
  std::string host;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find("]:");
    if (close == std::string::npos) return InvalidArgument("malformed address '" + text + "'");
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return InvalidArgument("malformed address '" + text + "'");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port <= 0 || port > 65535)
    return InvalidArgument("malformed port in address '" + text + "'");
  auto* sin = reinterpret_cast<sockaddr_in*>(&out->storage);
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
  if (inet_pton(AF_INET, host.c_str(), &sin->sin_addr) == 1) {
    sin->sin_family = AF_INET;
    sin->sin_port = htons(static_cast<uint16_t>(port));
    out->len = sizeof(sockaddr_in);
    return Status::Ok();
  }
  if (inet_pton(AF_INET6, host.c_str(), &sin6->sin6_addr) == 1) {
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(static_cast<uint16_t>(port));
    out->len = sizeof(sockaddr_in6);
    return Status::Ok();
  }
  return InvalidArgument("malformed host in address '" + text + "'");
}

Status listen_on(const std::string& host, int family, int backlog, Fd* out, SockAddr* bound) {
  SockAddr addr;
  if (family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&addr.storage);
    sin6->sin6_family = AF_INET6;
    addr.len = sizeof(sockaddr_in6);
    if (inet_pton(AF_INET6, host.c_str(), &sin6->sin6_addr) != 1)
      return InvalidArgument("not a numeric IPv6 address: '" + host + "'");
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&addr.storage);
    sin->sin_family = AF_INET;
    addr.len = sizeof(sockaddr_in);
    if (inet_pton(AF_INET, host.c_str(), &sin->sin_addr) != 1)
      return InvalidArgument("not a numeric IPv4 address: '" + host + "'");
  }

  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return SystemError("socket() failed: " + errno_string(errno));
  if (::bind(fd.get(), addr.get(), addr.len) != 0)
    return SystemError("cannot bind to " + host + ": " + errno_string(errno));
  if (::listen(fd.get(), backlog) != 0) return SystemError("listen() on " + host + " failed: " + errno_string(errno));
  bound->len = sizeof bound->storage;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len) != 0)
    return SystemError("getsockname() failed: " + errno_string(errno));
  *out = std::move(fd);
  return Status::Ok();
}

std::string peer_address(int fd) {
  SockAddr addr;
  addr.len = sizeof addr.storage;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.len) != 0) return "unknown";
  return format_address(addr);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace comm::posix
