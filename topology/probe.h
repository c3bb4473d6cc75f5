// Filling a Topology: from this machine (hwloc, ibverbs, NVML, getifaddrs + sysfs) or from a file
// (hwloc XML, NCCL's topology XML). Every live source is optional: a missing library or device is
// a note in Topology::notes ("none found"), never an error. Only a file that cannot be read fails.
#pragma once

#include <string>

#include "status.h"
#include "topology.h"

namespace comm::topology {

struct ProbeOptions {
  std::string file;             // COMM_TOPO_XML / --topology: read devices from this file instead of hwloc
  bool live_devices = true;     // ibverbs and NVML on this machine (ignored with a file)
  bool live_interfaces = true;  // getifaddrs + /sys/class/net (with a file: replaces the file's interfaces)
};
Status probe(const ProbeOptions& options, Topology* out);

// A topology file, hwloc XML (1.x, 2.x) or NCCL topology XML, told apart by its root element.
// hwloc 3 XML, which hwloc 2 cannot read, is a clear error rather than a crash.
Status load_topology_file(const std::string& path, Topology* out);

// The sources, each adding to *topo (probe() and load_topology_file() call them; tests too).
Status load_hwloc_xml(const std::string& path, Topology* topo);
Status parse_nccl_topo_xml(const std::string& text, const std::string& name, Topology* topo);
void probe_hwloc_live(Topology* topo);
void probe_ibverbs(Topology* topo);
void probe_nvml(Topology* topo);
void probe_interfaces(Topology* topo);

// Helpers shared by the sources.
RdmaKind rdma_kind_from_name(const std::string& name, std::string* reason);  // mlx5_0, efa0, irdma0...
void sort_gpus(Topology* topo);  // PCI bus id order, indices renumbered
// NCCL's per-link NVLink bandwidth (GB/s) by compute capability x10 (src/graph/topo.h).
double nvlink_gbps_per_link(int sm);
// The PCI function a sysfs device link resolves through ("/sys/class/net/eth0/device" ->
// "0000:00:03.0"), or "" when it is not a PCI device.
std::string sysfs_pci_busid(const std::string& device_link);

}  // namespace comm::topology
