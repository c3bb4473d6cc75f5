// Which network interface to use: NCCL_SOCKET_IFNAME with NCCL's exact semantics.
// A pure function of (spec, the machine's interfaces) so it is tested on made-up lists.
#pragma once

#include <string>
#include <vector>

#include "posix/endpoints.h"
#include "status.h"

namespace comm::topology {

struct Interface {
  std::string name;     // "eth0"
  std::string address;  // numeric, "192.0.2.2" or "fd00::2"
  int family = 0;       // AF_INET / AF_INET6
  bool up = true;
};

// The machine's interfaces that are up and have an address (getifaddrs).
std::vector<Interface> list_interfaces();

// spec: "" (unset) -> NCCL's default order: ib* first, then anything but docker*, lo and
// virbr*; those only when nothing else is up. "eth,ib" prefixes; "^docker" excludes;
// "=eth0" exact names; "^=eth0" exact exclusion. IPv4 before IPv6 within an interface.
// Empty result is COMM_ERR_SYSTEM saying what matched nothing. *why explains the choice.
Status select_interfaces(const std::string& spec, const std::vector<Interface>& all,
                         std::vector<Interface>* chosen, std::string* why);

// The interface a socket transport listens on: COMM_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME (as
// above); neither set and every rank on this host (all_local): lo, which keeps single-host
// traffic off the real NICs. A failure names the variable that matched nothing.
Status choose_socket_interface(bool all_local, Interface* chosen, std::string* why);

// Every address of the interfaces choose_socket_interface chooses among (the user's set, or the
// default order's tier), at most kMaxSocketAddresses: first the interface the kernel routes the
// store's host through (remember_store_host; the interface that already reaches rank 0), then
// the others in the order above. A socket listener listens on each, and its dialers try them
// all (docs/topology.md, "Messy networks"). Loopback alone where every rank is on this host.
constexpr size_t kMaxSocketAddresses = 8;
Status choose_socket_addresses(bool all_local, std::vector<posix::LocalAddress>* chosen, std::string* why);
// The store's host (MASTER_ADDR), once per process at init: the route toward it orders the above.
void remember_store_host(const std::string& host);
// The interface the kernel routes the store's host through, whatever the interface spec ("" unknown).
std::string store_route_interface();
// The order of `list` with the route toward `host` first, as above: the interface whose
// address the kernel sends to `host` from (route_toward) moves to the front, the rest keep
// their order. Exposed for the tests.
void put_route_first(const std::string& local_address, std::vector<Interface>* list);

}  // namespace comm::topology
