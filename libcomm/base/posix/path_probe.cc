#include "posix/path_probe.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "deadline.h"
#include "posix/endpoints.h"
#include "posix/socket.h"

namespace comm::posix {
namespace {

struct Dial {
  size_t group = 0, index = 0;
  Fd fd;
  bool done = false;
};

int ms_since(Clock::time_point t) {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

// Prefix length of a netmask (IPv4 or IPv6 bytes).
int prefix_length(const unsigned char* mask, size_t bytes) {
  int bits = 0;
  for (size_t i = 0; i < bytes; ++i)
    for (int b = 7; b >= 0; --b) bits += (mask[i] >> b) & 1;
  return bits;
}

}  // namespace

std::string errno_name(int err) {
  switch (err) {
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case ENETDOWN: return "ENETDOWN";
    case EHOSTDOWN: return "EHOSTDOWN";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ECONNREFUSED: return "ECONNREFUSED";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    default: return "";
  }
}

std::string probe_error_text(int err, int waited_ms) {
  if (err == kProbeNoAnswer)
    return "no answer to the TCP handshake within " + std::to_string(waited_ms) + " ms";
  if (err == kProbeOwnAddress) return "an address of this host itself";
  const std::string name = errno_name(err);
  return "connect(): " + errno_string(err) + (name.empty() ? "" : " (" + name + ")");
}

void probe_paths(const std::vector<std::vector<std::string>>& groups, int timeout_ms, int grace_ms,
                 std::vector<std::vector<ProbeResult>>* out) {
  const Clock::time_point start = Clock::now();
  out->assign(groups.size(), {});
  std::vector<Dial> dials;
  std::vector<Clock::time_point> answered(groups.size(), Clock::time_point::max());
  for (size_t g = 0; g < groups.size(); ++g) {
    // A group all of whose addresses are this host's is on this machine after all (ranks told
    // apart by COMM_HOST_ID): dialed like any other. Only an own address beside others is a
    // look-alike.
    bool all_own = true;
    for (const auto& hp : groups[g]) all_own = all_own && !interface_of(endpoint_host(hp)).empty();
    for (size_t k = 0; k < groups[g].size(); ++k) {
      ProbeResult r;
      r.hostport = groups[g][k];
      SockAddr addr;
      if (!parse_address(r.hostport, &addr).ok()) {
        r.err = EINVAL;
        (*out)[g].push_back(std::move(r));
        continue;
      }
      (void)route_toward(addr, &r.local_addr, &r.local_if);
      if (!all_own && !interface_of(endpoint_host(r.hostport)).empty()) {
        // A peer on another host published an address this host has: a dial there reaches
        // this host, never the peer (docs/topology.md, the look-alike bridge).
        r.err = kProbeOwnAddress;
        (*out)[g].push_back(std::move(r));
        continue;
      }
      Dial d;
      d.group = g;
      d.index = k;
      d.fd.reset(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!d.fd.valid()) {
        r.err = errno;
      } else if (::connect(d.fd.get(), addr.get(), addr.len) == 0) {
        answered[g] = std::min(answered[g], Clock::now());
      } else if (errno == EINPROGRESS || errno == EINTR) {
        r.err = kProbeNoAnswer;  // until it answers
        dials.push_back(std::move(d));
      } else {
        r.err = errno;
      }
      (*out)[g].push_back(std::move(r));
    }
  }
  const Deadline deadline = Deadline::after_ms(timeout_ms);
  std::vector<pollfd> pfds;
  std::vector<size_t> which;
  // Each turn polls first and gives up after: a prober the scheduler left waiting past a
  // deadline still reads the answers that came meanwhile (a busy host is not a dead path).
  for (;;) {
    pfds.clear();
    which.clear();
    Clock::time_point wake = deadline.at();
    for (size_t i = 0; i < dials.size(); ++i) {
      if (dials[i].done) continue;
      if (answered[dials[i].group] != Clock::time_point::max())
        wake = std::min(wake, answered[dials[i].group] + std::chrono::milliseconds(grace_ms));
      pfds.push_back(pollfd{dials[i].fd.get(), POLLOUT, 0});
      which.push_back(i);
    }
    if (pfds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
    const int n = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (size_t p = 0; n > 0 && p < pfds.size(); ++p) {
      if (pfds[p].revents == 0) continue;
      Dial& d = dials[which[p]];
      ProbeResult& r = (*out)[d.group][d.index];
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(d.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      r.err = err;
      r.waited_ms = ms_since(start);
      if (err == 0) answered[d.group] = std::min(answered[d.group], Clock::now());
      d.fd.reset();  // a plain close: the listener reads end of file before a Hello
      d.done = true;
    }
    const Clock::time_point now = Clock::now();
    for (auto& d : dials) {
      if (d.done || answered[d.group] == Clock::time_point::max() ||
          now < answered[d.group] + std::chrono::milliseconds(grace_ms))
        continue;
      ProbeResult& r = (*out)[d.group][d.index];
      r.waited_ms = ms_since(start);
      r.gave_up_early = true;
      d.fd.reset();
      d.done = true;
    }
    if (deadline.expired()) break;
  }
  for (auto& d : dials)
    if (!d.done) (*out)[d.group][d.index].waited_ms = ms_since(start);
}

std::string address_with_prefix(const std::string& address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return address;
  std::string text = address;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_netmask == nullptr) continue;
    char host[INET6_ADDRSTRLEN] = {};
    int bits = -1;
    if (ifa->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr, host, sizeof host);
      bits = prefix_length(
          reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(ifa->ifa_netmask)->sin_addr), 4);
    } else if (ifa->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, host, sizeof host);
      bits = prefix_length(
          reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in6*>(ifa->ifa_netmask)->sin6_addr),
          16);
    }
    if (bits >= 0 && address == host) {
      text = address + "/" + std::to_string(bits);
      break;
    }
  }
  freeifaddrs(list);
  return text;
}

}  // namespace comm::posix
