// hwloc -> Topology: packages, NUMA nodes, cores, the PCI tree (GPUs, NVSwitches, RDMA devices,
// network interfaces) and hwloc's NVLink bandwidth matrix, from this machine or an XML export.
// Traps these exports taught us (tests/fixtures/README.md): I/O objects only appear with the I/O
// filter at KEEP_ALL; hwloc_get_common_ancestor_obj() dereferences NULL across host bridges, so
// locality is computed from parent chains here and compared without hwloc; GPUs are not always
// typed GPU (NVML devices can be COPROC, some exports hold only the PCI device).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "probe.h"
#include "topology_config.h"

#if COMM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace comm::topology {

#if COMM_HAVE_HWLOC
namespace {

struct HwlocHandle {
  hwloc_topology_t t = nullptr;
  HwlocHandle() { hwloc_topology_init(&t); }
  ~HwlocHandle() { hwloc_topology_destroy(t); }
  HwlocHandle(const HwlocHandle&) = delete;
  HwlocHandle& operator=(const HwlocHandle&) = delete;
};

std::string format_busid(unsigned domain, unsigned bus, unsigned dev, unsigned fn) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

std::string busid_of(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return format_busid(a.domain, a.bus, a.dev, a.func);
}

std::string info(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? v : "";
}

hwloc_obj_t pci_parent(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj->parent; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) return p;
    if (p->type != HWLOC_OBJ_OS_DEVICE) return nullptr;
  }
  return nullptr;
}

Locality locality_of(hwloc_topology_t t, hwloc_obj_t obj) {
  Locality where;
  for (hwloc_obj_t p = obj->parent; p != nullptr && hwloc_obj_type_is_io(p->type); p = p->parent) {
    if (p->type != HWLOC_OBJ_BRIDGE) continue;
    if (p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      const auto& d = p->attr->bridge.downstream.pci;
      char buf[48];
      std::snprintf(buf, sizeof buf, "host %04x:[%02x-%02x]", d.domain, d.secondary_bus, d.subordinate_bus);
      where.bridges.push_back(buf);
    } else {
      where.bridges.push_back(busid_of(p));
    }
  }
  std::reverse(where.bridges.begin(), where.bridges.end());
  hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(t, obj);
  if (anchor == nullptr) return where;
  if (anchor->nodeset != nullptr && hwloc_bitmap_weight(anchor->nodeset) == 1) {
    where.numa = hwloc_bitmap_first(anchor->nodeset);
  }
  hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, anchor);
  if (anchor->type == HWLOC_OBJ_PACKAGE) package = anchor;
  if (package == nullptr && anchor->cpuset != nullptr && !hwloc_bitmap_iszero(anchor->cpuset)) {
    for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PACKAGE, p)) != nullptr;)
      if (hwloc_bitmap_isincluded(anchor->cpuset, p->cpuset)) package = p;
  }
  if (package != nullptr) where.package = static_cast<int>(package->os_index);
  return where;
}

unsigned pci_class(hwloc_obj_t pci) { return pci->attr->pcidev.class_id; }
unsigned pci_vendor(hwloc_obj_t pci) { return pci->attr->pcidev.vendor_id; }

bool is_nvidia_gpu_function(hwloc_obj_t pci) { return pci_vendor(pci) == 0x10de && (pci_class(pci) >> 8) == 0x03; }

bool is_nvswitch(hwloc_obj_t pci) {
  if (pci->subtype != nullptr && std::strcmp(pci->subtype, "NVSwitch") == 0) return true;
  return pci_vendor(pci) == 0x10de && pci_class(pci) == 0x0680;
}

// An NVIDIA compute OS device: typed GPU or COPROC, from the CUDA or NVML backend.
bool is_cuda_or_nvml(hwloc_obj_t os) {
  auto type = os->attr->osdev.type;
  if (type != HWLOC_OBJ_OSDEV_GPU && type != HWLOC_OBJ_OSDEV_COPROC) return false;
  std::string backend = info(os, "Backend");
  if (backend == "CUDA" || backend == "NVML") return true;
  std::string name = os->name ? os->name : "";
  return name.rfind("cuda", 0) == 0 || name.rfind("nvml", 0) == 0;
}

