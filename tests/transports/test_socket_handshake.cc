// The socket transport's handshake (socket/wire.h), with ranks as threads over an in-memory store:
// strangers at the listener, the job secret proven and never sent, malformed frames from an
// authenticated peer. Catch2 is not thread-safe: rank threads return what they saw and the main
// thread checks it.
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

namespace {

bool send_all(int fd, const void* data, size_t n) {
  return ::send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

// 0: the other side closed; -1: error (ECONNRESET counts as closed by the caller); >0 bytes.
ssize_t recv_some(int fd, void* buf, size_t n) { return ::recv(fd, buf, n, 0); }

bool recv_exact(int fd, void* buf, size_t n) { return ::recv(fd, buf, n, MSG_WAITALL) == static_cast<ssize_t>(n); }

// The connector's half of the handshake (socket/wire.h) by hand, proving `secret`: the Hello, the
// acceptor's challenge, the Proof; returns the acceptor's verdict. *proved_back: a kOk came with
// the acceptor's valid proof of `secret`.
sock::Reply handshake_by_hand(int fd, int rank, int size, int index, int nconns, const std::string& secret,
                              bool* proved_back = nullptr, int target = 0) {
  Nonce mine{};
  REQUIRE(random_nonce(&mine).ok());
  sock::Hello h{sock::kHelloMagic, sock::kProtocolVersion, rank, size, static_cast<uint32_t>(index),
                static_cast<uint32_t>(nconns), 0, {}, target, 0};
  std::memcpy(h.nonce, mine.data(), mine.size());
  REQUIRE(::send(fd, &h, sizeof h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h));
  sock::Reply challenge{};
  REQUIRE(recv_exact(fd, &challenge, sizeof challenge));
  REQUIRE(challenge.magic == sock::kReplyMagic);
  REQUIRE(challenge.code == static_cast<uint32_t>(sock::ReplyCode::kChallenge));
  Nonce theirs{};
  REQUIRE(recv_exact(fd, theirs.data(), theirs.size()));
  sock::Proof p{sock::kProofMagic, {}};
  const Digest proof = proof_of_secret(secret, sock::proof_context("test", target, 0), Prover::kClient, mine, theirs);
  std::memcpy(p.proof, proof.data(), proof.size());
  REQUIRE(::send(fd, &p, sizeof p, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof p));
  sock::Reply verdict{};
  REQUIRE(recv_exact(fd, &verdict, sizeof verdict));
  uint8_t back[kDigestBytes] = {};
  if (verdict.code == static_cast<uint32_t>(sock::ReplyCode::kOk)) REQUIRE(recv_exact(fd, back, sizeof back));
  if (proved_back != nullptr)
    *proved_back = verdict.code == static_cast<uint32_t>(sock::ReplyCode::kOk) &&
                   check_proof(secret, sock::proof_context("test", target, 0), Prover::kServer, mine, theirs, back);
  return verdict;
}

}  // namespace

TEST_CASE("strangers at the listener are dropped and the job's connections still complete", "[socket]") {
  World w = make_world(2);
  std::string address = published_address_of(w.store, 0);
  // Rank 0 waits on rank 1: its wait serves the listener (and dials rank 1).
  uint32_t out = 0xC0FFEE, in = 0;
  RequestId recv_id;
  REQUIRE(w.ranks[0]->irecv(1, tag(1, 1), &in, sizeof in, &recv_id).ok());
  Status status0;
  std::thread rank0([&] { status0 = w.ranks[0]->wait(&recv_id, 1); });

  // 1. Random bytes: closed without a reply.
  int garbage = connect_to(address);
  std::mt19937 rng(42);
  std::vector<uint8_t> noise(256);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  REQUIRE(send_all(garbage, noise.data(), noise.size()));
  char byte;
  ssize_t n = recv_some(garbage, &byte, 1);
  CHECK(n <= 0);  // EOF or reset: dropped
  ::close(garbage);

  // 2. A well-formed handshake with the wrong secret: refused with a reply, then closed.
  int stranger = connect_to(address);
  sock::Reply reply = handshake_by_hand(stranger, 1, 2, 0, configured_nconns(), "not-the-secret");
  CHECK(reply.magic == sock::kReplyMagic);
  CHECK(reply.code == static_cast<uint32_t>(sock::ReplyCode::kBadSecret));
  CHECK(recv_some(stranger, &byte, 1) <= 0);
  ::close(stranger);

  // 3. A transport of another job: its first send fails fast, naming the secret; rank 0 keeps waiting.
  std::unique_ptr<Transport> wrong;
  REQUIRE(create_socket_transport(options_for(1, 2, w.store, kTestTimeoutMs, "other-job"), &wrong).ok());
  auto start = std::chrono::steady_clock::now();
  RequestId wrong_id;
  REQUIRE(wrong->isend(0, tag(1, 1), &out, sizeof out, &wrong_id).ok());
  Status wrong_status = wrong->wait(&wrong_id, 1);
  CHECK(wrong_status.code() == COMM_ERR_SYSTEM);
  CHECK_THAT(wrong_status.message(), Catch::Contains("secret"));
  CHECK(seconds_since(start) < kPromptS);

  // 4. The real rank 1 sends: rank 0's wait ends with its bytes.
  RequestId send_id;
  REQUIRE(w.ranks[1]->isend(0, tag(1, 1), &out, sizeof out, &send_id).ok());
  Status status1 = w.ranks[1]->wait(&send_id, 1);
  rank0.join();
  INFO(status0.message() << " / " << status1.message());
  REQUIRE(status0.ok());
  REQUIRE(status1.ok());
  CHECK(in == out);
}

// Issue 15: the job secret is proven, never sent. Rank 1 reads rank 0's address from its own
// store, where the test has put a real TCP relay's, so its dial to rank 0 goes through the relay,
// which records every byte both ways: the handshake is there, the secret is not.
TEST_CASE("the job secret never goes on the wire: a relay between two ranks sees the handshake only", "[socket]") {
  auto store0 = memory_store(unique_store_name());
  auto store1 = memory_store(unique_store_name());
  std::unique_ptr<Transport> t0, t1;
  Status made0, made1;
  std::thread make0([&] { made0 = create_socket_transport(options_for(0, 2, store0), &t0); });
  std::thread make1([&] { made1 = create_socket_transport(options_for(1, 2, store1), &t1); });
  const std::string addr0 = published_address_of(store0, 0);
  const std::string addr1 = published_address_of(store1, 1);
  sock::SockAddr target;
  REQUIRE(sock::parse_address(addr0, &target).ok());
  testing::TcpRelay relay(target.get(), target.len);
  REQUIRE(store0->set("addr/1", addr1).ok());
  REQUIRE(store1->set("addrs", "127.0.0.1:" + std::to_string(relay.port()) + "\n" + addr1).ok());
  make0.join();
  make1.join();
  INFO(made0.message() << " / " << made1.message());
  REQUIRE(made0.ok());
  REQUIRE(made1.ok());

  // Rank 1 dials first (through the relay); rank 0's own dial, if any, loses to it (higher rank wins).
  uint64_t out = 0x5EC12E7, in = 0;
  RequestId send_id, recv_id;
  REQUIRE(t1->isend(0, tag(1, 7), &out, sizeof out, &send_id).ok());
  Status sent;
  std::thread rank1([&] { sent = t1->wait(&send_id, 1); });
  const auto dialing = std::chrono::steady_clock::now();
  while (relay.connections() == 0 && seconds_since(dialing) < loaded_host::kSlackS)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(relay.connections() > 0);
  REQUIRE(t0->irecv(1, tag(1, 7), &in, sizeof in, &recv_id).ok());
  Status received = t0->wait(&recv_id, 1);
  rank1.join();
  INFO(sent.message() << " / " << received.message());
  REQUIRE(sent.ok());
  REQUIRE(received.ok());
  CHECK(in == out);

  const std::string wire = relay.captured();
  const uint64_t hello_magic = sock::kHelloMagic, proof_magic = sock::kProofMagic;
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&hello_magic), 8)) != std::string::npos);
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&proof_magic), 8)) != std::string::npos);
  CHECK(wire.find(std::string(reinterpret_cast<const char*>(&out), sizeof out)) != std::string::npos);
  CHECK(wire.find(kSocketTestSecret) == std::string::npos);
}

