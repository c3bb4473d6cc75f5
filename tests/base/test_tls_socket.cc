// The socket transport over COMM_TLS (issue 28; transports/socket/): a relay between two TLS ranks
// sees none of the payload and none of the secret; a rank without TLS, or with a certificate the
// CA did not sign, is refused, naming it; failures (a peer's ERROR frame, a peer gone) read as
// over plaintext.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "interfaces.h"
#include "posix/endpoints.h"
#include "socket/net.h"
#include "socket/socket_transport.h"
#include "socket/wire.h"
#include "store/store.h"
#include "support/socket_options.h"
#include "support/tcp_relay.h"
#include "support/transport_test.h"
#include "tls_pki.h"
#include "tls_test_support.h"
#include "transport.h"

using namespace comm;
using namespace comm::testing;
using namespace comm::tls_test;
using namespace comm::transport;
namespace topology = comm::topology;

namespace {

// The job's secret, in the ranks' Options and in the TLS contexts' pre-shared key (psk_config).
const std::string kSecret = "job-secret-tls-relay-0123456789";

// Two ranks; rank 1's dials to rank 0 go through a relay that records every byte.
struct RelayedPair {
  std::shared_ptr<Store> store0, store1;
  std::unique_ptr<Transport> t0, t1;
  std::unique_ptr<TcpRelay> relay;
};

void make_relayed_pair(std::shared_ptr<tls::Context> tls0, std::shared_ptr<tls::Context> tls1, RelayedPair* p) {
  p->store0 = memory_store(unique_store_name());
  p->store1 = memory_store(unique_store_name());
  Status made0, made1;
  std::thread make0([&] {
    made0 = create_socket_transport(options_for(0, 2, p->store0, kSocketTestTimeoutMs, kSecret, tls0), &p->t0);
  });
  std::thread make1([&] {
    made1 = create_socket_transport(options_for(1, 2, p->store1, kSocketTestTimeoutMs, kSecret, tls1), &p->t1);
  });
  const std::string addr0 = published_address_of(p->store0, 0);
  const std::string addr1 = published_address_of(p->store1, 1);
  sock::SockAddr target;
  REQUIRE(sock::parse_address(addr0, &target).ok());
  p->relay = std::make_unique<TcpRelay>(target.get(), target.len);
  REQUIRE(p->store0->set("addr/1", addr1).ok());
  REQUIRE(p->store1->set("addrs", "127.0.0.1:" + std::to_string(p->relay->port()) + "\n" + addr1).ok());
  make0.join();
  make1.join();
  INFO(made0.message() << " / " << made1.message());
  REQUIRE(made0.ok());
  REQUIRE(made1.ok());
}

// Rank 1 sends `out` to rank 0 (its dial goes through the relay); returns both statuses.
void send_1_to_0(RelayedPair& p, const std::vector<uint8_t>& out, std::vector<uint8_t>* in, Status* sent,
                 Status* received) {
  in->assign(out.size(), 0);
  RequestId send_id, recv_id;
  REQUIRE(p.t1->isend(0, tag(1, out.size()), out.data(), out.size(), &send_id).ok());
  std::thread rank1([&] { *sent = p.t1->wait(&send_id, 1); });
  REQUIRE(p.t0->irecv(1, tag(1, out.size()), in->data(), in->size(), &recv_id).ok());
  *received = p.t0->wait(&recv_id, 1);
  rank1.join();
}

}  // namespace

// The relay test of the handshake (test_socket_transport.cc), with COMM_TLS: the libcomm handshake
// is still there (its magic numbers), then nothing of the payload -- 1 MiB, striped over the
// connections -- nor of the secret.
TEST_CASE("a relay between two TLS ranks sees the handshake but no payload and no secret", "[socket][tls]") {
  auto ctx = context(psk_config(kSecret));
  RelayedPair p;
  make_relayed_pair(ctx, ctx, &p);
  const std::vector<uint8_t> out = payload(1 << 20);
  std::vector<uint8_t> in;
  Status sent, received;
  send_1_to_0(p, out, &in, &sent, &received);
  INFO(sent.message() << " / " << received.message());
  REQUIRE(sent.ok());
  REQUIRE(received.ok());
  CHECK(in == out);

  const std::string wire = p.relay->captured();
  CHECK(wire.size() > out.size());  // all of it went through the relay
  const uint64_t hello_magic = sock::kHelloMagic, proof_magic = sock::kProofMagic;
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&hello_magic), 8)) != std::string::npos);
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&proof_magic), 8)) != std::string::npos);
  // Any 16 bytes of the payload, a frame header's magic, the secret: none in clear.
  for (size_t at : {size_t{0}, size_t{4096}, out.size() / 2, out.size() - 16})
    CHECK(wire.find(std::string(reinterpret_cast<const char*>(out.data()) + at, 16)) == std::string::npos);
  const uint32_t frame_magic = sock::kFrameMagic;
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&frame_magic), 4)) == std::string::npos);
  CHECK(wire.find(kSecret) == std::string::npos);
}

