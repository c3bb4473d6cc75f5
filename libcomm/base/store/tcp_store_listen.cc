// Opening rank 0's store port: bind (the host MASTER_ADDR names, or every address), listen,
// and start the server thread (tcp_store_server.cc).
#include <netdb.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>

#include "log.h"
#include "store/tcp_store_server.h"

namespace comm::tcp_store {
namespace {

// Returns 0 or the errno of the step that failed.
int bind_and_listen(const sockaddr* sa, socklen_t len, bool dual_stack, posix::Fd* out) {
  posix::Fd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  int one = 1;
  if (setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) return errno;
  if (sa->sa_family == AF_INET6) {
    int v6only = dual_stack ? 0 : 1;
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  }
  if (::bind(fd.get(), sa, len) != 0) return errno;
  if (::listen(fd.get(), SOMAXCONN) != 0) return errno;
  *out = std::move(fd);
  return 0;
}

int bind_wildcard(int family, int port, posix::Fd* out, std::string* bound_host) {
  if (family == AF_INET6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    *bound_host = "::";
    return bind_and_listen(reinterpret_cast<sockaddr*>(&a), sizeof a, true, out);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  *bound_host = "0.0.0.0";
  return bind_and_listen(reinterpret_cast<sockaddr*>(&a), sizeof a, false, out);
}

}  // namespace

Status start_server(const TcpStoreOptions& options, std::shared_ptr<Store>* out) {
  if (options.port < 0 || options.port > 65535)
    return InvalidArgument("store port " + std::to_string(options.port) + " is not in 0..65535");
  const std::string& host = options.host;
  std::string bound_host = host;
  posix::Fd fd;
  int err = 0;
  if (host.empty()) {
    err = bind_wildcard(AF_INET6, options.port, &fd, &bound_host);
    if (err == EAFNOSUPPORT) err = bind_wildcard(AF_INET, options.port, &fd, &bound_host);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    std::string port_text = std::to_string(options.port);
    int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
    if (rc != 0)
      return SystemError("store: cannot resolve '" + host + "' to listen on (" + gai_strerror(rc) +
                         "); set MASTER_ADDR (or the host of tcp://HOST:PORT) to rank 0's host name or address");
    int family = AF_UNSPEC;
    const bool several = found != nullptr && found->ai_next != nullptr;
    for (addrinfo* ai = found; ai != nullptr && !several; ai = ai->ai_next) {
      if (family == AF_UNSPEC) family = ai->ai_family;
      err = bind_and_listen(ai->ai_addr, ai->ai_addrlen, false, &fd);
      if (err != EADDRNOTAVAIL) break;
    }
    freeaddrinfo(found);
    if (several) {
      // The name has several addresses and a rank may reach rank 0 through any one of them
      // (docs/topology.md, "Messy networks"): listen on every address.
      err = bind_wildcard(AF_INET6, options.port, &fd, &bound_host);
      if (err == EAFNOSUPPORT) err = bind_wildcard(AF_INET, options.port, &fd, &bound_host);
      if (err == 0)
        COMM_INFO(kStore, "store: '%s' has several addresses; listening on %s", host.c_str(),
                  host_port_string(bound_host, options.port).c_str());
    }
    if (err == EADDRNOTAVAIL) {
      // The name resolves, but not to an address of this host (NAT, a load balancer, a name
      // that means rank 0's host only from the outside): listen on every address instead.
      err = bind_wildcard(family, options.port, &fd, &bound_host);
      if (err == 0)
        COMM_INFO(kStore, "store: '%s' is not an address of this host; listening on %s instead", host.c_str(),
                  host_port_string(bound_host, options.port).c_str());
    }
  }
  std::string where = host_port_string(bound_host, options.port);
  if (err == EADDRINUSE)
    return SystemError("store: cannot listen on " + where + ": port " + std::to_string(options.port) +
                       " is already in use (another job, or a previous run that has not exited); pick another "
                       "MASTER_PORT (or the port of init_method tcp://HOST:PORT)");
  if (err != 0)
    return SystemError("store: cannot listen on " + where + ": " + errno_string(err) +
                       (err == EACCES ? "; ports below 1024 need privileges, pick another MASTER_PORT" : ""));

  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    return SystemError("store: getsockname on " + where + ": " + errno_string(errno));
  int port = local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  where = host_port_string(bound_host, port);

  posix::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return SystemError("store: eventfd: " + errno_string(errno));
  auto server = std::make_shared<Server>(std::move(fd), std::move(wake), port, where, options);
  COMM_RETURN_IF_ERROR(server->start_thread());
  COMM_INFO(kStore, "store server listening on %s", where.c_str());
  *out = std::move(server);
  return Status::Ok();
}

int server_port(const Store& store) {
  auto* server = dynamic_cast<const Server*>(&store);
  return server != nullptr ? server->port() : -1;
}

}  // namespace comm::tcp_store
