// A rank's addresses on several interfaces (docs/topology.md, "Messy networks"): the listeners
// behind them, the text that publishes them, and which local interface the kernel routes a
// destination through, for messages and for what libcomm learns per (local interface, peer host).
#pragma once

#include <string>
#include <vector>

#include "posix/socket.h"

namespace comm::posix {

// An address of this host on a named interface.
struct LocalAddress {
  std::string ifname;   // "eth1"
  std::string address;  // numeric
  int family = 0;       // AF_INET / AF_INET6
};

// A published listening address: "eth1/10.77.0.2:41000" (an interface name holds no '/', ',' or
// whitespace on Linux); the interface part is only for messages.
struct Endpoint {
  std::string ifname;    // the publisher's interface ("" when it did not say)
  std::string hostport;  // "10.77.0.2:41000" or "[fd00::2]:41000"
};

// "eth1/10.77.0.2:41000,eth0/10.76.0.2:41007", in order of preference.
std::string encode_endpoints(const std::vector<Endpoint>& list);
// Also reads a bare "host:port" (one endpoint, no interface). False when empty or malformed.
bool decode_endpoints(const std::string& text, std::vector<Endpoint>* out);
// The host of "host:port" or "[v6]:port" (no brackets).
std::string endpoint_host(const std::string& hostport);

// One non-blocking, CLOEXEC listener per address, each on a port the kernel chooses. An address
// that cannot be listened on is left out (and named in *skipped); none at all is an error.
Status listen_on_each(const std::vector<LocalAddress>& where, int backlog, std::vector<Fd>* fds,
                      std::vector<Endpoint>* published, std::string* skipped = nullptr);

// The local address and interface the kernel would send to `to` from (a UDP socket's connect:
// no packet leaves). False when there is no route.
bool route_toward(const SockAddr& to, std::string* local_address, std::string* ifname);
// The interface that holds a local numeric address ("" when none does).
std::string interface_of(const std::string& address);

}  // namespace comm::posix
