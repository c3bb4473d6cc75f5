// NVLink state and peers per GPU from NVML, opened with dlopen so that one build serves machines
// with and without the NVIDIA driver: no libnvidia-ml.so.1 means "no NVLink information".
// The few NVML types used are declared here (nvml.h is not needed to build).
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "probe.h"

namespace comm::topology {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper)
enum { kRemoteGpu = 0, kRemoteIbmNpu = 1, kRemoteSwitch = 2 };

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*cc)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*remote_type)(nvmlDevice_t, unsigned, int*) = nullptr;  // optional (newer drivers)

  template <typename F>
  bool sym(F* fn, const char* symbol) {
    *fn = reinterpret_cast<F>(dlsym(lib, symbol));
    return *fn != nullptr;
  }
  bool load(std::string* why) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      *why = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
      return false;
    }
    bool ok = sym(&init, "nvmlInit_v2") && sym(&shutdown, "nvmlShutdown") && sym(&count, "nvmlDeviceGetCount_v2") &&
              sym(&handle, "nvmlDeviceGetHandleByIndex_v2") && sym(&pci, "nvmlDeviceGetPciInfo_v3") &&
              sym(&name, "nvmlDeviceGetName") && sym(&cc, "nvmlDeviceGetCudaComputeCapability") &&
              sym(&link_state, "nvmlDeviceGetNvLinkState") &&
              sym(&remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    sym(&remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
    if (!ok) *why = "libnvidia-ml.so.1 lacks a needed symbol (driver too old)";
    return ok;
  }
};

std::string busid_of(const nvmlPciInfo_t& info) {
  if (info.busId[0] != '\0') return normalize_busid(std::string(info.busId, strnlen(info.busId, sizeof info.busId)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.0", info.domain, info.bus, info.device);
  return buf;
}

}  // namespace

void probe_nvml(Topology* topo) {
  // Loaded once and kept: unloading a driver library mid-process buys nothing.
  static Nvml nvml;
  static std::string load_error;
  static bool loaded = nvml.load(&load_error);
  if (!loaded) {
    topo->notes.push_back("NVML: " + load_error + "; no NVLink information");
    return;
  }
  if (nvml.init() != 0) {
    topo->notes.push_back("NVML: nvmlInit failed (driver not loaded?); no NVLink information");
    return;
  }
  unsigned n = 0;
  if (nvml.count(&n) != 0) n = 0;
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    nvmlPciInfo_t info{};
    if (nvml.handle(i, &dev) != 0 || nvml.pci(dev, &info) != 0) continue;
    const std::string busid = busid_of(info);
    auto it = std::find_if(topo->gpus.begin(), topo->gpus.end(), [&](const Gpu& g) { return g.busid == busid; });
    if (it == topo->gpus.end()) {
      Gpu g;
      g.busid = busid;
      g.found_by = "NVML";
      std::ifstream numa("/sys/bus/pci/devices/" + busid + "/numa_node");
      int node = -1;
      if (numa >> node && node >= 0) g.where.numa = node;
      topo->gpus.push_back(g);
      it = topo->gpus.end() - 1;
    }
    it->os_devices.push_back("nvml" + std::to_string(i));
    char model[96] = {};
    if (nvml.name(dev, model, sizeof model) == 0) it->model = model;
    int major = 0, minor = 0;
    (void)nvml.cc(dev, &major, &minor);
    std::map<std::string, std::pair<int, NvLink::End>> remote;  // bus id -> (links, kind)
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int active = 0;
      if (nvml.link_state(dev, link, &active) != 0 || active == 0) continue;
      nvmlPciInfo_t peer{};
      if (nvml.remote_pci(dev, link, &peer) != 0) continue;
      int type = -1;
      if (nvml.remote_type == nullptr || nvml.remote_type(dev, link, &type) != 0) type = -1;
      NvLink::End kind = type == kRemoteGpu      ? NvLink::End::kGpu
                         : type == kRemoteSwitch ? NvLink::End::kNvSwitch
                         : type == kRemoteIbmNpu ? NvLink::End::kCpu
                                                 : NvLink::End::kOther;
      auto& entry = remote[busid_of(peer)];
      entry.first++;
      entry.second = kind;
    }
    for (const auto& [peer, links_kind] : remote) {
      NvLink e;
      e.from = busid;
      e.to = peer;
      e.links = links_kind.first;
      e.to_kind = links_kind.second;
      e.gbps = e.links * nvlink_gbps_per_link(major * 10 + minor);
      if (e.to_kind == NvLink::End::kNvSwitch &&
          std::find(topo->nvswitches.begin(), topo->nvswitches.end(), peer) == topo->nvswitches.end())
        topo->nvswitches.push_back(peer);
      topo->nvlinks.push_back(e);
    }
  }
  // Without the remote-type call, a remote end is a GPU exactly when its bus id is one.
  for (auto& e : topo->nvlinks)
    if (e.to_kind == NvLink::End::kOther && topo->gpu_by_busid(e.to)) e.to_kind = NvLink::End::kGpu;
  nvml.shutdown();
  sort_gpus(topo);
  topo->notes.push_back("NVML: " + std::to_string(n) + " GPU(s)");
}

}  // namespace comm::topology
