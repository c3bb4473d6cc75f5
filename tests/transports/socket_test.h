// What the socket transport's test files share (test_socket_transport.cc, test_socket_handshake.cc,
// test_socket_connections.cc): ranks as threads over an in-memory store on this machine's own
// addresses (make_world; their options and published addresses: support/socket_options.h), an
// 8 MiB exchange.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
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
#include "transport.h"
#include "support/socket_options.h"
#include "support/transport_test.h"

namespace socket_test {

using namespace comm;
using namespace comm::testing;
using namespace comm::transport;
namespace topology = comm::topology;

inline constexpr int kTestTimeoutMs = kSocketTestTimeoutMs;  // options_for's (support/socket_options.h)
// "Fails promptly, not at the timeout": half the timeout, seconds more than a busy host adds to
// a failure seen at once (tests/support/loaded_host.h).
inline constexpr double kPromptS = kTestTimeoutMs / 2000.0;

struct World {
  std::shared_ptr<Store> store;
  std::vector<std::unique_ptr<Transport>> ranks;
};

// Every rank's setup blocks until the mesh is complete, so they start together.
inline World make_world(int n, int timeout_ms = kTestTimeoutMs) {
  World w;
  w.store = memory_store(unique_store_name());
  w.ranks.resize(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      status[static_cast<size_t>(r)] = create_socket_transport(options_for(r, n, w.store, timeout_ms),
                                                               &w.ranks[static_cast<size_t>(r)]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << status[static_cast<size_t>(r)].message());
    REQUIRE(status[static_cast<size_t>(r)].ok());
  }
  return w;
}

inline int configured_nconns() {
  int64_t n = 0;
  REQUIRE(params::get_int("COMM_SOCKET_NCONNS", &n).ok());
  REQUIRE(n <= sock::kMaxConns);  // the registry's range fits the wire's capacity
  return static_cast<int>(n);
}

inline int connect_to(const std::string& address) {
  sock::SockAddr addr;
  REQUIRE(sock::parse_address(address, &addr).ok());
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, addr.get(), addr.len) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline std::string published_address(World& w, int rank) {
  std::string address;
  REQUIRE(w.store->get("addr/" + std::to_string(rank), &address, Deadline::after_ms(1000)).ok());
  return address;
}

// Rank 0 and 1 exchange 8 MiB + 3 bytes, checked: "" or what went wrong.
inline std::string exchange_big(World& w) {
  const size_t bytes = (size_t{8} << 20) + 3;
  auto problems = run_ranks(2, [&](int r) -> std::string {
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(r, 0, i);
    Status st = sendrecv(*w.ranks[static_cast<size_t>(r)], 1 - r, tag(1, bytes), out.data(), bytes, 1 - r, in.data(),
                         bytes);
    if (!st.ok()) return st.message();
    for (size_t i = 0; i < bytes; ++i)
      if (in[i] != pattern(1 - r, 0, i)) return "byte " + std::to_string(i) + " is wrong";
    return "";
  });
  return problems[0] + problems[1];
}


}  // namespace socket_test
