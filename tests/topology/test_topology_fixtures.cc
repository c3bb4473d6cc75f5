// The probe and the policy on real machine exports (tests/fixtures, see its README): the
// GPUs, NICs and HCAs found match each machine, and each GPU gets its nearest HCA.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "policy.h"
#include "probe.h"

namespace topo = comm::topology;

namespace {

// tests/fixtures in the source tree (so a clone alone has them), found from the test binary's
// path, so it works from any build directory and any working directory. COMM_FIXTURES_DIR
// overrides.
std::string fixtures_dir() {
  if (const char* dir = std::getenv("COMM_FIXTURES_DIR")) return dir;
  char exe[4096] = {};
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
  while (!dir.empty()) {
    dir = dir.substr(0, dir.find_last_of('/'));
    for (const char* rel : {"/tests/fixtures"})
      if (access((dir + rel + "/README.md").c_str(), R_OK) == 0) return dir + rel;
  }
  return "";
}

topo::Topology load(const std::string& rel) {
  std::string dir = fixtures_dir();
  INFO("fixtures not found: expected tests/fixtures in the source tree, or set COMM_FIXTURES_DIR");
  REQUIRE(!dir.empty());
  topo::Topology t;
  comm::Status st = topo::load_topology_file(dir + "/" + rel, &t);
  INFO(st.message());
  REQUIRE(st.ok());
  return t;
}

topo::Plan plan_for(const topo::Topology& t, int local_rank = 0) {
  topo::Config config;
  config.local_rank = local_rank;
  return topo::make_plan(t, topo::Env{}, config);
}

const topo::Hca* hca_named(const topo::Topology& t, const std::string& name) {
  for (const auto& h : t.hcas)
    if (topo::hca_label(h) == name) return &h;
  return nullptr;
}

std::vector<std::string> interface_names(const topo::Topology& t) {
  std::vector<std::string> out;
  for (const auto& i : t.interfaces) out.push_back(i.name);
  return out;
}

bool has_setting(const topo::Plan& p, const std::string& name) {
  return std::any_of(p.nccl.begin(), p.nccl.end(), [&](const topo::NcclSetting& s) { return s.name == name; });
}

}  // namespace

TEST_CASE("coral-lassen: 4 V100s, 4 ConnectX-5 ports; each V100 gets an HCA of its own socket", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/coral-lassen.xml");
  CHECK(t.packages == 2);
  CHECK(t.numa_nodes == 2);
  CHECK(t.cores == 40);
  REQUIRE(t.gpus.size() == 4);  // the ASPEED display controller (vendor 0x1a03) is not a GPU
  for (const auto& g : t.gpus) {
    CHECK(g.model == "Tesla V100-SXM2-16GB");
    CHECK(std::find(g.os_devices.begin(), g.os_devices.end(), "cuda" + std::to_string(g.index)) != g.os_devices.end());
  }
  REQUIRE(t.hcas.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const topo::Hca* h = hca_named(t, "mlx5_" + std::to_string(i));
    REQUIRE(h != nullptr);
    CHECK(h->kind == topo::RdmaKind::kInfiniBand);
    CHECK(h->usable_for_ib());
    // Matched by the OpenFabrics device, whatever the IPoIB netdev is called.
    CHECK(h->netdevs == std::vector<std::string>{"hsi" + std::to_string(i)});
  }
  CHECK(interface_names(t) == std::vector<std::string>{"hsi0", "hsi1", "enP5p1s0f0", "enP5p1s0f1", "hsi2", "hsi3"});

  topo::Plan p = plan_for(t);
  REQUIRE(p.gpus.size() == 4);
  std::set<std::string> used;
  for (const auto& choice : p.gpus) {
    const topo::Gpu& gpu = t.gpus[static_cast<size_t>(choice.gpu)];
    const topo::Hca* hca = hca_named(t, choice.hca);
    REQUIRE(hca != nullptr);
    INFO("GPU " << choice.gpu << " -> " << choice.hca);
    CHECK(hca->where.package == gpu.where.package);
    // GPUs and HCAs hang off different host bridges of the same socket.
    CHECK(choice.hca_path == topo::PathKind::kSameNuma);
    used.insert(choice.hca);
  }
  CHECK(used.size() == 4);  // one HCA per GPU
  CHECK(p.gpus[0].hca == "mlx5_0");
  CHECK(p.gpus[1].hca == "mlx5_1");
  CHECK(p.gpus[2].hca == "mlx5_2");
  CHECK(p.gpus[3].hca == "mlx5_3");
  CHECK(p.gpus[3].interface == "hsi3");  // the nearest interface, on the GPU's own HCA
  CHECK(p.peer(topo::PeerClass::kOtherHost).gpu_paths.front() == "ib");
  CHECK(has_setting(p, "NCCL_IB_TIMEOUT"));
}

