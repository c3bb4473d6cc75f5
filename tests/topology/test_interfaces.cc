// NCCL_SOCKET_IFNAME semantics on made-up interface lists, and the machine's own list.
#include <sys/socket.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "interfaces.h"

using comm::topology::Interface;
using comm::topology::list_interfaces;
using comm::topology::select_interfaces;

namespace {

Interface v4(const std::string& name, const std::string& addr, bool up = true) { return {name, addr, AF_INET, up}; }
Interface v6(const std::string& name, const std::string& addr) { return {name, addr, AF_INET6, true}; }

// A host with everything: loopback first, as getifaddrs lists it.
std::vector<Interface> busy_host() {
  return {v4("lo", "127.0.0.1"),       v4("docker0", "172.17.0.1"), v6("eth0", "fd00::2"),
          v4("eth0", "192.0.2.2"),     v4("eth10", "192.0.3.2"),    v4("ib0", "10.0.0.2"),
          v4("virbr0", "192.168.122.1"), v4("ib1", "10.0.1.2"),     v4("enp1s0", "198.51.100.2")};
}

std::vector<std::string> names(const std::vector<Interface>& list) {
  std::vector<std::string> out;
  for (const auto& itf : list) out.push_back(itf.name + "/" + itf.address);
  return out;
}

std::vector<std::string> pick(const std::string& spec, const std::vector<Interface>& all, std::string* why = nullptr) {
  std::vector<Interface> chosen;
  std::string reason;
  comm::Status st = select_interfaces(spec, all, &chosen, &reason);
  if (why) *why = reason;
  REQUIRE(st.ok());
  return names(chosen);
}

}  // namespace

TEST_CASE("unset spec prefers ib* interfaces over everything else", "[interfaces]") {
  std::string why;
  CHECK(pick("", busy_host(), &why) == std::vector<std::string>{"ib0/10.0.0.2", "ib1/10.0.1.2"});
  CHECK(why.find("NCCL_SOCKET_IFNAME unset") != std::string::npos);
  CHECK(why.find("ib0") != std::string::npos);
}

TEST_CASE("unset spec without ib skips docker, lo and virbr, IPv4 before IPv6", "[interfaces]") {
  std::vector<Interface> all;
  for (const auto& itf : busy_host())
    if (itf.name.rfind("ib", 0) != 0) all.push_back(itf);
  std::string why;
  CHECK(pick("", all, &why) == std::vector<std::string>{"eth0/192.0.2.2", "eth0/fd00::2", "eth10/192.0.3.2",
                                                        "enp1s0/198.51.100.2"});
  CHECK(why == "NCCL_SOCKET_IFNAME unset: chose eth0, eth10, enp1s0 (default order: ib*, then not docker/lo/virbr)");
}

TEST_CASE("docker, virbr and lo are used only when nothing else is up", "[interfaces]") {
  std::string why;
  CHECK(pick("", {v4("lo", "127.0.0.1"), v4("docker0", "172.17.0.1"), v4("eth0", "192.0.2.2", false)}, &why) ==
        std::vector<std::string>{"docker0/172.17.0.1"});
  CHECK(why.find("last resort") != std::string::npos);
  CHECK(pick("", {v4("lo", "127.0.0.1"), v4("virbr0", "192.168.122.1")}) ==
        std::vector<std::string>{"virbr0/192.168.122.1"});
  CHECK(pick("", {v4("lo", "127.0.0.1")}) == std::vector<std::string>{"lo/127.0.0.1"});
}

TEST_CASE("a spec of prefixes selects every interface starting with one of them", "[interfaces]") {
  CHECK(pick("eth", busy_host()) == std::vector<std::string>{"eth0/192.0.2.2", "eth0/fd00::2", "eth10/192.0.3.2"});
  CHECK(pick("enp,ib1", busy_host()) == std::vector<std::string>{"ib1/10.0.1.2", "enp1s0/198.51.100.2"});
  // A prefix, not a substring: "0" matches nothing that merely contains it.
  std::vector<Interface> chosen;
  std::string why;
  comm::Status st = select_interfaces("th0", busy_host(), &chosen, &why);
  CHECK(st.code() == COMM_ERR_SYSTEM);
  CHECK(st.message().find("th0") != std::string::npos);
  CHECK(chosen.empty());
}

