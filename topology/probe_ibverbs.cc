// RDMA devices and their ports from libibverbs: the link layer (InfiniBand vs Ethernet = RoCE),
// port state, active speed and width. Only probing; the IB data path is NCCL's and UCX's.
// Devices hwloc already found are completed by name (or PCI function); others are added.
// libibverbs.so.1 (or COMM_IBVERBS_LIBRARY) is opened with dlopen, never linked, so libcomm.so.1
// loads on a host without rdma-core; there the probe notes it and finds no RDMA port.
#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>

#include <string>
#include <type_traits>

#include "params.h"
#include "probe.h"
#include "topology_config.h"

#if COMM_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace comm::topology {

#if COMM_HAVE_IBVERBS
namespace {

// The calls the probe makes, typed by verbs.h. ibv_query_port is an inline in verbs.h that falls
// back to the exported symbol; Verbs::query_port below does the same through the table.
struct Verbs {
  std::string why_not;
#define COMM_IBV_FN(name) decltype(&::name) name = nullptr
  COMM_IBV_FN(ibv_get_device_list);
  COMM_IBV_FN(ibv_free_device_list);
  COMM_IBV_FN(ibv_get_device_name);
  COMM_IBV_FN(ibv_open_device);
  COMM_IBV_FN(ibv_close_device);
  COMM_IBV_FN(ibv_query_device);
#undef COMM_IBV_FN
  int (*compat_query_port)(ibv_context*, uint8_t, _compat_ibv_port_attr*) = nullptr;  // "ibv_query_port"

  int query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const {
    if (verbs_context* v = verbs_get_ctx_op(ctx, query_port)) return v->query_port(ctx, port, attr, sizeof *attr);
    *attr = {};
    return compat_query_port(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
};

const Verbs& verbs() {
  static const Verbs* table = [] {
    auto* v = new Verbs();  // never freed: providers stay loaded for the life of the process
    std::string path;
    (void)params::get_string("COMM_IBVERBS_LIBRARY", &path);
    const std::string name = path.empty() ? "libibverbs.so.1" : path;
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = dlerror();
      v->why_not = "libibverbs not loadable: dlopen(" + name + ") failed" + (err ? std::string(": ") + err : "") +
                   " (RDMA ports unknown)";
      return v;
    }
    std::string missing;
    auto resolve = [&](auto* fn, const char* symbol) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, symbol));
      if (*fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    };
    resolve(&v->ibv_get_device_list, "ibv_get_device_list");
    resolve(&v->ibv_free_device_list, "ibv_free_device_list");
    resolve(&v->ibv_get_device_name, "ibv_get_device_name");
    resolve(&v->ibv_open_device, "ibv_open_device");
    resolve(&v->ibv_close_device, "ibv_close_device");
    resolve(&v->ibv_query_device, "ibv_query_device");
    resolve(&v->compat_query_port, "ibv_query_port");
    if (!missing.empty()) v->why_not = name + " lacks " + missing + " (RDMA ports unknown)";
    return v;
  }();
  return *table;
}

// Gb/s per lane, by ibv_port_attr.active_speed (rdma-core's encoding).
double lane_gbps(unsigned speed) {
  switch (speed) {
    case 1: return 2.5;
    case 2: return 5.0;
    case 4: return 10.0;
    case 8: return 10.3125;  // FDR10
    case 16: return 14.0625;
    case 32: return 25.78125;
    case 64: return 53.125;
    case 128: return 106.25;
    case 256: return 212.5;
    default: return 0;
  }
}

int lanes(unsigned width) {
  switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

const char* port_state(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

void probe_ibverbs(Topology* topo) {
  const Verbs& ibv = verbs();
  if (!ibv.why_not.empty()) {
    topo->notes.push_back(ibv.why_not);
    return;
  }
  int count = 0;
  ibv_device** list = ibv.ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    topo->notes.push_back("libibverbs: no RDMA devices");
    if (list) ibv.ibv_free_device_list(list);
    return;
  }
  for (int i = 0; i < count; ++i) {
    const std::string name = ibv.ibv_get_device_name(list[i]);
    const std::string sys = std::string("/sys/class/infiniband/") + name;
    const std::string busid = sysfs_pci_busid(sys + "/device");
    auto it = std::find_if(topo->hcas.begin(), topo->hcas.end(), [&](const Hca& h) {
      return h.name == name || (h.name.empty() && !busid.empty() && h.busid == busid);
    });
    if (it == topo->hcas.end()) {
      Hca fresh;
      fresh.busid = busid;
      std::string numa = read_line(sys + "/device/numa_node");
      if (!numa.empty() && std::atoi(numa.c_str()) >= 0) fresh.where.numa = std::atoi(numa.c_str());
      if (DIR* d = opendir((sys + "/device/net").c_str())) {
        while (dirent* e = readdir(d))
          if (e->d_name[0] != '.') fresh.netdevs.push_back(e->d_name);
        closedir(d);
      }
      topo->hcas.push_back(fresh);
      it = topo->hcas.end() - 1;
    }
    it->name = name;
    ibv_context* ctx = ibv.ibv_open_device(list[i]);
    if (ctx == nullptr) {
      topo->notes.push_back("libibverbs: cannot open " + name + " (" + errno_string(errno) + "); ports unknown");
      continue;
    }
    ibv_device_attr attr{};
    if (ibv.ibv_query_device(ctx, &attr) == 0) {
      it->ports.clear();
      std::string layers;
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv.query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        RdmaPort port;
        port.number = p;
        port.state = port_state(pa.state);
        port.link_layer = pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
                          : pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                                                                     : "unspecified";
        port.gbps = lane_gbps(pa.active_speed) * lanes(pa.active_width);
        it->ports.push_back(port);
        if (layers.empty()) layers = port.link_layer;
      }
      if (attr.vendor_id == 0x1d0f || list[i]->transport_type == IBV_TRANSPORT_UNSPECIFIED) {
        it->kind = RdmaKind::kEfa;
        it->kind_reason = "libibverbs: vendor 0x1d0f / transport unspecified: AWS EFA (SRD), not InfiniBand";
      } else if (list[i]->transport_type == IBV_TRANSPORT_IWARP) {
        it->kind = RdmaKind::kIwarp;
        it->kind_reason = "libibverbs: transport iWARP, not InfiniBand";
      } else if (layers == "InfiniBand") {
        it->kind = RdmaKind::kInfiniBand;
        it->kind_reason = "libibverbs: port link layer InfiniBand";
      } else if (layers == "Ethernet") {
        it->kind = RdmaKind::kRoce;
        it->kind_reason = "libibverbs: port link layer Ethernet (RoCE)";
      }
    }
    ibv.ibv_close_device(ctx);
  }
  ibv.ibv_free_device_list(list);
}

#else

void probe_ibverbs(Topology* topo) { topo->notes.push_back("libibverbs: not in this build (RDMA ports unknown)"); }

#endif

}  // namespace comm::topology