TEST_CASE("coral-lassen: the two GPUs behind one PLX switch are on the same switch", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/coral-lassen.xml");
  CHECK(topo::path_between(t.gpus[0].where, t.gpus[1].where) == topo::PathKind::kSameSwitch);
  CHECK(topo::path_between(t.gpus[0].where, t.gpus[2].where) == topo::PathKind::kOtherSocket);
  // Across host bridges, where hwloc_get_common_ancestor_obj() would crash.
  CHECK(topo::path_between(t.gpus[0].where, t.hcas[0].where) == topo::PathKind::kSameNuma);
}

TEST_CASE("g4dn.metal: 8 T4s, the EFA device is not taken for InfiniBand", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/g4dnmetal.xml");
  CHECK(t.packages == 2);
  CHECK(t.cores == 48);
  CHECK(t.gpus.size() == 8);  // one per PCI device, not per cuda/opencl/nvml OS device
  REQUIRE(t.hcas.size() == 1);
  CHECK(t.hcas[0].name == "rdmap197s0");
  CHECK(t.hcas[0].kind == topo::RdmaKind::kEfa);
  CHECK_FALSE(t.hcas[0].usable_for_ib());
  CHECK(interface_names(t) == std::vector<std::string>{"eth0"});

  topo::Plan p = plan_for(t);
  CHECK(p.ib_hcas.empty());
  for (const auto& g : p.gpus) CHECK(g.hca.empty());
  const auto& remote = p.peer(topo::PeerClass::kOtherHost);
  CHECK(remote.host_transport == "socket");
  CHECK(std::find(remote.gpu_paths.begin(), remote.gpu_paths.end(), "ib") == remote.gpu_paths.end());
  CHECK(remote.why.find("rdmap197s0 is EFA") != std::string::npos);
  CHECK_FALSE(has_setting(p, "NCCL_IB_TIMEOUT"));
  CHECK_FALSE(has_setting(p, "NCCL_IB_HCA"));
  REQUIRE(p.interfaces.size() == 1);
  CHECK(p.interfaces[0].name == "eth0");
}

TEST_CASE("UV2000: the ConnectX-3 mlx4_0 is recognised as InfiniBand on NUMA node 6", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/192em64t-24n8c2t.xml");
  CHECK(t.packages == 24);
  CHECK(t.numa_nodes == 24);
  CHECK(t.cores == 192);
  CHECK(t.gpus.empty());  // the Matrox VGA is no GPU
  REQUIRE(t.hcas.size() == 1);
  const topo::Hca& h = t.hcas[0];
  CHECK(h.name == "mlx4_0");
  CHECK(h.kind == topo::RdmaKind::kInfiniBand);
  CHECK(h.usable_for_ib());
  CHECK(h.where.numa == 6);
  CHECK(h.netdevs == std::vector<std::string>{"ib0"});
  CHECK(interface_names(t) == std::vector<std::string>{"eth0", "eth1", "eth2", "eth3", "eth4", "eth5", "ib0"});

  topo::Plan p = plan_for(t);
  CHECK(p.ib_hcas == std::vector<std::string>{"mlx4_0"});
  CHECK(p.peer(topo::PeerClass::kOtherHost).host_paths == std::vector<std::string>{"ucx", "socket"});
  REQUIRE(!p.interfaces.empty());
  CHECK(p.interfaces[0].name == "ib0");  // NCCL's default order: ib* first
  CHECK(p.nccl.empty());                 // no GPU, no NCCL
}

TEST_CASE("DGX-2: every GPU reaches every other through NVSwitch in the NVLink bandwidth matrix", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/nvidiaDGX2.xml");
  REQUIRE(t.gpus.size() == 16);  // NVML OS devices typed COPROC
  CHECK(t.nvswitches.size() == 12);
  CHECK(t.hcas.empty());
  CHECK(t.interfaces.empty());
  topo::Plan p = plan_for(t);
  REQUIRE(p.nvlink.gbps.size() == 16);
  for (size_t i = 0; i < 16; ++i) {
    for (size_t j = 0; j < 16; ++j) {
      INFO("GPU " << i << " -> GPU " << j);
      if (i == j) {
        CHECK(p.nvlink.via[i][j] == 'X');
        continue;
      }
      CHECK(p.nvlink.via[i][j] == 'S');
      CHECK(p.nvlink.gbps[i][j] == Approx(150.0));  // 6 links x 25 GB/s into the fabric
    }
  }
  CHECK(p.peer(topo::PeerClass::kSameNuma).gpu_paths.front() == "nvlink");
  CHECK(p.peer(topo::PeerClass::kOtherNuma).gpu_paths.front() == "nvlink");
}

