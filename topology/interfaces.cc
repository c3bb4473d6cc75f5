// Interface selection with NCCL_SOCKET_IFNAME's exact semantics (NCCL's ncclFindInterfaces):
// users move between NCCL and libcomm with the same environment, so the same spec must pick
// the same interfaces.
#include "interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "params.h"

namespace comm::topology {
namespace {

struct Spec {
  bool exclude = false;  // leading '^'
  bool exact = false;    // '=' (after an optional '^')
  std::vector<std::string> items;
};

Spec parse_spec(const std::string& text) {
  Spec spec;
  std::string rest = text;
  if (!rest.empty() && rest[0] == '^') {
    spec.exclude = true;
    rest.erase(0, 1);
  }
  if (!rest.empty() && rest[0] == '=') {
    spec.exact = true;
    rest.erase(0, 1);
  }
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    if (comma > start) spec.items.push_back(rest.substr(start, comma - start));
    start = comma + 1;
  }
  return spec;
}

bool spec_selects(const Spec& spec, const std::string& name) {
  bool listed = false;
  for (const auto& item : spec.items) {
    if (spec.exact ? name == item : name.compare(0, item.size(), item) == 0) {
      listed = true;
      break;
    }
  }
  return spec.exclude ? !listed : listed;
}

// Interfaces in the order they first appear in `all`, IPv4 before IPv6 within each one.
std::vector<Interface> matching(const Spec& spec, const std::vector<Interface>& all) {
  std::vector<std::string> order;
  for (const auto& itf : all)
    if (std::find(order.begin(), order.end(), itf.name) == order.end()) order.push_back(itf.name);
  std::vector<Interface> out;
  for (const auto& name : order) {
    if (!spec_selects(spec, name)) continue;
    for (int family : {AF_INET, AF_INET6})
      for (const auto& itf : all)
        if (itf.up && itf.name == name && itf.family == family && !itf.address.empty()) out.push_back(itf);
  }
  return out;
}

std::string names_of(const std::vector<Interface>& list) {
  std::string text;
  std::vector<std::string> seen;
  for (const auto& itf : list) {
    if (std::find(seen.begin(), seen.end(), itf.name) != seen.end()) continue;
    seen.push_back(itf.name);
    if (!text.empty()) text += ", ";
    text += itf.name;
  }
  return text.empty() ? "none" : text;
}

std::vector<Interface> up_with_address(const std::vector<Interface>& all) {
  std::vector<Interface> out;
  for (const auto& itf : all)
    if (itf.up && !itf.address.empty() && (itf.family == AF_INET || itf.family == AF_INET6)) out.push_back(itf);
  return out;
}

}  // namespace

std::vector<Interface> list_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_name == nullptr) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0) continue;
    int family = ifa->ifa_addr->sa_family;
    char host[INET6_ADDRSTRLEN] = {};
    if (family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host) == nullptr) continue;
    } else if (family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      // Link-local addresses need a scope id on every connect; NCCL skips them too.
      const uint8_t* b = sin6->sin6_addr.s6_addr;
      if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) continue;
      if (inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host) == nullptr) continue;
    } else {
      continue;
    }
    out.push_back(Interface{ifa->ifa_name, host, family, true});
  }
  freeifaddrs(list);
  return out;
}

Status select_interfaces(const std::string& spec_text, const std::vector<Interface>& all,
                         std::vector<Interface>* chosen, std::string* why) {
  chosen->clear();
  std::vector<Interface> usable = up_with_address(all);
  // NCCL treats a spec of one character or less as unset (`strlen(env) > 1`).
  if (spec_text.size() > 1) {
    Spec spec = parse_spec(spec_text);
    *chosen = matching(spec, usable);
    if (chosen->empty()) {
      if (why) *why = "NCCL_SOCKET_IFNAME='" + spec_text + "' matched nothing";
      return SystemError("interface spec '" + spec_text +
                         "' (NCCL_SOCKET_IFNAME syntax: prefixes, ^ excludes, = exact names) matched no "
                         "interface that is up with an address; up: " +
                         names_of(usable));
    }
    if (why) *why = "NCCL_SOCKET_IFNAME='" + spec_text + "': chose " + names_of(*chosen);
    return Status::Ok();
  }

  // NCCL's default order: ib* first; then anything but docker*, lo and virbr*; those three only
  // when nothing else is up (docker, then virbr, then lo).
  static const char* const kTiers[] = {"ib", "^docker,lo,virbr", "docker", "virbr", "lo"};
  for (size_t tier = 0; tier < sizeof kTiers / sizeof kTiers[0]; ++tier) {
    *chosen = matching(parse_spec(kTiers[tier]), usable);
    if (chosen->empty()) continue;
    if (why) {
      *why = "NCCL_SOCKET_IFNAME unset: chose " + names_of(*chosen) +
             " (default order: ib*, then not docker/lo/virbr";
      *why += tier >= 2 ? "; nothing else is up, so docker*, virbr*, lo as a last resort)" : ")";
    }
    return Status::Ok();
  }
  if (why) *why = "NCCL_SOCKET_IFNAME unset: no interface is up with an address";
  return SystemError("no network interface is up with an IPv4 or global IPv6 address");
}

