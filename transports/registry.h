// The one place that lists the host transports. The core picks a transport by the name the
// plan (or COMM_TRANSPORT) gives, and connects it through this table: it never names a
// transport itself, so adding one is a folder here and a row in registry.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport.h"

namespace comm::transport {

// ConnectRequest and Connected (what connect() takes and gives): transport.h.

struct TransportInfo {
  const char* name;        // what COMM_TRANSPORT and the plan call it
  bool host_local;         // reaches only the ranks on this host
  bool listens_on_interface;  // needs Options.listen (the core's choice of network interface)
  // Adopts a listener made before the init agreement (Options.early), whose address travels in
  // the verdict: the core makes one when this transport is likely to carry the world.
  bool listens_early;
  bool (*built)();         // usable here: compiled in, and (UCX) its library loads
  std::string (*not_built)();  // why not, for the message ("libucx-dev was not found when ...")
  // Every rank of the communicator calls it (host-local transports: those alone on their
  // host too, as the outcome is agreed). A non-OK status means nothing was agreed.
  Status (*connect)(const ConnectRequest& request, Connected* out);
};

const std::vector<TransportInfo>& registry();
// Per-peer routing behind one Transport: `near` reaches every rank r with is_local[r], `far`
// every other rank (it may reach all). The core combines two registry transports with it.
std::unique_ptr<Transport> make_routed_transport(Options options, std::unique_ptr<Transport> near,
                                                 std::unique_ptr<Transport> far, std::vector<bool> is_local);
const TransportInfo* find(const std::string& name);  // nullptr when no transport has that name
// The first built transport that reaches other hosts (the registry's order: sockets): where a
// host-local transport cannot serve, local peers take it. "" when none is built.
std::string first_reaching_other_hosts();
// The transport names a tuning profile's entry may give, as the core names a communicator's
// transports: each registry name, and "near+far" where ranks on this host take a host-local
// transport (or the first one reaching other hosts) and the others another: shm, socket, ucx,
// shm+socket, shm+ucx, socket+ucx.
std::vector<std::string> profile_names();
// The names, for messages: "shm, socket or ucx" (only those built, when built_only).
std::string names(bool built_only);

}  // namespace comm::transport
