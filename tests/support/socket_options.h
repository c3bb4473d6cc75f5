// What every test of the socket transport with ranks as threads needs, whichever floor's folder
// it lives in (tests/transports/socket_test.h for the transport's own files, test_socket_addresses.cc,
// tests/base/test_tls_socket.cc for it over TLS): store names no other test takes, each rank's
// Options on this machine's own addresses, and the address a rank published.
#pragma once

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "interfaces.h"
#include "posix/endpoints.h"
#include "store/store.h"
#include "tls/tls.h"
#include "transport.h"

namespace comm::testing {

inline constexpr int kSocketTestTimeoutMs = 20000;
inline const std::string kSocketTestSecret = "job-secret-1234";

// One counter for the whole program (an inline function's static), so no two stores share a name.
inline std::string unique_store_name() {
  static std::atomic<int> counter{0};
  return "socket-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// Rank `rank` of `size`, all on this host (loopback unless COMM_SOCKET_IFNAME names another
// interface: the addresses are chosen as the core chooses them). No Catch2 assertion here: ranks
// call it on threads of their own, and Catch2 is not thread-safe.
inline transport::Options options_for(int rank, int size, std::shared_ptr<Store> store,
                                      int timeout_ms = kSocketTestTimeoutMs,
                                      const std::string& secret = kSocketTestSecret,
                                      std::shared_ptr<tls::Context> tls = nullptr) {
  transport::Options o;
  o.rank = rank;
  o.size = size;
  o.timeout_ms = timeout_ms;
  o.secret = secret;
  o.store = std::move(store);
  o.comm_label = "test";
  o.all_local = true;
  o.tls = std::move(tls);
  std::string why;
  if (topology::choose_socket_addresses(o.all_local, &o.listen.addresses, &why).ok()) o.listen.why = why;
  return o;
}

// The first of the addresses a rank published ("lo/127.0.0.1:41000,..."): its "host:port".
inline std::string published_address_of(const std::shared_ptr<Store>& store, int rank) {
  std::string text;
  REQUIRE(store->get("addr/" + std::to_string(rank), &text, Deadline::after_ms(10000)).ok());
  std::vector<posix::Endpoint> list;
  REQUIRE(posix::decode_endpoints(text, &list));
  return list.front().hostport;
}

}  // namespace comm::testing
