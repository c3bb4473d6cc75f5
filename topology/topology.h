// What the machine has, as plain data: GPUs, RDMA devices (HCAs), network interfaces,
// NVLink edges, and where each device sits (NUMA node, package, PCI bridges).
// Probes (hwloc, ibverbs, NVML, getifaddrs/sysfs) and file readers (hwloc XML, NCCL topology
// XML) fill it; the policy reads it. Nothing here touches the machine.
#pragma once

#include <string>
#include <vector>

namespace comm::topology {

// Where a device hangs: enough to compare two devices without hwloc.
struct Locality {
  int numa = -1;     // NUMA node (OS index); -1 unknown
  int package = -1;  // package / socket (OS index); -1 unknown
  // PCI bridges from the top down: the host bridge ("host 0004:[00-0a]", or "cpu 1" from an NCCL
  // topology file), then each bridge's bus id. Two devices sharing more than the host bridge are
  // behind one PCI switch.
  std::vector<std::string> bridges;
};

// NCCL's ordered path vocabulary, nearest first (PIX/PXB, PHB, NODE, SYS).
enum class PathKind { kSameSwitch = 0, kSameHostBridge, kSameNuma, kSamePackage, kOtherSocket, kUnknown };
const char* to_string(PathKind kind);   // "same PCI switch", ...
const char* nccl_name(PathKind kind);   // "PXB", "PHB", "NODE", "SYS", "?"
PathKind path_between(const Locality& a, const Locality& b);

struct Gpu {
  int index = 0;                          // position in PCI bus id order (CUDA_DEVICE_ORDER=PCI_BUS_ID)
  std::string busid;                      // "0000:04:00.0"
  std::string model;                      // "Tesla V100-SXM2-16GB", "" when unknown
  std::vector<std::string> os_devices;    // "cuda0", "nvml0"
  std::string found_by;                   // "PCI vendor 0x10de class 0x0302", "NVML", ...
  Locality where;
};

// InfiniBand and RoCE are what NCCL's IB transport and UCX use; EFA and iWARP are not InfiniBand.
enum class RdmaKind { kInfiniBand, kRoce, kEfa, kIwarp, kUnknown };
const char* to_string(RdmaKind kind);

struct RdmaPort {
  int number = 1;
  std::string state;       // "ACTIVE", "DOWN", "" unknown
  std::string link_layer;  // "InfiniBand", "Ethernet", "" unknown
  double gbps = 0;         // active speed x width; 0 unknown
};

struct Hca {
  std::string name;                    // the OpenFabrics device name: mlx5_0, mlx4_0, rdmap197s0
  std::string busid;                   // its PCI function, "" unknown
  RdmaKind kind = RdmaKind::kUnknown;
  std::string kind_reason;             // why this kind: "PCI class 0x0207 (InfiniBand controller)"
  std::vector<std::string> netdevs;    // IPoIB / RoCE netdevs on the same PCI function: hsi0, ib0
  std::vector<RdmaPort> ports;
  Locality where;
  // A device NCCL's IB transport can use: InfiniBand or RoCE, and no port known to be down.
  bool usable_for_ib() const;
};

struct NetInterface {
  std::string name;
  struct Address {
    std::string text;  // numeric
    int family = 0;    // AF_INET / AF_INET6
  };
  std::vector<Address> addresses;  // in getifaddrs order; empty when down or read from a file
  bool up = true;
  bool physical = true;        // backed by a device (PCI, virtio), not veth/bridge/loopback/tun
  std::string kind;            // "physical", "IPoIB", "veth", "bridge", "loopback", "virtual"
  std::string busid;           // its PCI device, "" when none or unknown
  std::string hca;             // the RDMA device on the same PCI function (IPoIB, RoCE), if any
  int speed_mbps = -1;         // -1 unknown
  Locality where;
};

// One NVLink edge as a probe saw it, from one end.
struct NvLink {
  std::string from;     // bus id of a GPU or an NVSwitch
  std::string to;       // bus id of the remote end
  enum class End { kGpu, kNvSwitch, kCpu, kSelf, kOther } to_kind = End::kOther;
  int links = 1;        // NVLink lanes in this edge
  double gbps = 0;      // bandwidth of the edge (GB/s); 0 unknown
};

struct Topology {
  std::string source;        // "this machine", "hwloc XML FILE", "NCCL topology FILE"
  bool offline = false;      // read from a file: interface state and addresses are not known
  std::string machine;       // DMI product name or host name, when known
  int packages = 0, numa_nodes = 0, cores = 0, pus = 0;
  std::vector<Gpu> gpus;
  std::vector<Hca> hcas;
  std::vector<NetInterface> interfaces;
  std::vector<std::string> nvswitches;  // bus ids
  std::vector<NvLink> nvlinks;
  std::vector<std::string> notes;       // what a source could not tell ("NVML: libnvidia-ml.so.1 not found")

  const Gpu* gpu_by_busid(const std::string& busid) const;
};

// GPU x GPU NVLink bandwidth (GB/s, NCCL's per-link figures or hwloc's measured ones).
// via[i][j]: 'D' direct links, 'S' through NVSwitch, '-' no NVLink path, 'X' the GPU itself.
struct NvlinkMatrix {
  std::vector<std::vector<double>> gbps;
  std::vector<std::vector<char>> via;
  bool any() const;
};
NvlinkMatrix nvlink_matrix(const Topology& topo);

// Bus ids compare equal whatever the case and however many domain digits ("0000:04:00.0").
std::string normalize_busid(const std::string& busid);

}  // namespace comm::topology