TEST_CASE("garbage from an authenticated peer closes its connection, never crashes", "[socket]") {
  auto store = memory_store(unique_store_name());
  const int nconns = configured_nconns();
  // Rank 1 is this test: it publishes a listener that never answers, and dials rank 0 by hand.
  sock::Fd fake_listener;
  sock::SockAddr fake_bound;
  REQUIRE(sock::listen_on("127.0.0.1", AF_INET, 8, &fake_listener, &fake_bound).ok());
  REQUIRE(store->set("addr/1", sock::format_address(fake_bound)).ok());
  std::unique_ptr<Transport> t0;
  REQUIRE(create_socket_transport(options_for(0, 2, store), &t0).ok());
  std::string address = published_address_of(store, 0);

  std::vector<uint8_t> buf(16);
  RequestId id;
  REQUIRE(t0->irecv(1, tag(1, 4), buf.data(), buf.size(), &id).ok());  // rank 0 dials rank 1 now
  Status st;
  std::thread rank0([&] { st = t0->wait(&id, 1); });
  std::vector<int> fake(static_cast<size_t>(nconns));
  for (int k = 0; k < nconns; ++k) {
    fake[static_cast<size_t>(k)] = connect_to(address);
    bool proved_back = false;
    sock::Reply reply =
        handshake_by_hand(fake[static_cast<size_t>(k)], 1, 2, k, nconns, kSocketTestSecret, &proved_back);
    // Both dialed: the higher rank's dial (this one) wins.
    REQUIRE(reply.code == static_cast<uint32_t>(sock::ReplyCode::kOk));
    CHECK(proved_back);  // rank 0 proved the secret back
  }

  // A header whose part lies far outside its message.
  sock::FrameHeader h{};
  h.magic = sock::kFrameMagic;
  h.kind = static_cast<uint8_t>(sock::FrameKind::kData);
  h.coll = static_cast<uint8_t>(CollKind::kAllreduce);
  h.seq = 1;
  h.total_bytes = 16;
  h.offset = 8;
  h.length = uint64_t{1} << 40;
  REQUIRE(send_all(fake[0], &h, sizeof h));
  rank0.join();
  CHECK(st.code() == COMM_ERR_REMOTE);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 sent a malformed frame"));
  for (int fd : fake) ::close(fd);
}