// The number of bytes in a link-layer address "20:00:10:87:...": 20 for IPoIB, 6 for Ethernet.
int address_bytes(const std::string& address) {
  if (address.empty()) return 0;
  return static_cast<int>(std::count(address.begin(), address.end(), ':')) + 1;
}

std::vector<hwloc_obj_t> os_children(hwloc_obj_t pci) {
  std::vector<hwloc_obj_t> out;
  for (hwloc_obj_t c = pci->io_first_child; c != nullptr; c = c->next_sibling)
    if (c->type == HWLOC_OBJ_OS_DEVICE) out.push_back(c);
  return out;
}

RdmaKind classify_hca(hwloc_obj_t os, hwloc_obj_t pci, std::string* reason) {
  char buf[160];
  if (pci != nullptr && pci_vendor(pci) == 0x1d0f) {
    *reason = "Amazon vendor 0x1d0f: AWS EFA (SRD), not InfiniBand; NCCL reaches it through the aws-ofi-nccl plugin";
    return RdmaKind::kEfa;
  }
  if (pci != nullptr && pci_class(pci) == 0x0207) {
    std::snprintf(buf, sizeof buf, "PCI class 0x0207 (InfiniBand controller), vendor 0x%04x", pci_vendor(pci));
    *reason = buf;
    return RdmaKind::kInfiniBand;
  }
  if (pci != nullptr) {
    for (hwloc_obj_t sib : os_children(pci)) {
      if (sib->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && address_bytes(info(sib, "Address")) == 20) {
        *reason = std::string("IPoIB netdev ") + sib->name + " (20-byte link address) on the same PCI function";
        return RdmaKind::kInfiniBand;
      }
    }
  }
  for (int port = 1; port <= 4; ++port) {
    std::snprintf(buf, sizeof buf, "Port%dLID", port);
    std::string lid = info(os, buf);
    if (!lid.empty() && std::strtoul(lid.c_str(), nullptr, 0) != 0) {
      *reason = "port " + std::to_string(port) + " has InfiniBand LID " + lid;
      return RdmaKind::kInfiniBand;
    }
  }
  if (pci != nullptr && pci_vendor(pci) == 0x15b3 && pci_class(pci) == 0x0200) {
    *reason = "Mellanox Ethernet function (PCI class 0x0200): RoCE";
    return RdmaKind::kRoce;
  }
  return rdma_kind_from_name(os->name ? os->name : "", reason);
}

