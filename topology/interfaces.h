// Which network interface to use: NCCL_SOCKET_IFNAME with NCCL's exact semantics.
// A pure function of (spec, the machine's interfaces) so it is tested on made-up lists.
#pragma once

#include <string>
#include <vector>

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

}  // namespace comm::topology
