// Network interfaces of this machine (this network namespace): getifaddrs for state and addresses
// (through the socket transport's list_interfaces, so both read the same list in the same order),
// /sys/class/net for speed, PCI device and NUMA node, and whether the interface is physical or
// virtual (veth, bridge, loopback, tun, vlan...).
#include <dirent.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>

#include "probe.h"
#include "interfaces.h"

namespace comm::topology {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string uevent_value(const std::string& dir, const std::string& key) {
  std::ifstream in(dir + "/uevent");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "";
}

}  // namespace

// The last bus id in the resolved path: /sys/devices/pci0000:00/0000:00:03.0/virtio2 -> 0000:00:03.0.
std::string sysfs_pci_busid(const std::string& device_link) {
  char resolved[PATH_MAX];
  if (realpath(device_link.c_str(), resolved) == nullptr) return "";
  std::string path = resolved;
  std::string found;
  size_t start = 0;
  while (start < path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    std::string part = path.substr(start, slash - start);
    unsigned d, b, dev, fn;
    char tail;
    if (std::sscanf(part.c_str(), "%x:%x:%x.%x%c", &d, &b, &dev, &fn, &tail) == 4) found = part;
    start = slash + 1;
  }
  return found.empty() ? "" : normalize_busid(found);
}

namespace {

void describe_from_sysfs(NetInterface* itf) {
  const std::string dir = "/sys/class/net/" + itf->name;
  std::string flags = read_line(dir + "/flags");
  if (!flags.empty()) itf->up = (std::strtoul(flags.c_str(), nullptr, 16) & IFF_UP) != 0;
  int type = std::atoi(read_line(dir + "/type").c_str());
  std::string devtype = uevent_value(dir, "DEVTYPE");
  bool has_device = exists(dir + "/device");
  itf->physical = has_device;
  if (type == 772 || itf->name == "lo") {
    itf->kind = "loopback";
    itf->physical = false;
  } else if (has_device) {
    itf->kind = type == 32 ? "IPoIB" : "physical";
  } else if (!devtype.empty()) {
    itf->kind = devtype;  // bridge, vlan, vxlan, wireguard, ...
  } else if (exists(dir + "/tun_flags")) {
    itf->kind = "tun";
  } else if (read_line(dir + "/iflink") != read_line(dir + "/ifindex")) {
    itf->kind = "veth";
  } else {
    itf->kind = "virtual";
  }
  std::string speed = read_line(dir + "/speed");
  if (!speed.empty() && std::atoi(speed.c_str()) > 0) itf->speed_mbps = std::atoi(speed.c_str());
  if (has_device) {
    itf->busid = sysfs_pci_busid(dir + "/device");
    std::string numa = read_line(dir + "/device/numa_node");
    if (!numa.empty() && std::atoi(numa.c_str()) >= 0) itf->where.numa = std::atoi(numa.c_str());
    DIR* ib = opendir((dir + "/device/infiniband").c_str());
    if (ib != nullptr) {
      while (dirent* e = readdir(ib))
        if (e->d_name[0] != '.') itf->hca = e->d_name;
      closedir(ib);
    }
  }
}

}  // namespace

void probe_interfaces(Topology* topo) {
  std::vector<Interface> live = list_interfaces();
  std::vector<std::string> names;
  for (const auto& a : live)
    if (std::find(names.begin(), names.end(), a.name) == names.end()) names.push_back(a.name);
  std::vector<std::string> others;  // down or without an address, in name order after the rest
  if (DIR* d = opendir("/sys/class/net")) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n[0] != '.' && std::find(names.begin(), names.end(), n) == names.end()) others.push_back(n);
    }
    closedir(d);
  }
  std::sort(others.begin(), others.end());
  names.insert(names.end(), others.begin(), others.end());
  for (const auto& name : names) {
    NetInterface itf;
    itf.name = name;
    for (const auto& a : live)
      if (a.name == name) itf.addresses.push_back({a.address, a.family});
    itf.up = !itf.addresses.empty();
    describe_from_sysfs(&itf);
    topo->interfaces.push_back(itf);
  }
  if (names.empty()) topo->notes.push_back("interfaces: none found (no getifaddrs entries, no /sys/class/net)");
}

}  // namespace comm::topology
