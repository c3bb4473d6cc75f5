// Pure helpers over the plain topology data: PCI paths, bus id spelling, the NVLink matrix.
#include "topology.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

namespace comm::topology {

const char* to_string(PathKind kind) {
  switch (kind) {
    case PathKind::kSameSwitch: return "same PCI switch";
    case PathKind::kSameHostBridge: return "same host bridge";
    case PathKind::kSameNuma: return "same NUMA node";
    case PathKind::kSamePackage: return "same socket, other NUMA node";
    case PathKind::kOtherSocket: return "other socket";
    case PathKind::kUnknown: break;
  }
  return "unknown";
}

const char* nccl_name(PathKind kind) {
  switch (kind) {
    case PathKind::kSameSwitch: return "PXB";
    case PathKind::kSameHostBridge: return "PHB";
    case PathKind::kSameNuma:
    case PathKind::kSamePackage: return "NODE";
    case PathKind::kOtherSocket: return "SYS";
    case PathKind::kUnknown: break;
  }
  return "?";
}

PathKind path_between(const Locality& a, const Locality& b) {
  size_t common = 0;
  while (common < a.bridges.size() && common < b.bridges.size() && a.bridges[common] == b.bridges[common]) ++common;
  // A root port has one downstream link, so sharing any bridge below the host bridge means
  // sharing a switch (or being functions of one card).
  if (common >= 2) return PathKind::kSameSwitch;
  if (common == 1) return PathKind::kSameHostBridge;
  if (a.numa >= 0 && b.numa >= 0) {
    if (a.numa == b.numa) return PathKind::kSameNuma;
    if (a.package >= 0 && a.package == b.package) return PathKind::kSamePackage;
    return PathKind::kOtherSocket;
  }
  if (a.package >= 0 && b.package >= 0)
    return a.package == b.package ? PathKind::kSamePackage : PathKind::kOtherSocket;
  return PathKind::kUnknown;
}

const char* to_string(RdmaKind kind) {
  switch (kind) {
    case RdmaKind::kInfiniBand: return "InfiniBand";
    case RdmaKind::kRoce: return "RoCE";
    case RdmaKind::kEfa: return "EFA";
    case RdmaKind::kIwarp: return "iWARP";
    case RdmaKind::kUnknown: break;
  }
  return "unknown";
}

bool Hca::usable_for_ib() const {
  if (kind != RdmaKind::kInfiniBand && kind != RdmaKind::kRoce) return false;
  if (ports.empty()) return true;
  return std::any_of(ports.begin(), ports.end(),
                     [](const RdmaPort& p) { return p.state.empty() || p.state == "ACTIVE"; });
}

const Gpu* Topology::gpu_by_busid(const std::string& busid) const {
  std::string want = normalize_busid(busid);
  for (const auto& g : gpus)
    if (g.busid == want) return &g;
  return nullptr;
}

std::string normalize_busid(const std::string& text) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) == 4 && bus <= 0xff &&
      dev <= 0x1f && fn <= 7) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain & 0xffffu, bus, dev, fn);
    if (domain <= 0xffff) return buf;
  }
  std::string out = text;
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool NvlinkMatrix::any() const {
  for (const auto& row : via)
    for (char c : row)
      if (c == 'D' || c == 'S') return true;
  return false;
}

NvlinkMatrix nvlink_matrix(const Topology& topo) {
  const size_t n = topo.gpus.size();
  NvlinkMatrix m;
  m.gbps.assign(n, std::vector<double>(n, 0.0));
  m.via.assign(n, std::vector<char>(n, '-'));
  std::map<std::string, size_t> gpu_at;
  for (size_t i = 0; i < n; ++i) gpu_at[topo.gpus[i].busid] = i;

  // The NVSwitches of one machine form one fabric: NVML (hence hwloc) sees only GPU-to-switch
  // links, never the trunks between DGX-2's baseboards, and NCCL likewise models every NVSwitch
  // of a system as a single NVS node. A GPU reaches another through it at the smaller of the two
  // GPUs' total bandwidth into the fabric.
  std::vector<std::vector<double>> direct(n, std::vector<double>(n, 0.0));
  std::vector<double> to_fabric(n, 0.0);
  for (const auto& e : topo.nvlinks) {
    auto from = gpu_at.find(e.from);
    if (from == gpu_at.end()) continue;
    size_t i = from->second;
    if (e.to_kind == NvLink::End::kGpu) {
      auto to = gpu_at.find(e.to);
      if (to != gpu_at.end() && to->second != i) direct[i][to->second] += e.gbps;
    } else if (e.to_kind == NvLink::End::kNvSwitch) {
      to_fabric[i] += e.gbps;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) {
        m.via[i][j] = 'X';
      } else if (double d = std::max(direct[i][j], direct[j][i]); d > 0) {
        // Both ends may report the same links: the larger view, not the sum.
        m.gbps[i][j] = d;
        m.via[i][j] = 'D';
      } else if (to_fabric[i] > 0 && to_fabric[j] > 0) {
        m.gbps[i][j] = std::min(to_fabric[i], to_fabric[j]);
        m.via[i][j] = 'S';
      }
    }
  }
  return m;
}

}  // namespace comm::topology
