#include "posix/net_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <cerrno>

namespace comm::posix {

std::string format_address(const sockaddr* addr, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr != nullptr && addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(sin->sin_port));
  }
  if (addr != nullptr && addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host);
    // Appended piecewise: GCC 12's -Wrestrict misfires on "[" + std::string + "]:".
    std::string text = "[";
    text.append(host);
    text.append("]:");
    text.append(std::to_string(ntohs(sin6->sin6_port)));
    return text;
  }
  return "unknown";
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool out_of_fds(int err) { return err == EMFILE || err == ENFILE; }

std::string out_of_fds_text(int err, const std::string& doing) {
  if (err == ENFILE)
    return "the system ran out of file descriptors (ENFILE) while " + doing +
           ": raise fs.file-max, or run fewer processes on this host";
  rlimit lim{};
  std::string limit = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                          ? " (ulimit -n " + std::to_string(lim.rlim_cur) + ")"
                          : "";
  return "ran out of file descriptors" + limit + " while " + doing +
         ": raise the limit (ulimit -n, LimitNOFILE= in a unit file, or the launcher's setting)";
}

}  // namespace comm::posix