void add_hca(hwloc_topology_t t, hwloc_obj_t os, Topology* topo) {
  Hca hca;
  hca.name = os->name ? os->name : "?";
  hwloc_obj_t pci = pci_parent(os);
  if (pci != nullptr) {
    hca.busid = busid_of(pci);
    for (hwloc_obj_t sib : os_children(pci))
      if (sib->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && sib->name) hca.netdevs.push_back(sib->name);
  }
  hca.kind = classify_hca(os, pci, &hca.kind_reason);
  for (int n = 1; n <= 4; ++n) {
    char state_key[32], lid_key[32], gid_key[32];
    std::snprintf(state_key, sizeof state_key, "Port%dState", n);
    std::snprintf(lid_key, sizeof lid_key, "Port%dLID", n);
    std::snprintf(gid_key, sizeof gid_key, "Port%dGID0", n);
    std::string state = info(os, state_key);
    if (state.empty() && info(os, lid_key).empty() && info(os, gid_key).empty()) continue;
    RdmaPort port;
    port.number = n;
    // ibv_port_state numbering: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.
    static const char* const kStates[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
    int s = state.empty() ? -1 : std::atoi(state.c_str());
    port.state = (s >= 0 && s <= 5) ? kStates[s] : "";
    if (hca.kind == RdmaKind::kInfiniBand) port.link_layer = "InfiniBand";
    hca.ports.push_back(port);
  }
  hca.where = locality_of(t, os);
  topo->hcas.push_back(hca);
}

void add_interface(hwloc_topology_t t, hwloc_obj_t os, Topology* topo) {
  NetInterface itf;
  itf.name = os->name ? os->name : "?";
  hwloc_obj_t pci = pci_parent(os);
  itf.physical = pci != nullptr;
  itf.kind = address_bytes(info(os, "Address")) == 20 ? "IPoIB" : (itf.physical ? "physical" : "virtual");
  if (pci != nullptr) {
    itf.busid = busid_of(pci);
    for (hwloc_obj_t sib : os_children(pci))
      if (sib->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && sib->name) itf.hca = sib->name;
  }
  itf.where = locality_of(t, os);
  topo->interfaces.push_back(itf);
}

void add_gpu_from_pci(hwloc_obj_t pci, Locality where, Topology* topo) {
  Gpu gpu;
  gpu.busid = busid_of(pci);
  char buf[64];
  std::snprintf(buf, sizeof buf, "PCI vendor 0x10de, class 0x%04x", pci_class(pci));
  gpu.found_by = buf;
  gpu.model = info(pci, "PCIDevice");
  gpu.where = std::move(where);
  topo->gpus.push_back(gpu);
}

void read_nvlink_bandwidth(hwloc_topology_t t, Topology* topo) {
  unsigned nr = 1;
  hwloc_distances_s* dist = nullptr;
  if (hwloc_distances_get_by_name(t, "NVLinkBandwidth", &nr, &dist, 0) != 0 || nr == 0 || dist == nullptr) return;
  const unsigned n = dist->nbobjs;
  std::vector<std::string> ids(n);
  for (unsigned i = 0; i < n; ++i) {
    hwloc_obj_t o = dist->objs[i];
    if (o == nullptr) continue;
    if (o->type == HWLOC_OBJ_PCI_DEVICE) {
      ids[i] = busid_of(o);
    } else if (o->type == HWLOC_OBJ_OS_DEVICE) {
      hwloc_obj_t pci = pci_parent(o);
      ids[i] = pci ? busid_of(pci) : std::string("osdev ") + (o->name ? o->name : "?");
    } else {
      ids[i] = std::string(hwloc_obj_type_string(o->type)) + " " + std::to_string(o->logical_index);
    }
  }
  std::set<std::string> switches(topo->nvswitches.begin(), topo->nvswitches.end());
  for (unsigned i = 0; i < n; ++i) {
    for (unsigned j = 0; j < n; ++j) {
      hwloc_uint64_t v = dist->values[i * n + j];
      if (i == j || v == 0 || ids[i].empty() || ids[j].empty()) continue;
      NvLink e;
      e.from = ids[i];
      e.to = ids[j];
      e.to_kind = topo->gpu_by_busid(ids[j]) ? NvLink::End::kGpu
                  : switches.count(ids[j])     ? NvLink::End::kNvSwitch
                                               : NvLink::End::kOther;
      e.gbps = static_cast<double>(v) / 1000.0;  // hwloc reports MB/s
      e.links = 0;
      topo->nvlinks.push_back(e);
    }
  }
  hwloc_distances_release(t, dist);
}

void fill_from_hwloc(hwloc_topology_t t, Topology* topo) {
  topo->packages = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE));
  topo->numa_nodes = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
  topo->cores = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE));
  topo->pus = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU));
  hwloc_obj_t root = hwloc_get_root_obj(t);
  topo->machine = info(root, "DMIProductName");
  if (topo->machine.empty()) topo->machine = info(root, "HostName");

  for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(t, pci)) != nullptr;) {
    if (is_nvidia_gpu_function(pci)) {
      add_gpu_from_pci(pci, locality_of(t, pci), topo);
    } else if (is_nvswitch(pci)) {
      topo->nvswitches.push_back(busid_of(pci));
    }
  }
  for (hwloc_obj_t os = nullptr; (os = hwloc_get_next_osdev(t, os)) != nullptr;) {
    switch (os->attr->osdev.type) {
      case HWLOC_OBJ_OSDEV_OPENFABRICS: add_hca(t, os, topo); break;
      case HWLOC_OBJ_OSDEV_NETWORK: add_interface(t, os, topo); break;
      case HWLOC_OBJ_OSDEV_GPU:
      case HWLOC_OBJ_OSDEV_COPROC: {
        if (!is_cuda_or_nvml(os)) break;
        hwloc_obj_t pci = pci_parent(os);
        std::string busid = pci ? busid_of(pci) : "osdev " + std::string(os->name ? os->name : "?");
        auto it = std::find_if(topo->gpus.begin(), topo->gpus.end(), [&](const Gpu& g) { return g.busid == busid; });
        if (it == topo->gpus.end()) {
          Gpu gpu;
          gpu.busid = busid;
          gpu.found_by = std::string("OS device ") + (os->name ? os->name : "?") + " (" + info(os, "Backend") + ")";
          gpu.where = locality_of(t, os);
          topo->gpus.push_back(gpu);
          it = topo->gpus.end() - 1;
        }
        if (os->name) it->os_devices.push_back(os->name);
        std::string model = info(os, "GPUModel");
        if (!model.empty()) it->model = model;
        break;
      }
      default: break;
    }
  }
  sort_gpus(topo);
  read_nvlink_bandwidth(t, topo);
}