TEST_CASE("a rank without TLS is refused by one with it, and both name COMM_TLS", "[socket][tls]") {
  for (bool acceptor_tls : {true, false}) {
    INFO("rank 0 (the acceptor) " << (acceptor_tls ? "with" : "without") << " TLS");
    auto ctx = context(psk_config(kSecret));
    RelayedPair p;
    make_relayed_pair(acceptor_tls ? ctx : nullptr, acceptor_tls ? nullptr : ctx, &p);
    std::vector<uint8_t> in;
    Status sent, received;
    send_1_to_0(p, payload(64), &in, &sent, &received);
    CHECK(sent.code() == COMM_ERR_INVALID_USAGE);
    CHECK_THAT(sent.message(), Catch::Contains("rank 0") && Catch::Contains("COMM_TLS"));
    CHECK(received.code() == COMM_ERR_INVALID_USAGE);
    CHECK_THAT(received.message(), Catch::Contains("rank 1") && Catch::Contains("COMM_TLS"));
  }
}

TEST_CASE("a TLS rank whose certificate the CA did not sign is refused, naming it", "[socket][tls]") {
  auto pki = make_pki();
  RelayedPair p;
  make_relayed_pair(context(pki->rogue), context(pki->rank_b), &p);
  // Rank 1 dials rank 0 (the rogue): rank 1 refuses its certificate, naming it; rank 0 logs the
  // alert and keeps listening (its calls, test() here, serve the listener).
  char buf[8];
  RequestId send_id, recv_id;
  REQUIRE(p.t0->irecv(1, tag(1, 8), buf, 8, &recv_id).ok());
  std::atomic<bool> stop{false};
  std::thread rank0([&] {
    bool done = false;
    while (!stop.load() && !done && p.t0->test(recv_id, &done).ok())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  REQUIRE(p.t1->isend(0, tag(1, 8), "12345678", 8, &send_id).ok());
  Status sent = p.t1->wait(&send_id, 1);
  stop.store(true);
  rank0.join();
  CHECK(sent.code() == COMM_ERR_SYSTEM);
  CHECK_THAT(sent.message(), Catch::Contains("rank 0") && Catch::Contains("certificate"));
}

TEST_CASE("over TLS a peer's failure report and a peer's death read as over plaintext", "[socket][tls]") {
  auto ctx = context(psk_config(kSecret));
  RelayedPair p;
  make_relayed_pair(ctx, ctx, &p);
  std::vector<uint8_t> in;
  Status sent, received;
  send_1_to_0(p, payload(1 << 20), &in, &sent, &received);  // connected, with data flowing
  REQUIRE(sent.ok());
  REQUIRE(received.ok());

  SECTION("an ERROR frame") {
    std::vector<uint8_t> buf(1 << 20);
    RequestId recv_id;
    REQUIRE(p.t0->irecv(1, tag(2, buf.size()), buf.data(), buf.size(), &recv_id).ok());
    p.t1->notify_peers(RemoteError("rank 1 hit a wall in allreduce #2"), 0);
    Status st = p.t0->wait(&recv_id, 1);
    CHECK(st.code() == COMM_ERR_REMOTE);
    CHECK_THAT(st.message(), Catch::Contains("rank 1 reported: rank 1 hit a wall"));
  }
  SECTION("a peer gone without a word (its process killed)") {
    std::vector<uint8_t> buf(1 << 20);
    RequestId recv_id;
    REQUIRE(p.t0->irecv(1, tag(2, buf.size()), buf.data(), buf.size(), &recv_id).ok());
    p.t1->abort();  // an aborted transport closes without GOODBYE, as a killed process does
    p.t1.reset();
    Status st = p.t0->wait(&recv_id, 1);
    CHECK(st.code() == COMM_ERR_REMOTE);
    CHECK_THAT(st.message(), Catch::Contains("rank 1") && Catch::Contains("closed its connection"));
  }
}
