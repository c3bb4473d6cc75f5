#include "posix/endpoints.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace comm::posix {

std::string encode_endpoints(const std::vector<Endpoint>& list) {
  std::string text;
  for (const auto& e : list) {
    if (!text.empty()) text += ',';
    if (!e.ifname.empty()) text += e.ifname + "/";
    text += e.hostport;
  }
  return text;
}

bool decode_endpoints(const std::string& text, std::vector<Endpoint>* out) {
  out->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const size_t slash = item.find('/');
    Endpoint e;
    if (slash != std::string::npos) {
      e.ifname = item.substr(0, slash);
      e.hostport = item.substr(slash + 1);
    } else {
      e.hostport = item;
    }
    SockAddr check;
    if (e.hostport.empty() || !parse_address(e.hostport, &check).ok()) return false;
    out->push_back(std::move(e));
    pos = end + 1;
  }
  return !out->empty();
}

std::string endpoint_host(const std::string& hostport) {
  const size_t colon = hostport.rfind(':');
  std::string host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

Status listen_on_each(const std::vector<LocalAddress>& where, int backlog, std::vector<Fd>* fds,
                      std::vector<Endpoint>* published, std::string* skipped) {
  fds->clear();
  published->clear();
  std::string problems;
  for (const auto& a : where) {
    Fd fd;
    SockAddr bound;
    Status st = listen_on(a.address, a.family, backlog, &fd, &bound);
    if (!st.ok()) {
      problems += (problems.empty() ? "" : "; ") + a.ifname + " " + a.address + ": " + st.message();
      continue;
    }
    fds->push_back(std::move(fd));
    published->push_back(Endpoint{a.ifname, format_address(bound)});
  }
  if (skipped != nullptr) *skipped = problems;
  if (fds->empty()) return SystemError(problems.empty() ? "no address to listen on" : problems);
  return Status::Ok();
}

bool route_toward(const SockAddr& to, std::string* local_address, std::string* ifname) {
  Fd fd(::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  SockAddr dest = to;
  // A port is needed for connect(); nothing is sent.
  if (dest.family() == AF_INET && reinterpret_cast<sockaddr_in*>(&dest.storage)->sin_port == 0)
    reinterpret_cast<sockaddr_in*>(&dest.storage)->sin_port = htons(9);
  if (dest.family() == AF_INET6 && reinterpret_cast<sockaddr_in6*>(&dest.storage)->sin6_port == 0)
    reinterpret_cast<sockaddr_in6*>(&dest.storage)->sin6_port = htons(9);
  if (::connect(fd.get(), dest.get(), dest.len) != 0) return false;
  SockAddr local;
  local.len = sizeof local.storage;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.len) != 0) return false;
  *local_address = endpoint_host(format_address(local));
  *ifname = interface_of(*local_address);
  return true;
}

std::string interface_of(const std::string& address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* ifa = list; ifa != nullptr && name.empty(); ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_name == nullptr) continue;
    char host[INET6_ADDRSTRLEN] = {};
    if (ifa->ifa_addr->sa_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr, host, sizeof host);
    else if (ifa->ifa_addr->sa_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, host, sizeof host);
    else
      continue;
    if (address == host) name = ifa->ifa_name;
  }
  freeifaddrs(list);
  return name;
}

}  // namespace comm::posix