// The root element's version attribute, read before hwloc sees the file: hwloc 2 rejects
// version 3 XML with a bare EINVAL, which tells a user nothing.
Status check_hwloc_xml_version(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("topology file '" + path + "' cannot be read: " + errno_string(errno));
  std::string head(8192, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  size_t root = head.find("<topology");
  if (root == std::string::npos) return Status::Ok();
  size_t end = head.find('>', root);
  std::string tag = head.substr(root, end == std::string::npos ? std::string::npos : end - root);
  size_t v = tag.find("version=\"");
  if (v == std::string::npos) return Status::Ok();  // hwloc 1.x wrote none
  std::string version = tag.substr(v + 9, tag.find('"', v + 9) - (v + 9));
  int major = std::atoi(version.c_str());
  if (major >= 3) {
    char built[32];
    std::snprintf(built, sizeof built, "%u.%u.%u", HWLOC_API_VERSION >> 16, (HWLOC_API_VERSION >> 8) & 0xff,
                  HWLOC_API_VERSION & 0xff);
    return InvalidArgument("topology file '" + path + "' is hwloc " + version +
                           " XML (written by hwloc 3 or later); this libcomm uses the hwloc " + built +
                           " API, which reads only 1.x and 2.x XML. Export it again with hwloc 2's "
                           "lstopo (lstopo --of xml FILE), or give the NCCL topology XML instead");
  }
  return Status::Ok();
}

}  // namespace

Status load_hwloc_xml(const std::string& path, Topology* topo) {
  COMM_RETURN_IF_ERROR(check_hwloc_xml_version(path));
  HwlocHandle h;
  hwloc_topology_set_io_types_filter(h.t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_set_xml(h.t, path.c_str()) != 0)
    return InvalidArgument("hwloc cannot open topology file '" + path + "': " + errno_string(errno));
  if (hwloc_topology_load(h.t) != 0)
    return InvalidArgument("hwloc cannot load topology file '" + path + "' (" + errno_string(errno) +
                           "): it is not hwloc 1.x/2.x XML, or it is damaged");
  topo->source = "hwloc XML " + path;
  topo->offline = true;
  fill_from_hwloc(h.t, topo);
  return Status::Ok();
}

void probe_hwloc_live(Topology* topo) {
  HwlocHandle h;
  hwloc_topology_set_io_types_filter(h.t, HWLOC_TYPE_FILTER_KEEP_ALL);
  // Our NVML probe reads NVLink itself; hwloc's CUDA/OpenCL/GL plugins would initialise CUDA or
  // talk to an X server inside comm_init, which a library must not do. The libpciaccess plugin
  // ("pci") leaks on every load (LeakSanitizer sees it in each process); hwloc's Linux backend
  // reads the same PCI tree from sysfs.
  for (const char* name : {"cuda", "opencl", "nvml", "rsmi", "levelzero", "gl", "pci"})
    (void)hwloc_topology_set_components(h.t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  if (hwloc_topology_load(h.t) != 0) {
    topo->notes.push_back("hwloc: cannot read this machine (" + errno_string(errno) + "); no PCI information");
    return;
  }
  fill_from_hwloc(h.t, topo);
  char version[32];
  unsigned v = hwloc_get_api_version();
  std::snprintf(version, sizeof version, "%u.%u", v >> 16, (v >> 8) & 0xff);
  topo->notes.push_back(std::string("hwloc (API ") + version + "): PCI tree read from this machine");
}

#else  // !COMM_HAVE_HWLOC

Status load_hwloc_xml(const std::string& path, Topology*) {
  return Unavailable("topology file '" + path + "' is hwloc XML, but this libcomm was built without hwloc "
                     "(install libhwloc-dev and rebuild), or give the NCCL topology XML instead");
}

void probe_hwloc_live(Topology* topo) {
  topo->notes.push_back("hwloc: not in this build (no PCI tree: GPU and NIC placement unknown)");
}

#endif

}  // namespace comm::topology
