// The path policy on made-up machines and environments (NCCL_SOCKET_IFNAME forms, decoy and
// veth interfaces, NCCL_IB_TIMEOUT rules, HCA filters, forced transports), applying NCCL
// settings, topology files that cannot be read, and this machine's own probe.
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nccl_env.h"
#include "plan_json.h"
#include "policy.h"
#include "probe.h"
#include "process_plan.h"

namespace topo = comm::topology;

namespace {

topo::NetInterface itf(const std::string& name, const std::string& kind, const std::string& address, int numa = -1) {
  topo::NetInterface i;
  i.name = name;
  i.kind = kind;
  i.physical = kind == "physical" || kind == "IPoIB";
  i.addresses.push_back({address, AF_INET});
  i.where.numa = numa;
  return i;
}

topo::Gpu gpu(int index, int numa, std::vector<std::string> bridges = {}) {
  topo::Gpu g;
  g.index = index;
  char busid[32];
  std::snprintf(busid, sizeof busid, "0000:%02x:00.0", 0x10 + index);
  g.busid = busid;
  g.where.numa = numa;
  g.where.package = numa;
  g.where.bridges = std::move(bridges);
  return g;
}

topo::Hca hca(const std::string& name, topo::RdmaKind kind, int numa, const std::string& state = "ACTIVE") {
  topo::Hca h;
  h.name = name;
  h.kind = kind;
  h.where.numa = numa;
  h.where.package = numa;
  h.ports.push_back({1, state, kind == topo::RdmaKind::kRoce ? "Ethernet" : "InfiniBand", 200});
  return h;
}

std::vector<std::string> chosen(const topo::Plan& p) {
  std::vector<std::string> out;
  for (const auto& i : p.interfaces) out.push_back(i.name);
  return out;
}

const topo::NcclSetting* setting(const topo::Plan& p, const std::string& name) {
  for (const auto& s : p.nccl)
    if (s.name == name) return &s;
  return nullptr;
}

// A host as getifaddrs lists it: loopback first, a docker bridge, two NICs and a veth.
topo::Topology busy_host() {
  topo::Topology t;
  t.source = "test";
  t.interfaces = {itf("lo", "loopback", "127.0.0.1"), itf("docker0", "bridge", "172.17.0.1"),
                  itf("veth1", "veth", "10.9.0.2"), itf("eth0", "physical", "192.0.2.2"),
                  itf("eth10", "physical", "192.0.3.2")};
  return t;
}

std::vector<std::string> pick(const topo::Topology& t, const std::string& spec) {
  topo::Env env;
  env.nccl_socket_ifname = spec;
  return chosen(topo::make_plan(t, env, topo::Config{}));
}

// An IB machine: one GPU per socket, one HCA per socket.
topo::Topology ib_host() {
  topo::Topology t;
  t.gpus = {gpu(0, 0), gpu(1, 1)};
  t.hcas = {hca("mlx5_0", topo::RdmaKind::kInfiniBand, 0), hca("mlx5_1", topo::RdmaKind::kInfiniBand, 1)};
  t.interfaces = {itf("eth0", "physical", "192.0.2.2", 0)};
  return t;
}

std::string write_temp(const std::string& text) {
  char path[] = "/tmp/comm_topo_test_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

comm::Status load_text(const std::string& text, topo::Topology* t) {
  std::string path = write_temp(text);
  comm::Status st = topo::load_topology_file(path, t);
  unlink(path.c_str());
  return st;
}

}  // namespace

TEST_CASE("NCCL_SOCKET_IFNAME forms select through the plan: prefix, ^, =, ^=", "[topology][policy]") {
  topo::Topology t = busy_host();
  CHECK(pick(t, "") == std::vector<std::string>{"eth0", "eth10", "veth1"});  // physical before virtual
  CHECK(pick(t, "eth") == std::vector<std::string>{"eth0", "eth10"});
  CHECK(pick(t, "^eth") == std::vector<std::string>{"docker0", "veth1", "lo"});  // loopback last
  CHECK(pick(t, "=eth10") == std::vector<std::string>{"eth10"});
  CHECK(pick(t, "=eth1").empty());  // exact: eth10 is not eth1
  CHECK(pick(t, "^=eth0") == std::vector<std::string>{"eth10", "docker0", "veth1", "lo"});
  topo::Env env;
  env.nccl_socket_ifname = "=eth1";
  topo::Plan p = topo::make_plan(t, env, topo::Config{});
  CHECK(p.interface_rule.find("matched no interface") != std::string::npos);
  env.comm_socket_ifname = "docker";  // COMM_SOCKET_IFNAME wins over NCCL_SOCKET_IFNAME
  p = topo::make_plan(t, env, topo::Config{});
  CHECK(chosen(p) == std::vector<std::string>{"docker0"});
  CHECK(p.interface_rule.rfind("COMM_SOCKET_IFNAME='docker'", 0) == 0);
}

TEST_CASE("a decoy docker0 is passed over for the veth, and taken when NCCL_SOCKET_IFNAME names it", "[topology][policy]") {
  topo::Topology t;
  t.interfaces = {itf("lo", "loopback", "127.0.0.1"), itf("docker0", "bridge", "172.17.0.1"),
                  itf("veth0", "veth", "10.7.0.1")};
  CHECK(pick(t, "") == std::vector<std::string>{"veth0"});
  CHECK(pick(t, "docker0") == std::vector<std::string>{"docker0"});
}

TEST_CASE("a container's only interface is a veth: it is still used", "[topology][policy]") {
  topo::Topology t;
  t.interfaces = {itf("lo", "loopback", "127.0.0.1"), itf("eth0", "veth", "10.0.0.5")};
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  REQUIRE(chosen(p) == std::vector<std::string>{"eth0"});
  CHECK(p.interfaces[0].why.find("only candidate") != std::string::npos);
}

TEST_CASE("physical before virtual among equals, and NCCL is told when its own default would differ", "[topology][policy]") {
  topo::Topology t;
  t.gpus = {gpu(0, 0)};
  t.interfaces = {itf("eth0", "veth", "10.0.0.5"), itf("ens5", "physical", "192.0.2.9", 0)};
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(chosen(p) == std::vector<std::string>{"ens5", "eth0"});
  const topo::NcclSetting* s = setting(p, "NCCL_SOCKET_IFNAME");
  REQUIRE(s != nullptr);
  CHECK(s->value == "=ens5");
  CHECK(s->user_value.empty());
  CHECK(s->reason.find("would take eth0 first") != std::string::npos);

  topo::Env env;
  env.nccl_socket_ifname = "eth";  // the user's choice is honoured and never overridden
  p = topo::make_plan(t, env, topo::Config{});
  CHECK(chosen(p) == std::vector<std::string>{"eth0"});
  s = setting(p, "NCCL_SOCKET_IFNAME");
  CHECK((s == nullptr || s->user_value == "eth"));
}

TEST_CASE("the NIC nearest the rank's GPU goes first", "[topology][policy]") {
  topo::Topology t;
  t.gpus = {gpu(0, 0), gpu(1, 1)};
  t.interfaces = {itf("ens1", "physical", "192.0.2.1", 0), itf("ens2", "physical", "192.0.3.1", 1)};
  topo::Config config;
  config.local_rank = 1;
  topo::Plan p = topo::make_plan(t, topo::Env{}, config);
  CHECK(chosen(p) == std::vector<std::string>{"ens2", "ens1"});
  CHECK(p.gpus[0].interface == "ens1");
  CHECK(p.gpus[1].interface == "ens2");
  config.local_rank = 0;
  CHECK(chosen(topo::make_plan(t, topo::Env{}, config)) == std::vector<std::string>{"ens1", "ens2"});
}

TEST_CASE("NCCL_IB_TIMEOUT: 20 by default, 23 cross-zone or over the round-trip threshold, a user's value kept",
          "[topology][policy]") {
  topo::Topology t = ib_host();
  CHECK(topo::ib_timeout_seconds(20, 7) == Approx(4.096e-6 * 1048576 * 7));
  CHECK(topo::ib_timeout_seconds(23, 7) == Approx(240.52).epsilon(0.001));

  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(p.ib.timeout == 20);
  CHECK(p.ib.retry_cnt == 7);
  CHECK(p.ib.seconds == Approx(30.06).epsilon(0.001));
  REQUIRE(setting(p, "NCCL_IB_TIMEOUT") != nullptr);
  CHECK(setting(p, "NCCL_IB_TIMEOUT")->value == "20");
  CHECK(setting(p, "NCCL_IB_TIMEOUT")->reason.find("4.096 us x 2^20 x 7 = 30.1 s") != std::string::npos);
  REQUIRE(setting(p, "NCCL_IB_RETRY_CNT") != nullptr);
  CHECK(setting(p, "NCCL_IB_RETRY_CNT")->value == "7");

  topo::Env cross;
  cross.cross_zone = true;
  p = topo::make_plan(t, cross, topo::Config{});
  CHECK(p.ib.timeout == 23);
  CHECK(p.ib.why.find("COMM_CROSS_ZONE=1") != std::string::npos);
  CHECK(p.ib.why.find("240.5 s") != std::string::npos);

  topo::Config far;
  far.rendezvous_rtt_us = 5000;
  CHECK(topo::make_plan(t, topo::Env{}, far).ib.timeout == 23);
  far.rendezvous_rtt_us = 200;
  CHECK(topo::make_plan(t, topo::Env{}, far).ib.timeout == 20);

  topo::Env user;
  user.nccl_ib_timeout = "22";
  user.cross_zone = true;
  p = topo::make_plan(t, user, topo::Config{});
  CHECK(p.ib.timeout == 22);
  CHECK(setting(p, "NCCL_IB_TIMEOUT")->user_value == "22");

  topo::Env bad;
  bad.nccl_ib_timeout = "40";
  p = topo::make_plan(t, bad, topo::Config{});
  CHECK(p.ib.timeout == 20);
  CHECK(p.ib.why.find("not 0-31") != std::string::npos);
}

TEST_CASE("HCAs: down ports, EFA and NCCL_IB_HCA decide which NCCL may use", "[topology][policy]") {
  topo::Topology t = ib_host();
  t.hcas.push_back(hca("mlx5_2", topo::RdmaKind::kInfiniBand, 0, "DOWN"));
  t.hcas.push_back(hca("efa0", topo::RdmaKind::kEfa, 0));
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(p.ib_hcas == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  REQUIRE(setting(p, "NCCL_IB_HCA") != nullptr);
  CHECK(setting(p, "NCCL_IB_HCA")->value == "=mlx5_0,mlx5_1");
  CHECK(p.gpus[0].hca == "mlx5_0");
  CHECK(p.gpus[1].hca == "mlx5_1");

  topo::Env only;
  only.nccl_ib_hca = "=mlx5_1";
  p = topo::make_plan(t, only, topo::Config{});
  CHECK(p.ib_hcas == std::vector<std::string>{"mlx5_1"});
  CHECK(p.gpus[0].hca == "mlx5_1");  // the only one left, though on the other socket
  CHECK(p.gpus[0].hca_path == topo::PathKind::kOtherSocket);
  CHECK(setting(p, "NCCL_IB_HCA")->user_value == "=mlx5_1");

  topo::Env exclude;
  exclude.nccl_ib_hca = "^mlx5_0:1";
  CHECK(topo::make_plan(t, exclude, topo::Config{}).ib_hcas == std::vector<std::string>{"mlx5_1"});
}

TEST_CASE("more GPUs than HCAs: the nearest HCA is shared, the least used first", "[topology][policy]") {
  topo::Topology t;
  t.gpus = {gpu(0, 0, {"host a", "sw1"}), gpu(1, 0, {"host a", "sw1"}), gpu(2, 0, {"host a", "sw2"}),
            gpu(3, 0, {"host a", "sw2"})};
  t.hcas = {hca("mlx5_0", topo::RdmaKind::kInfiniBand, 0), hca("mlx5_1", topo::RdmaKind::kInfiniBand, 0)};
  t.hcas[0].where.bridges = {"host a", "sw1"};
  t.hcas[1].where.bridges = {"host a", "sw2"};
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(p.gpus[0].hca == "mlx5_0");
  CHECK(p.gpus[1].hca == "mlx5_0");
  CHECK(p.gpus[2].hca == "mlx5_1");
  CHECK(p.gpus[3].hca == "mlx5_1");
  for (const auto& g : p.gpus) CHECK(g.hca_path == topo::PathKind::kSameSwitch);
}

TEST_CASE("host transport per peer class: shm on the host, sockets across; COMM_TRANSPORT and the API force one",
          "[topology][policy]") {
  topo::Topology t = busy_host();
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(p.host_transport_digest() == "same_process=shm,same_numa=shm,other_numa=shm,other_host=socket");
  CHECK(p.peer(topo::PeerClass::kSameNuma).gpu_paths.empty());  // no GPU
  CHECK(p.nccl.empty());

  topo::Env env;
  env.comm_transport = "socket";
  p = topo::make_plan(t, env, topo::Config{});
  CHECK(p.host_transport_digest() == "same_process=socket,same_numa=socket,other_numa=socket,other_host=socket");
  CHECK(p.peer(topo::PeerClass::kSameNuma).why.find("COMM_TRANSPORT=socket") != std::string::npos);
  topo::Config api;
  api.transport = "shm";
  CHECK(topo::make_plan(t, env, api).peer(topo::PeerClass::kOtherNuma).host_transport == "shm");

  topo::Topology ib = ib_host();
  topo::Config with_ucx;
  with_ucx.host_transports = {"shm", "ucx", "socket"};
  CHECK(topo::make_plan(ib, topo::Env{}, with_ucx).peer(topo::PeerClass::kOtherHost).host_transport == "ucx");
  // UCX is preferred over IB but not in this build: sockets, and the plan says why.
  topo::Plan default_build = topo::make_plan(ib, topo::Env{}, topo::Config{});
  const auto& remote = default_build.peer(topo::PeerClass::kOtherHost);
  CHECK(remote.host_transport == "socket");
  CHECK(remote.why.find("UCX is not available here (not in this build") != std::string::npos);
}

TEST_CASE("PCI paths: same switch > same host bridge > same NUMA node > same socket > other socket", "[topology]") {
  topo::Locality a{0, 0, {"host 0000:[00-0f]", "0000:00:01.0", "0000:01:00.0"}};
  topo::Locality b{0, 0, {"host 0000:[00-0f]", "0000:00:01.0", "0000:01:08.0"}};
  topo::Locality c{0, 0, {"host 0000:[00-0f]", "0000:00:02.0"}};
  topo::Locality d{0, 0, {"host 0000:[10-1f]"}};
  topo::Locality e{1, 0, {"host 0000:[20-2f]"}};
  topo::Locality f{2, 1, {"host 0000:[30-3f]"}};
  CHECK(topo::path_between(a, b) == topo::PathKind::kSameSwitch);
  CHECK(topo::path_between(a, c) == topo::PathKind::kSameHostBridge);
  CHECK(topo::path_between(a, d) == topo::PathKind::kSameNuma);
  CHECK(topo::path_between(a, e) == topo::PathKind::kSamePackage);
  CHECK(topo::path_between(a, f) == topo::PathKind::kOtherSocket);
  CHECK(topo::path_between(topo::Locality{}, a) == topo::PathKind::kUnknown);
  CHECK(topo::normalize_busid("00000000:3B:00.0") == "0000:3b:00.0");
}

TEST_CASE("applying NCCL settings never overrides a user's value", "[topology][apply]") {
  unsetenv("NCCL_IB_TIMEOUT");
  setenv("NCCL_IB_RETRY_CNT", "3", 1);
  topo::Plan p;
  p.uses_nccl = true;
  p.nccl = {{"NCCL_IB_TIMEOUT", "23", "COMM_CROSS_ZONE=1", ""}, {"NCCL_IB_RETRY_CNT", "7", "NCCL's default", ""}};
  std::vector<topo::Applied> applied = topo::apply_nccl_settings(p);
  REQUIRE(applied.size() == 2);
  CHECK(std::string(std::getenv("NCCL_IB_TIMEOUT")) == "23");
  CHECK(applied[0].set_by_libcomm);
  CHECK(std::string(std::getenv("NCCL_IB_RETRY_CNT")) == "3");
  CHECK_FALSE(applied[1].set_by_libcomm);
  CHECK(applied[1].value == "3");
  unsetenv("NCCL_IB_TIMEOUT");
  unsetenv("NCCL_IB_RETRY_CNT");
}

TEST_CASE("hwloc 3 XML is a clear error, not a crash", "[topology][files]") {
  topo::Topology t;
  comm::Status st = load_text(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc3.dtd\">\n"
      "<topology version=\"3.0\">\n  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" "
      "allowed_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\" allowed_nodeset=\"0x1\" gp_index=\"1\"/>\n"
      "</topology>\n",
      &t);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(st.message().find("hwloc 3.0 XML") != std::string::npos);
  CHECK(st.message().find("lstopo") != std::string::npos);
}

TEST_CASE("unreadable topology files are errors that say what is wrong", "[topology][files]") {
  topo::Topology t;
  comm::Status st = topo::load_topology_file("/nonexistent/topo.xml", &t);
  CHECK(st.message().find("cannot be read") != std::string::npos);
  CHECK(load_text("hello", &t).message().find("neither hwloc XML") != std::string::npos);
  CHECK(load_text("<html><body/></html>", &t).message().find("its root is <html>") != std::string::npos);
  st = load_text("<system version=\"1\">\n<cpu numaid=\"0\">\n</gpu>\n</system>", &t);
  CHECK(st.message().find("line 3: </gpu> closes <cpu>") != std::string::npos);
  CHECK(load_text("<system><cpu numaid=\"0></system>", &t).message().find("not closed") != std::string::npos);
  std::string deep = "<system>";
  for (int i = 0; i < 200; ++i) deep += "<pci busid=\"0000:00:00.0\">";
  CHECK(load_text(deep, &t).message().find("nested deeper") != std::string::npos);
  CHECK(load_text("<topology version=\"2.0\"><garbage", &t).message().find("hwloc cannot") != std::string::npos);
}

TEST_CASE("NCCL topology XML: named NICs, NVLink to GPUs and NVSwitches", "[topology][files]") {
  topo::Topology t;
  comm::Status st = load_text(R"(<?xml version="1.0"?>
<!-- a made-up two-GPU host -->
<system version="1">
  <cpu numaid="0" affinity="0000000f">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x030200" vendor="0x10de">
        <gpu dev="0" sm="90"><nvlink target="0000:12:00.0" count="4" tclass="0x030200"/>
          <nvlink target="0000:99:00.0" count="2" tclass="0x068000"/></gpu>
      </pci>
      <pci busid="0000:12:00.0" class="0x030200"><gpu dev="1" sm="90"/></pci>
      <pci busid="0000:13:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="400000" guid="0x1"/></nic></pci>
    </pci>
    <nic><net name="eth0" dev="1" speed="25000" guid="0x0"/></nic>
  </cpu>
</system>)",
                              &t);
  REQUIRE(st.ok());
  REQUIRE(t.gpus.size() == 2);
  REQUIRE(t.hcas.size() == 1);
  CHECK(t.hcas[0].name == "mlx5_0");
  CHECK(t.hcas[0].busid == "0000:13:00.0");
  REQUIRE(t.interfaces.size() == 1);
  CHECK(t.interfaces[0].name == "eth0");
  CHECK(t.nvswitches == std::vector<std::string>{"0000:99:00.0"});
  topo::NvlinkMatrix m = topo::nvlink_matrix(t);
  CHECK(m.via[0][1] == 'D');
  CHECK(m.via[1][0] == 'D');  // one end reported the links
  CHECK(m.gbps[0][1] == Approx(4 * 20.6));
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  CHECK(p.gpus[0].hca == "mlx5_0");
  CHECK(p.gpus[0].hca_path == topo::PathKind::kSameSwitch);
}

TEST_CASE("this machine: the probe never fails, and says what it did not find", "[topology][live]") {
  topo::Topology t;
  REQUIRE(topo::probe(topo::ProbeOptions{}, &t).ok());
  CHECK_FALSE(t.offline);
  CHECK(t.pus > 0);
  bool nvidia_pci = false;
  if (DIR* d = opendir("/sys/bus/pci/devices")) {
    while (dirent* e = readdir(d)) {
      std::ifstream vendor(std::string("/sys/bus/pci/devices/") + e->d_name + "/vendor");
      std::string v;
      nvidia_pci |= (vendor >> v) && v == "0x10de";
    }
    closedir(d);
  }
  if (!nvidia_pci) CHECK(t.gpus.empty());
  if (access("/sys/class/infiniband", F_OK) != 0) CHECK(t.hcas.empty());
  CHECK(!t.notes.empty());
  CHECK(!t.interfaces.empty());

  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  if (t.gpus.empty() && t.hcas.empty()) {
    CHECK(p.host_transport_digest() == "same_process=shm,same_numa=shm,other_numa=shm,other_host=socket");
    CHECK(p.nccl.empty());
  }
  // The process hook: cached, and the same answer the init check compares across ranks.
  topo::prepare_process(nullptr);
  CHECK(topo::peer_transport_digest() == topo::plan_for_process().host_transport_digest());
  CHECK(topo::host_transport_for(topo::PeerClass::kOtherHost) == topo::plan_for_process().peer(topo::PeerClass::kOtherHost).host_transport);
}

TEST_CASE("--json output follows the documented schema", "[topology][json]") {
  topo::Topology t = ib_host();
  topo::Plan p = topo::make_plan(t, topo::Env{}, topo::Config{});
  nlohmann::json j = nlohmann::json::parse(topo::to_json_text(t, p));
  CHECK(j["schema"] == "libcomm.topology/1");
  CHECK(j["topology"]["gpus"].size() == 2);
  CHECK(j["topology"]["hcas"][0]["name"] == "mlx5_0");
  CHECK(j["topology"]["hcas"][0]["usable_for_ib"] == true);
  CHECK(j["topology"]["gpus"][0]["numa"] == 0);
  CHECK(j["topology"]["gpus"][0]["package"] == 0);
  CHECK(j["plan"]["peers"].size() == 4);
  CHECK(j["plan"]["peers"][3]["class"] == "other_host");
  CHECK(j["plan"]["gpus"][1]["hca"] == "mlx5_1");
  CHECK(j["plan"]["ib_timeout"]["timeout"] == 20);
  CHECK(j["plan"]["nccl"][0]["name"] == "NCCL_IB_TIMEOUT");
  CHECK(j["plan"]["nccl"][0]["user_value"].is_null());
  CHECK(j["plan"]["nvlink"]["via"][0] == "X-");
  CHECK(j["plan"]["decisions"].size() > 5);
}