TEST_CASE("EPYC (hwloc 1.x XML): loads; no GPU; mlx5_0 on NUMA 5, eno1-4 on NUMA 1", "[topology][fixtures]") {
  topo::Topology t = load("hwloc/epyc-dual-sock-hwloc1.xml");
  CHECK(t.packages == 2);
  CHECK(t.numa_nodes == 8);
  CHECK(t.cores == 64);
  CHECK(t.gpus.empty());  // the ASPEED card0 is a GPU OS device without CUDA/NVML: not ours
  REQUIRE(t.hcas.size() == 1);
  CHECK(t.hcas[0].name == "mlx5_0");
  CHECK(t.hcas[0].kind == topo::RdmaKind::kInfiniBand);
  CHECK(t.hcas[0].where.numa == 5);
  for (const auto& i : t.interfaces)
    if (i.name.rfind("eno", 0) == 0) CHECK(i.where.numa == 1);
  // Among interfaces NCCL_SOCKET_IFNAME allows, the one nearest the rank's NUMA node goes first.
  topo::Env env;
  env.nccl_socket_ifname = "eno,ib";
  topo::Config config;
  config.numa = 5;
  topo::Plan near_hca = topo::make_plan(t, env, config);
  REQUIRE(near_hca.interfaces.size() == 5);
  CHECK(near_hca.interfaces[0].name == "ib0");
  config.numa = 1;
  topo::Plan near_eno = topo::make_plan(t, env, config);
  CHECK(near_eno.interfaces[0].name == "eno1");
  CHECK(near_eno.interfaces[4].name == "ib0");
}

TEST_CASE("Azure ND A100 v4 (NCCL topology XML): the GPU/HCA pairs of each PCI switch are found", "[topology][fixtures]") {
  topo::Topology t = load("nccl-topo/ndv4-topo.xml");
  CHECK(t.numa_nodes == 4);
  REQUIRE(t.gpus.size() == 8);
  REQUIRE(t.hcas.size() == 8);
  for (const auto& h : t.hcas) CHECK(h.kind == topo::RdmaKind::kInfiniBand);
  topo::Plan p = plan_for(t);
  REQUIRE(p.gpus.size() == 8);
  std::set<std::string> used;
  for (const auto& choice : p.gpus) {
    const topo::Gpu& gpu = t.gpus[static_cast<size_t>(choice.gpu)];
    const topo::Hca* hca = hca_named(t, choice.hca);
    REQUIRE(hca != nullptr);
    INFO("GPU " << gpu.busid << " -> HCA " << hca->busid);
    CHECK(choice.hca_path == topo::PathKind::kSameSwitch);
    CHECK(hca->where.bridges == gpu.where.bridges);  // under the same virtual PCI switch
    CHECK(hca->where.numa == gpu.where.numa);
    used.insert(choice.hca);
  }
  CHECK(used.size() == 8);
  // The switch under NUMA 0 holds GPUs 0003/0004 and HCAs 0103/0104: paired with each other.
  const topo::Gpu* g3 = t.gpu_by_busid("0003:00:00.0");
  REQUIRE(g3 != nullptr);
  CHECK(p.gpus[static_cast<size_t>(g3->index)].hca == "0103:00:00.0");
  CHECK(p.gpus[static_cast<size_t>(g3->index) + 1].hca == "0104:00:00.0");
}

TEST_CASE("Azure NC A100 v4 (NCCL topology XML): nvlink elements, eth0, no InfiniBand", "[topology][fixtures]") {
  topo::Topology t = load("nccl-topo/ncv4-topo.xml");
  REQUIRE(t.gpus.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(t.gpus[static_cast<size_t>(i)].where.numa == i);
  CHECK(t.nvlinks.size() == 4);
  for (const auto& l : t.nvlinks) {
    CHECK(l.links == 12);
    CHECK(l.to_kind == topo::NvLink::End::kSelf);  // each names its own GPU: no path to another
  }
  CHECK(t.hcas.empty());
  REQUIRE(t.interfaces.size() == 1);
  CHECK(t.interfaces[0].name == "eth0");
  CHECK(t.interfaces[0].speed_mbps == 100000);
  topo::Plan p = plan_for(t);
  CHECK_FALSE(p.nvlink.any());
  CHECK(p.ib_hcas.empty());
  CHECK(p.peer(topo::PeerClass::kOtherHost).gpu_paths == std::vector<std::string>{"socket"});
  REQUIRE(p.interfaces.size() == 1);
  CHECK(p.interfaces[0].name == "eth0");
}

TEST_CASE("every fixture loads and plans without error", "[topology][fixtures]") {
  for (const char* f : {"hwloc/coral-lassen.xml", "hwloc/g4dnmetal.xml", "hwloc/nvidiaDGX2.xml",
                        "hwloc/epyc-dual-sock-hwloc1.xml", "hwloc/192em64t-24n8c2t.xml", "nccl-topo/ndv4-topo.xml",
                        "nccl-topo/ncv4-topo.xml"}) {
    INFO(f);
    topo::Topology t = load(f);
    CHECK(t.offline);
    for (int rank = 0; rank < 3; ++rank) {
      topo::Plan p = plan_for(t, rank);
      CHECK(p.peers.size() == 4);
      CHECK(p.gpus.size() == t.gpus.size());
      CHECK(!p.decisions.empty());
    }
  }
}