TEST_CASE("a leading ^ excludes prefixes", "[interfaces]") {
  CHECK(pick("^docker,lo,virbr,ib,eth", busy_host()) == std::vector<std::string>{"enp1s0/198.51.100.2"});
  // Explicit exclusion lists may pick what the default order avoids.
  CHECK(pick("^eth,ib,enp,virbr", busy_host()) == std::vector<std::string>{"lo/127.0.0.1", "docker0/172.17.0.1"});
}

TEST_CASE("= selects exact names only", "[interfaces]") {
  CHECK(pick("=eth0", busy_host()) == std::vector<std::string>{"eth0/192.0.2.2", "eth0/fd00::2"});
  CHECK(pick("=eth1,ib1", busy_host()) == std::vector<std::string>{"ib1/10.0.1.2"});
}

TEST_CASE("^= excludes exact names only", "[interfaces]") {
  auto got = pick("^=eth0,lo,docker0,virbr0,ib0,ib1,enp1s0", busy_host());
  CHECK(got == std::vector<std::string>{"eth10/192.0.3.2"});
}

TEST_CASE("down interfaces and spec that matches nothing are errors naming what is up", "[interfaces]") {
  std::vector<Interface> chosen;
  std::string why;
  comm::Status st = select_interfaces("=eth0", {v4("eth0", "192.0.2.2", false), v4("lo", "127.0.0.1")}, &chosen, &why);
  CHECK(st.code() == COMM_ERR_SYSTEM);
  CHECK(st.message().find("=eth0") != std::string::npos);
  CHECK(st.message().find("up: lo") != std::string::npos);
  st = select_interfaces("", {}, &chosen, &why);
  CHECK(st.code() == COMM_ERR_SYSTEM);
}

TEST_CASE("this machine's interfaces: lo is not chosen by default when eth0 is up", "[interfaces]") {
  std::vector<Interface> all = list_interfaces();
  for (const auto& itf : all) {
    INFO(itf.name << " " << itf.address);
    CHECK(itf.up);
    CHECK(itf.address.rfind("fe80:", 0) != 0);  // link-local IPv6 is skipped
  }
  bool eth0_up = std::any_of(all.begin(), all.end(), [](const Interface& i) { return i.name == "eth0"; });
  if (!eth0_up) {
    WARN("no eth0 with an address on this machine; only the lo half of this test runs");
  }
  std::vector<Interface> chosen;
  std::string why;
  REQUIRE(select_interfaces("", all, &chosen, &why).ok());
  INFO(why);
  if (eth0_up) {
    CHECK(std::none_of(chosen.begin(), chosen.end(), [](const Interface& i) { return i.name == "lo"; }));
    CHECK(why.find("eth0") != std::string::npos);
  }
  REQUIRE(select_interfaces("=lo", all, &chosen, &why).ok());
  CHECK(chosen.front().address == "127.0.0.1");
}

// Issue 34: every chosen address is published, the route to the store's host first; the route
// only reorders what the spec chose, never adds to it.
TEST_CASE("the interface on the route to the store goes first, the rest keep their order", "[interfaces]") {
  std::vector<Interface> list = {v4("eth0", "10.76.0.1"), v6("eth1", "fd77::1"), v4("eth1", "10.77.0.1"),
                                 v4("eth2", "10.78.0.1")};
  comm::topology::put_route_first("10.77.0.1", &list);
  CHECK(names(list) == std::vector<std::string>{"eth1/fd77::1", "eth1/10.77.0.1", "eth0/10.76.0.1", "eth2/10.78.0.1"});
  // A route through an interface the spec left out changes nothing.
  std::vector<Interface> chosen = {v4("eth0", "10.76.0.1"), v4("eth2", "10.78.0.1")};
  comm::topology::put_route_first("10.77.0.1", &chosen);
  CHECK(names(chosen) == std::vector<std::string>{"eth0/10.76.0.1", "eth2/10.78.0.1"});
  comm::topology::put_route_first("", &chosen);
  CHECK(names(chosen) == std::vector<std::string>{"eth0/10.76.0.1", "eth2/10.78.0.1"});
}
