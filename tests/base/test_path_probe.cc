// The reachability probe's mechanism (posix/path_probe.h): a TCP handshake per address, an
// address of this host beside others never dialed (a look-alike), every outcome named. On loopback:
// 127.0.0.2 is not one of this host's interface addresses (getifaddrs lists 127.0.0.1), yet
// reaches a listener bound to it, so it stands for another host. The unanswered handshake and
// the grace after another address answered are covered in namespaces (messy-* tests).
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>
#include <vector>

#include "posix/path_probe.h"
#include "posix/socket.h"

using comm::posix::ProbeResult;

TEST_CASE("a probe proves a listener, names a refusal, and dials this host's own address only alone", "[endpoints]") {
  comm::posix::Fd listener, closed;
  comm::posix::SockAddr up, gone;
  REQUIRE(comm::posix::listen_on("127.0.0.2", AF_INET, 4, &listener, &up).ok());
  REQUIRE(comm::posix::listen_on("127.0.0.2", AF_INET, 4, &closed, &gone).ok());
  closed.reset();  // nothing listens on that port any more: refused
  comm::posix::Fd own;
  comm::posix::SockAddr own_addr;
  REQUIRE(comm::posix::listen_on("127.0.0.1", AF_INET, 4, &own, &own_addr).ok());
  const std::vector<std::vector<std::string>> groups = {
      {comm::posix::format_address(up), comm::posix::format_address(gone)},
      {comm::posix::format_address(own_addr), "not-an-address:1"},
      {comm::posix::format_address(own_addr)}};
  std::vector<std::vector<ProbeResult>> out;
  comm::posix::probe_paths(groups, 4000, 250, &out);
  REQUIRE(out.size() == 3);
  REQUIRE(out[0].size() == 2);
  REQUIRE(out[1].size() == 2);
  CHECK(out[0][0].err == 0);
  CHECK(out[0][0].local_if == "lo");
  CHECK(out[0][1].err == ECONNREFUSED);
  CHECK(comm::posix::probe_error_text(out[0][1].err, 0).find("(ECONNREFUSED)") != std::string::npos);
  CHECK(out[1][0].err == comm::posix::kProbeOwnAddress);
  CHECK(out[1][1].err == EINVAL);
  // This host's address beside another is a look-alike, not dialed; alone (a rank on this
  // machine told apart by COMM_HOST_ID) it is dialed, once: one connection waits in the queue.
  CHECK(out[2][0].err == 0);
  comm::posix::Fd once(::accept(own.get(), nullptr, nullptr));
  CHECK(once.valid());
  CHECK(::accept(own.get(), nullptr, nullptr) < 0);
}

TEST_CASE("a local address is named with its prefix length", "[endpoints]") {
  CHECK(comm::posix::address_with_prefix("127.0.0.1") == "127.0.0.1/8");
  CHECK(comm::posix::address_with_prefix("192.0.2.77") == "192.0.2.77");  // no interface holds it
  CHECK(comm::posix::probe_error_text(comm::posix::kProbeNoAnswer, 250) ==
        "no answer to the TCP handshake within 250 ms");
}
