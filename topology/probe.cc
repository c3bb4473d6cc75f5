// Which sources fill the Topology, in what order, and how a file's format is told apart.
#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "probe.h"

namespace comm::topology {
namespace {

// The root element's name, after the prolog (<?xml?>, <!DOCTYPE>, comments).
std::string root_element(const std::string& text) {
  size_t pos = 0;
  while (true) {
    pos = text.find('<', pos);
    if (pos == std::string::npos || pos + 1 >= text.size()) return "";
    if (text.compare(pos, 4, "<!--") == 0) {
      size_t end = text.find("-->", pos);
      if (end == std::string::npos) return "";
      pos = end + 3;
      continue;
    }
    if (text[pos + 1] == '?' || text[pos + 1] == '!') {
      pos = text.find('>', pos);
      if (pos == std::string::npos) return "";
      continue;
    }
    size_t end = text.find_first_of(" \t\r\n/>", pos + 1);
    return text.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
  }
}

// Interfaces seen live replace the ones a file described; what the file knew of a same-named
// interface (PCI placement, HCA) is kept.
void merge_live_interfaces(Topology* topo) {
  std::vector<NetInterface> from_file = std::move(topo->interfaces);
  topo->interfaces.clear();
  probe_interfaces(topo);
  for (auto& itf : topo->interfaces) {
    for (const auto& known : from_file) {
      if (known.name != itf.name) continue;
      if (itf.busid.empty()) itf.busid = known.busid;
      if (itf.hca.empty()) itf.hca = known.hca;
      if (itf.where.bridges.empty() && (!known.where.bridges.empty() || known.where.numa >= 0)) itf.where = known.where;
    }
  }
}

}  // namespace

Status load_topology_file(const std::string& path, Topology* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("topology file '" + path + "' cannot be read: " + errno_string(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  std::string root = root_element(text);
  *out = Topology{};
  if (root == "topology") return load_hwloc_xml(path, out);
  if (root == "system") return parse_nccl_topo_xml(text, path, out);
  return InvalidArgument("topology file '" + path + "' is neither hwloc XML (<topology>) nor NCCL topology XML "
                         "(<system>)" + (root.empty() ? std::string(": no XML element found") : ": its root is <" + root + ">"));
}

Status probe(const ProbeOptions& options, Topology* out) {
  *out = Topology{};
  if (!options.file.empty()) {
    COMM_RETURN_IF_ERROR(load_topology_file(options.file, out));
    if (options.live_devices) {
      probe_ibverbs(out);
      probe_nvml(out);
    }
    if (options.live_interfaces) {
      out->offline = false;
      merge_live_interfaces(out);
    }
    return Status::Ok();
  }
  out->source = "this machine";
  probe_hwloc_live(out);
  if (options.live_devices) {
    probe_ibverbs(out);
    probe_nvml(out);
  }
  if (options.live_interfaces) merge_live_interfaces(out);
  return Status::Ok();
}

RdmaKind rdma_kind_from_name(const std::string& name, std::string* reason) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("efa")) {
    *reason = "OpenFabrics name efa*: AWS EFA (SRD), not InfiniBand";
    return RdmaKind::kEfa;
  }
  if (starts("mlx4_") || starts("mlx5_") || starts("ibp")) {
    *reason = "OpenFabrics name " + name + ": Mellanox/NVIDIA HCA, link layer not reported (taken as InfiniBand)";
    return RdmaKind::kInfiniBand;
  }
  if (starts("rocep") || starts("bnxt_re") || starts("qedr") || starts("hns")) {
    *reason = "OpenFabrics name " + name + ": RoCE device";
    return RdmaKind::kRoce;
  }
  if (starts("irdma") || starts("i40iw") || starts("iwp") || starts("cxgb")) {
    *reason = "OpenFabrics name " + name + ": iWARP device, not InfiniBand";
    return RdmaKind::kIwarp;
  }
  *reason = "OpenFabrics name " + name + ": link layer unknown (rdma-core names devices rdmap* when it is unspecified)";
  return RdmaKind::kUnknown;
}

double nvlink_gbps_per_link(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86) return 12.0;
  if (sm >= 70) return 20.0;
  return 18.0;
}

void sort_gpus(Topology* topo) {
  std::stable_sort(topo->gpus.begin(), topo->gpus.end(),
                   [](const Gpu& a, const Gpu& b) { return a.busid < b.busid; });
  for (size_t i = 0; i < topo->gpus.size(); ++i) topo->gpus[i].index = static_cast<int>(i);
}

}  // namespace comm::topology