namespace {

// The interfaces COMM_SOCKET_IFNAME (else NCCL_SOCKET_IFNAME) selects, lo alone when neither is set
// and every rank is on this host (*loopback); *why names the variable the user set.
Status interfaces_for_sockets(bool all_local, std::vector<Interface>* list, bool* loopback, std::string* why) {
  std::string spec;
  std::string source = "COMM_SOCKET_IFNAME";
  COMM_RETURN_IF_ERROR(params::get_string("COMM_SOCKET_IFNAME", &spec));
  if (spec.empty()) {
    source = "NCCL_SOCKET_IFNAME";
    COMM_RETURN_IF_ERROR(params::get_string("NCCL_SOCKET_IFNAME", &spec));
  }
  *loopback = spec.empty() && all_local;
  if (*loopback) spec = "=lo";
  Status st = select_interfaces(spec, list_interfaces(), list, why);
  if (!st.ok()) return st.prefixed(spec.empty() || *loopback ? "" : source + " set: ");
  if (*loopback) *why = "all ranks on one host and no COMM_SOCKET_IFNAME/NCCL_SOCKET_IFNAME set: chose lo";
  if (source == "COMM_SOCKET_IFNAME" && why->rfind("NCCL_SOCKET_IFNAME", 0) == 0) why->replace(0, 18, source);
  return Status::Ok();
}

}  // namespace

Status choose_socket_interface(bool all_local, Interface* chosen, std::string* why) {
  std::vector<Interface> list;
  bool loopback = false;
  COMM_RETURN_IF_ERROR(interfaces_for_sockets(all_local, &list, &loopback, why));
  *chosen = list.front();
  return Status::Ok();
}

namespace {
std::mutex store_host_mu;
std::string& store_host() {
  static std::string* host = new std::string;  // never destroyed: read from any thread
  return *host;
}

// The local address the kernel would send to the store's host from ("" unknown).
std::string route_to_store(std::string* ifname = nullptr) {
  std::string host;
  {
    std::lock_guard<std::mutex> lock(store_host_mu);
    host = store_host();
  }
  if (host.empty()) return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  posix::SockAddr to;
  std::memcpy(&to.storage, res->ai_addr, res->ai_addrlen);
  to.len = static_cast<socklen_t>(res->ai_addrlen);
  freeaddrinfo(res);
  std::string local, name;
  if (!posix::route_toward(to, &local, &name)) return "";
  if (ifname != nullptr) *ifname = name;
  return local;
}
}  // namespace

std::string store_route_interface() {
  std::string name;
  route_to_store(&name);
  return name;
}

void remember_store_host(const std::string& host) {
  std::lock_guard<std::mutex> lock(store_host_mu);
  store_host() = host;
}

void put_route_first(const std::string& local_address, std::vector<Interface>* list) {
  std::string name;
  for (const auto& itf : *list)
    if (itf.address == local_address) name = itf.name;
  if (name.empty()) return;
  std::stable_partition(list->begin(), list->end(), [&](const Interface& itf) { return itf.name == name; });
}

Status choose_socket_addresses(bool all_local, std::vector<posix::LocalAddress>* chosen, std::string* why) {
  chosen->clear();
  std::vector<Interface> list;
  bool loopback = false;
  COMM_RETURN_IF_ERROR(interfaces_for_sockets(all_local, &list, &loopback, why));
  if (loopback) {
    list.resize(1);
  } else {
    const std::string route = route_to_store();
    put_route_first(route, &list);
    if (!route.empty() && !list.empty() && list.front().address == route)
      *why += "; " + list.front().name + " first (the route to the store's host)";
  }
  if (list.size() > kMaxSocketAddresses) list.resize(kMaxSocketAddresses);
  for (const auto& itf : list) chosen->push_back(posix::LocalAddress{itf.name, itf.address, itf.family});
  return Status::Ok();
}

}  // namespace comm::topology
