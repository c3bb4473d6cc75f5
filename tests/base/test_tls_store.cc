// The TCP store over COMM_TLS (issue 28; libcomm/base/store/): a relay between a rank and the
// store sees no key, no value, no token; a store slow to answer the ClientHello still lets a client
// in; a store and a client that disagree on COMM_TLS, or a certificate its CA did not sign, refused.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "store/store.h"
#include "support/tcp_relay.h"
#include "support/transport_test.h"
#include "tls_pki.h"
#include "tls_test_support.h"

using namespace comm;
using namespace comm::testing;
using namespace comm::tls_test;

namespace {

const std::string kSecret = "job-secret-tls-relay-0123456789";

TcpStoreOptions store_options(bool server, int port, const std::string& token, std::shared_ptr<tls::Context> tls) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.is_server = server;
  o.timeout_ms = 5000;
  o.auth_token = token;
  o.tls = std::move(tls);
  return o;
}

std::shared_ptr<tls::Context> store_tls(const std::string& token) {
  tls::Config c;
  c.psk = tls::psk_from_secret(token, "store");
  return context(c);
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

}  // namespace

// The verdict carries the job secret through the store: under TLS the relay between a rank and
// the store sees neither it, nor the token, nor any key or value.
TEST_CASE("a relay between a rank and a TLS store sees no key, no value, no token", "[store][tls]") {
  const std::string token = "store-tls-token-relay-must-not-see";
  std::shared_ptr<Store> server;
  REQUIRE(make_tcp_store(store_options(true, 0, token, store_tls(token)), &server).ok());
  sockaddr_in target = loopback(tcp_store_port(*server));
  TcpRelay relay(reinterpret_cast<sockaddr*>(&target), sizeof target);
  std::shared_ptr<Store> client;
  Status st = make_tcp_store(store_options(false, relay.port(), token, store_tls(token)), &client);
  INFO(st.message());
  REQUIRE(st.ok());
  const std::string secret = "OK\n" + kSecret + "R\n0,0\n";  // what an init verdict starts with
  std::string big(256 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(pattern(2, 1, i));
  REQUIRE(client->set("init/verdict", secret).ok());
  REQUIRE(client->set("big-value", big).ok());
  std::string got;
  REQUIRE(client->get("init/verdict", &got, Deadline::after_ms(5000)).ok());
  CHECK(got == secret);
  REQUIRE(server->get("big-value", &got, Deadline::after_ms(5000)).ok());
  CHECK(got == big);
  int64_t sum = 0;
  REQUIRE(client->add("counter-key-in-clear?", 41, &sum).ok());
  CHECK(sum == 41);

  const std::string wire = relay.captured();
  CHECK(wire.size() > big.size());  // it all went through the relay
  CHECK(wire.find(kSecret) == std::string::npos);
  CHECK(wire.find(token) == std::string::npos);
  CHECK(wire.find("init/verdict") == std::string::npos);
  CHECK(wire.find("counter-key-in-clear?") == std::string::npos);
  for (size_t at : {size_t{0}, big.size() / 2, big.size() - 16}) CHECK(wire.find(big.substr(at, 16)) == std::string::npos);
}

// A rank 0 busy with a burst may take seconds to answer a ClientHello (issue 28: 200 ranks on two
// busy cores). The client's TLS handshake has the connect's whole deadline, like its greeting: it
// once had 1 s (Deadline::remaining_ms()'s default cap), and after a good token proof took that
// timeout as final, so ranks failed with "TLS handshake: no answer in time".
TEST_CASE("a TLS store slow to answer the ClientHello still lets a client with a token in", "[store][tls]") {
  const std::string token = "store-tls-token-slow-rank0";
  std::shared_ptr<Store> server;
  REQUIRE(make_tcp_store(store_options(true, 0, token, store_tls(token)), &server).ok());
  sockaddr_in target = loopback(tcp_store_port(*server));
  TcpRelay relay(reinterpret_cast<sockaddr*>(&target), sizeof target);
  relay.hold_first_tls_answer(2500);
  TcpStoreOptions o = store_options(false, relay.port(), token, store_tls(token));
  o.timeout_ms = 60000;
  std::shared_ptr<Store> client;
  Status st = make_tcp_store(o, &client);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(relay.connections() == 1);  // in on its first connection: nothing was given up
  REQUIRE(client->set("k", "v").ok());
  std::string got;
  REQUIRE(server->get("k", &got, Deadline::after_ms(60000)).ok());
  CHECK(got == "v");
}

TEST_CASE("a store and a client that disagree on COMM_TLS refuse each other, naming it", "[store][tls]") {
  const std::string token = "store-tls-token";
  for (bool server_tls : {true, false}) {
    INFO("the server " << (server_tls ? "with" : "without") << " TLS");
    std::shared_ptr<Store> server, client;
    REQUIRE(make_tcp_store(store_options(true, 0, token, server_tls ? store_tls(token) : nullptr), &server).ok());
    Status st = make_tcp_store(
        store_options(false, tcp_store_port(*server), token, server_tls ? nullptr : store_tls(token)), &client);
    CHECK(st.code() == COMM_ERR_INVALID_USAGE);
    CHECK_THAT(st.message(), Catch::Contains("COMM_TLS") && Catch::Contains("the store at 127.0.0.1:"));
  }
}

TEST_CASE("a TLS store refuses a client whose certificate its CA did not sign", "[store][tls]") {
  auto pki = make_pki();
  std::shared_ptr<Store> server, client;
  REQUIRE(make_tcp_store(store_options(true, 0, "", context(pki->rank_a)), &server).ok());
  Status st = make_tcp_store(store_options(false, tcp_store_port(*server), "", context(pki->rogue)), &client);
  CHECK(st.code() == COMM_ERR_SYSTEM);
  CHECK_THAT(st.message(), Catch::Contains("the store at 127.0.0.1:") && Catch::Contains("TLS"));
  // The CA's own: in.
  REQUIRE(make_tcp_store(store_options(false, tcp_store_port(*server), "", context(pki->rank_b)), &client).ok());
  REQUIRE(client->set("k", "v").ok());
}
