// The hook between the communicator and the topology: this process's Topology and Plan, computed
// once, and the NCCL settings applied before NCCL's first init. Nothing here can make init fail:
// a source that cannot be read is a note, and a bad COMM_TOPO_XML falls back to probing.
#pragma once

#include <string>
#include <vector>

#include "policy.h"
#include "probe.h"

namespace comm {
class Store;
}

namespace comm::topology {

// COMM_TOPO_XML (hwloc or NCCL XML) or else NCCL_TOPO_FILE; live ibverbs, NVML and interfaces.
ProbeOptions probe_options_from_env();
// LOCAL_RANK (or Open MPI's / Slurm's), the NUMA node this thread runs on, COMM_LONG_HAUL_RTT_US.
Config config_from_env();

const Topology& topology_for_process();  // probed once
const Plan& plan_for_process();          // planned once (with the round trip prepare_process measured, if it ran)

// What every rank must agree on at init: the host transport per class of peer.
std::string peer_transport_digest();
// The host transport the plan picks for a class of peer (COMM_TRANSPORT / the API already folded in).
std::string host_transport_for(PeerClass c);

// Called from comm_init once the rendezvous store is up, once per process: measures the round trip
// to the store, plans, logs the plan at COMM_DEBUG=INFO and applies its NCCL_* settings.
// `profile_nccl`: the tuning profile's NCCL_* settings for this communicator (they beat the plan's).
void prepare_process(Store* store, const std::vector<NcclSetting>& profile_nccl = {});
// The plan's NCCL_* settings, with the tuning profile's over them, into the environment, once per
// process (never over the user's): prepare_process does it when the probe saw GPUs, the NCCL
// backend before NCCL's first init. Later calls change nothing (NCCL has read its environment).
// Returns whether `profile_nccl` is what the environment got: applied now, or the same earlier.
bool apply_nccl_settings_once(const std::vector<NcclSetting>& profile_nccl = {});

}  // namespace comm::topology
