// What only the socket transport has, with ranks as threads over an in-memory store on this
// machine's own addresses: setup deadlines, the interface choice, striping over COMM_SOCKET_NCONNS,
// IPv6. The handshake is in test_socket_handshake.cc, connections made on first use and the
// progress thread in test_socket_connections.cc; transport.h's contract is checked for every
// transport in transport_conformance.cc. Catch2 is not thread-safe: rank threads return what they
// saw and the main thread checks it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "params.h"
#include "store/store.h"
#include "interfaces.h"
#include "posix/endpoints.h"
#include "socket/net.h"
#include "socket/socket_transport.h"
#include "socket/wire.h"
#include "crypto/proof.h"
#include "transport.h"
#include "support/env_guard.h"
#include "support/loaded_host.h"
#include "support/transport_test.h"
#include "support/tcp_relay.h"
#include "socket_test.h"

using namespace socket_test;  // and comm, comm::testing, comm::transport

TEST_CASE("setup times out naming the ranks that never published their address", "[socket]") {
  auto store = memory_store(unique_store_name());
  std::unique_ptr<Transport> t0;
  auto start = std::chrono::steady_clock::now();
  Status st = create_socket_transport(options_for(0, 3, store, 300), &t0);
  CHECK(st.code() == COMM_ERR_TIMEOUT);
  CHECK_THAT(st.message(), Catch::Contains("rank(s) 1, 2 never published"));
  CHECK(seconds_since(start) >= 0.29);
  CHECK(seconds_since(start) < 0.3 + loaded_host::kSlackS);  // the 300 ms deadline ended it, not a hang
}

TEST_CASE("a single-rank transport needs no network", "[socket]") {
  std::unique_ptr<Transport> t;
  Options o = options_for(0, 1, nullptr);
  REQUIRE(create_socket_transport(o, &t).ok());
  RequestId id;
  CHECK(t->isend(0, tag(1), nullptr, 0, &id).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(t->wait(nullptr, 0).ok());
}

TEST_CASE("COMM_SOCKET_IFNAME picks the interface, falling back to NCCL_SOCKET_IFNAME", "[socket]") {
  EnvGuard keep_comm("COMM_SOCKET_IFNAME", nullptr);
  {
    EnvGuard nccl("NCCL_SOCKET_IFNAME", "=lo");
    World w = make_world(2);
    CHECK_THAT(published_address(w, 0), Catch::StartsWith("lo/127.0.0.1:"));
    CHECK(exchange_big(w) == "");
  }
  {
    // COMM_SOCKET_IFNAME wins over NCCL_SOCKET_IFNAME (checked without sending anything
    // over a real NIC: only loopback carries test traffic).
    EnvGuard nccl("NCCL_SOCKET_IFNAME", "=nosuch0");
    EnvGuard comm("COMM_SOCKET_IFNAME", "=lo");
    World w = make_world(2);
    CHECK_THAT(published_address(w, 1), Catch::StartsWith("lo/127.0.0.1:"));
  }
  {
    EnvGuard comm("COMM_SOCKET_IFNAME", "=nosuch0");
    topology::Interface itf;
    std::string why;
    Status st = topology::choose_socket_interface(true, &itf, &why);
    CHECK(st.code() == COMM_ERR_SYSTEM);
    CHECK_THAT(st.message(), Catch::Contains("COMM_SOCKET_IFNAME"));
    CHECK_THAT(st.message(), Catch::Contains("nosuch0"));
  }
}

TEST_CASE("large messages are striped correctly for any COMM_SOCKET_NCONNS", "[socket]") {
  for (const char* nconns : {"1", "3", "8"}) {
    EnvGuard env("COMM_SOCKET_NCONNS", nconns);
    INFO("COMM_SOCKET_NCONNS=" << nconns);
    World w = make_world(2);
    CHECK(exchange_big(w) == "");
  }
  EnvGuard env("COMM_SOCKET_NCONNS", "9");
  std::unique_ptr<Transport> t;
  CHECK(create_socket_transport(options_for(0, 2, memory_store(unique_store_name())), &t).code() ==
        COMM_ERR_INVALID_ARGUMENT);
}

TEST_CASE("IPv6 addresses are bracketed, parsed back and reachable", "[socket]") {
  bool have_v6_loopback = false;
  for (const auto& itf : topology::list_interfaces())
    if (itf.address == "::1") have_v6_loopback = true;
  if (!have_v6_loopback) {
    WARN("no ::1 on this machine; skipped");
    return;
  }
  sock::Fd listener;
  sock::SockAddr bound;
  REQUIRE(sock::listen_on("::1", AF_INET6, 4, &listener, &bound).ok());
  std::string text = sock::format_address(bound);
  CHECK_THAT(text, Catch::StartsWith("[::1]:"));
  int fd = connect_to(text);
  CHECK(fd >= 0);
  ::close(fd);
  sock::SockAddr parsed;
  CHECK(sock::parse_address("[fd00::2]:80", &parsed).ok());
  CHECK(parsed.family() == AF_INET6);
  CHECK(sock::parse_address("192.0.2.2", &parsed).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(sock::parse_address("192.0.2.2:99999", &parsed).code() == COMM_ERR_INVALID_ARGUMENT);
}
