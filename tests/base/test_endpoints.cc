// A rank's published addresses (posix/endpoints.h): "eth1/10.77.0.2:41000,eth0/[fd76::2]:41007",
// read back in order; a bare "host:port" (one address, no interface) still reads; anything
// malformed is refused as a whole, so a dialer never tries half of a garbled list.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "posix/endpoints.h"

using comm::posix::decode_endpoints;
using comm::posix::encode_endpoints;
using comm::posix::endpoint_host;
using comm::posix::Endpoint;

TEST_CASE("published addresses read back in order, with their interfaces", "[endpoints]") {
  const std::vector<Endpoint> list = {{"eth1", "10.77.0.2:41000"}, {"eth0", "[fd76::2]:41007"}, {"", "127.0.0.1:9"}};
  const std::string text = encode_endpoints(list);
  CHECK(text == "eth1/10.77.0.2:41000,eth0/[fd76::2]:41007,127.0.0.1:9");
  std::vector<Endpoint> back;
  REQUIRE(decode_endpoints(text, &back));
  REQUIRE(back.size() == 3);
  CHECK(back[0].ifname == "eth1");
  CHECK(back[1].hostport == "[fd76::2]:41007");
  CHECK(back[2].ifname.empty());
  CHECK(endpoint_host(back[0].hostport) == "10.77.0.2");
  CHECK(endpoint_host(back[1].hostport) == "fd76::2");
}

TEST_CASE("a garbled address list is refused whole", "[endpoints]") {
  std::vector<Endpoint> out;
  CHECK(decode_endpoints("10.0.0.1:80", &out));
  CHECK(out.size() == 1);
  CHECK_FALSE(decode_endpoints("", &out));
  CHECK_FALSE(decode_endpoints("eth0/10.0.0.1:80,eth1/nothost:1", &out));
  CHECK_FALSE(decode_endpoints("eth0/10.0.0.1:0", &out));
  CHECK_FALSE(decode_endpoints("eth0/10.0.0.1", &out));
  CHECK_FALSE(decode_endpoints("!rank 1 could not listen", &out));
}
