// What only the socket transport has, with ranks as threads over an in-memory store on this
// machine's own addresses: the handshake (strangers, secrets, malformed frames), setup
// deadlines, the interface choice, striping over COMM_SOCKET_NCONNS, IPv6. transport.h's
// contract is checked for every transport in transport_conformance.cc. Catch2 is not
// thread-safe: rank threads return what they saw and the main thread checks it.
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

using namespace comm;
using namespace comm::testing;
using namespace comm::transport;
namespace topology = comm::topology;

namespace {

constexpr int kTestTimeoutMs = 20000;
// "Fails promptly, not at the timeout": half the timeout, seconds more than a busy host adds to
// a failure seen at once (tests/support/loaded_host.h).
constexpr double kPromptS = kTestTimeoutMs / 2000.0;
const std::string kSecret = "job-secret-1234";

std::string unique_store_name() {
  static std::atomic<int> counter{0};
  return "socket-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

Options options_for(int rank, int size, std::shared_ptr<Store> store, int timeout_ms = kTestTimeoutMs,
                    const std::string& secret = kSecret) {
  Options o;
  o.rank = rank;
  o.size = size;
  o.timeout_ms = timeout_ms;
  o.secret = secret;
  o.store = std::move(store);
  o.comm_label = "test";
  o.all_local = true;  // single-host tests stay on loopback
  // The interface, chosen as the core chooses it (COMM_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, lo).
  std::string why;
  if (topology::choose_socket_addresses(o.all_local, &o.listen.addresses, &why).ok()) o.listen.why = why;
  return o;
}

struct World {
  std::shared_ptr<Store> store;
  std::vector<std::unique_ptr<Transport>> ranks;
};

// Every rank's setup blocks until the mesh is complete, so they start together.
World make_world(int n, int timeout_ms = kTestTimeoutMs) {
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

// The first of the addresses a rank published ("lo/127.0.0.1:41000,..."): its "host:port".
std::string published_address_of(const std::shared_ptr<Store>& store, int rank) {
  std::string text;
  REQUIRE(store->get("addr/" + std::to_string(rank), &text, Deadline::after_ms(10000)).ok());
  std::vector<posix::Endpoint> list;
  REQUIRE(posix::decode_endpoints(text, &list));
  return list.front().hostport;
}

int configured_nconns() {
  int64_t n = 0;
  REQUIRE(params::get_int("COMM_SOCKET_NCONNS", &n).ok());
  REQUIRE(n <= sock::kMaxConns);  // the registry's range fits the wire's capacity
  return static_cast<int>(n);
}

int connect_to(const std::string& address) {
  sock::SockAddr addr;
  REQUIRE(sock::parse_address(address, &addr).ok());
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, addr.get(), addr.len) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

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
  CHECK(wire.find(kSecret) == std::string::npos);
}

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
    sock::Reply reply = handshake_by_hand(fake[static_cast<size_t>(k)], 1, 2, k, nconns, kSecret, &proved_back);
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

TEST_CASE("a single-rank transport needs no network", "[socket]") {
  std::unique_ptr<Transport> t;
  Options o = options_for(0, 1, nullptr);
  REQUIRE(create_socket_transport(o, &t).ok());
  RequestId id;
  CHECK(t->isend(0, tag(1), nullptr, 0, &id).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(t->wait(nullptr, 0).ok());
}

namespace {

std::string published_address(World& w, int rank) {
  std::string address;
  REQUIRE(w.store->get("addr/" + std::to_string(rank), &address, Deadline::after_ms(1000)).ok());
  return address;
}

std::string exchange_big(World& w) {
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

}  // namespace

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

// ---- connections made on first use (mesh.h) ---------------------------------------------------

namespace {

int open_fds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// Every rank sends `bytes` to each listed peer and receives as much from it, all posted at once.
std::vector<std::string> exchange_with(World& w, int n, uint64_t seq, size_t bytes,
                                       const std::function<std::vector<int>(int)>& peers_of) {
  return run_ranks(n, [&](int r) -> std::string {
    Transport& t = *w.ranks[static_cast<size_t>(r)];
    std::vector<int> peers = peers_of(r);
    std::vector<std::vector<uint8_t>> out(peers.size()), in(peers.size());
    std::vector<RequestId> ids;
    for (size_t k = 0; k < peers.size(); ++k) {
      out[k].resize(bytes);
      for (size_t i = 0; i < bytes; ++i) out[k][i] = pattern(r, seq, i);
      in[k].assign(bytes, 0xEE);
      RequestId id;
      Status st = t.isend(peers[k], tag(seq, bytes), out[k].data(), bytes, &id);
      if (!st.ok()) return "isend: " + st.message();
      ids.push_back(id);
      st = t.irecv(peers[k], tag(seq, bytes), in[k].data(), bytes, &id);
      if (!st.ok()) return "irecv: " + st.message();
      ids.push_back(id);
    }
    Status st = t.wait(ids.data(), ids.size());
    if (!st.ok()) return st.message();
    for (size_t k = 0; k < peers.size(); ++k)
      for (size_t i = 0; i < bytes; ++i)
        if (in[k][i] != pattern(peers[k], seq, i))
          return "from rank " + std::to_string(peers[k]) + ": byte " + std::to_string(i) + " is wrong";
    return "";
  });
}

std::vector<std::string> ok_for(int n) { return std::vector<std::string>(static_cast<size_t>(n), ""); }

}  // namespace

TEST_CASE("lazy: every pair dials at once from both sides, one connection per index survives", "[socket][lazy]") {
  const int n = 6, nconns = configured_nconns();
  const int before = open_fds();
  World w = make_world(n);
  CHECK(open_fds() - before == 2 * n);  // a listener and an eventfd each; no connection yet
  auto everyone_else = [&](int r) {
    std::vector<int> peers;
    for (int p = 0; p < n; ++p)
      if (p != r) peers.push_back(p);
    return peers;
  };
  // Large enough to stripe: every connection index carries bytes both ways.
  CHECK(exchange_with(w, n, 1, 300 * 1024, everyone_else) == ok_for(n));
  // Dials that lost are closed once their acceptor looks at them again; each round lets it.
  const int expected = 2 * n + n * (n - 1) * nconns;
  int fds = open_fds() - before;
  for (int round = 2; round < 8 && fds != expected; ++round) {
    CHECK(exchange_with(w, n, static_cast<uint64_t>(round), 8, everyone_else) == ok_for(n));
    fds = open_fds() - before;
  }
  CHECK(fds == expected);
}

TEST_CASE("lazy: a peer first needed in the middle of a job is connected then, and only then", "[socket][lazy]") {
  const int n = 8, nconns = configured_nconns();
  const int before = open_fds();
  World w = make_world(n);
  auto ring = [&](int r) { return std::vector<int>{(r + 1) % n, (r + n - 1) % n}; };
  for (uint64_t round = 1; round <= 3; ++round) CHECK(exchange_with(w, n, round, 1000, ring) == ok_for(n));
  // n neighbour pairs, both ends in this process; small messages use connection 0 only.
  const int ring_fds = 2 * n + n * 2;
  CHECK(open_fds() - before == ring_fds);
  // Now rank 0 and rank 4 (never neighbours) talk; the ring goes on alongside.
  auto far = [&](int r) {
    std::vector<int> peers = ring(r);
    if (r == 0) peers.push_back(4);
    if (r == 4) peers.push_back(0);
    return peers;
  };
  CHECK(exchange_with(w, n, 4, 1 << 20, far) == ok_for(n));
  CHECK(exchange_with(w, n, 5, 8, far) == ok_for(n));
  // The 1 MiB round is striped: every pair that carried it has all its connections now.
  CHECK(open_fds() - before == 2 * n + (n + 1) * 2 * nconns);
}

TEST_CASE("lazy: a rank that died before its first connection fails the caller promptly, named", "[socket][lazy]") {
  World w = make_world(3);
  w.ranks[2].reset();  // gone: its listener with it
  uint32_t out = 7;
  RequestId id;
  auto start = std::chrono::steady_clock::now();
  REQUIRE(w.ranks[0]->isend(2, tag(1, 1), &out, sizeof out, &id).ok());
  Status st = w.ranks[0]->wait(&id, 1);
  CHECK(st.code() == COMM_ERR_REMOTE);
  CHECK_THAT(st.message(), Catch::Contains("rank 2 refused the connection"));
  CHECK_THAT(st.message(), Catch::Contains("did it exit or crash?"));
  CHECK(seconds_since(start) < kPromptS);  // the timeout is 20 s
}

TEST_CASE("eager: COMM_SOCKET_EAGER=1 connects every pair at setup", "[socket][eager]") {
  EnvGuard eager("COMM_SOCKET_EAGER", "1");
  const int n = 4, nconns = configured_nconns();
  const int before = open_fds();
  World w = make_world(n);
  CHECK(open_fds() - before == 2 * n + n * (n - 1) * nconns);
  auto everyone_else = [&](int r) {
    std::vector<int> peers;
    for (int p = 0; p < n; ++p)
      if (p != r) peers.push_back(p);
    return peers;
  };
  CHECK(exchange_with(w, n, 1, 4096, everyone_else) == ok_for(n));
  CHECK(open_fds() - before == 2 * n + n * (n - 1) * nconns);
  EnvGuard bad("COMM_SOCKET_EAGER", "yes");
  std::unique_ptr<Transport> t;
  CHECK(create_socket_transport(options_for(0, 2, memory_store(unique_store_name())), &t).code() ==
        COMM_ERR_INVALID_ARGUMENT);
}

TEST_CASE("a rank that cannot listen fails every rank at setup, named, not at the timeout", "[socket][lazy]") {
  auto store = memory_store(unique_store_name());
  const int n = 3;
  std::vector<Status> status(n);
  std::vector<std::unique_ptr<Transport>> t(n);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Options o = options_for(r, n, store);
      if (r == 1) o.listen = {{{"test0", "192.0.2.256", AF_INET}}, "a test's unusable address", ""};
      status[static_cast<size_t>(r)] = create_socket_transport(o, &t[static_cast<size_t>(r)]);
    });
  for (auto& th : threads) th.join();
  CHECK(seconds_since(start) < kPromptS);  // the timeout is 20 s
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << status[static_cast<size_t>(r)].message());
    CHECK(status[static_cast<size_t>(r)].code() == COMM_ERR_SYSTEM);
    const std::string& text = status[static_cast<size_t>(r)].message();
    CHECK_THAT(text, Catch::Contains("rank 1 could not set up its socket transport"));
    CHECK_THAT(text, Catch::Contains("192.0.2.256"));
  }
  CHECK(!status[1].ok());
}

// COMM_SOCKET_PROGRESS_THREAD_BYTES (transports/socket/progress_thread.cc): between a caller's
// calls, the transport's own thread moves open large requests. 32 MiB is far more than the
// kernel's socket buffers hold, so without the thread the receiver's test() could only ever
// drain what the sender's post pushed into them: the sender never calls the transport again.
TEST_CASE("progress thread: a large message completes while its sender never calls the transport again",
          "[socket][progress_thread]") {
  EnvGuard on("COMM_SOCKET_PROGRESS_THREAD_BYTES", "65536");
  World w = make_world(2);
  REQUIRE(exchange_big(w) == "");  // lazy connections: made while both ranks wait
  const size_t bytes = size_t{32} << 20;
  std::vector<uint8_t> out(bytes), in(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern(0, 1, i);
  RequestId send_id, recv_id;
  REQUIRE(w.ranks[1]->irecv(0, tag(2, bytes), in.data(), bytes, &recv_id).ok());
  REQUIRE(w.ranks[0]->isend(1, tag(2, bytes), out.data(), bytes, &send_id).ok());
  bool done = false;
  const auto start = std::chrono::steady_clock::now();
  while (!done && seconds_since(start) < 20.0 + loaded_host::kSlackS) {  // a hang fails; a busy host does not
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(w.ranks[1]->test(recv_id, &done).ok());
  }
  CHECK(done);
  CHECK(w.ranks[0]->wait(&send_id, 1).ok());
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += in[i] != pattern(0, 1, i);
  CHECK(wrong == 0);
  EnvGuard bad("COMM_SOCKET_PROGRESS_THREAD_BYTES", "-1");  // a bad value fails creation, named
  std::unique_ptr<Transport> t;
  Status st = create_socket_transport(options_for(0, 2, memory_store(unique_store_name())), &t);
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK_THAT(st.message(), Catch::Contains("COMM_SOCKET_PROGRESS_THREAD_BYTES"));
}

TEST_CASE("progress thread: a peer's failure it reads ends the caller's next wait at once, naming the peer",
          "[socket][progress_thread]") {
  EnvGuard on("COMM_SOCKET_PROGRESS_THREAD_BYTES", "65536");
  World w = make_world(2);
  REQUIRE(exchange_big(w) == "");
  const size_t bytes = size_t{4} << 20;
  std::vector<uint8_t> in(bytes, 0);
  RequestId recv_id;
  REQUIRE(w.ranks[0]->irecv(1, tag(2, bytes), in.data(), bytes, &recv_id).ok());  // the thread watches
  w.ranks[1]->notify_peers(Internal("rank 1 broke on purpose"), 0);
  // A small send completes as it is posted, so its wait needs no progress: only what the thread
  // read can fail it (with the thread off, every such wait returns OK). Sent until one fails:
  // when the thread gets a core to read the ERROR frame is the scheduler's to decide, so the
  // test waits for it (bounded) instead of sleeping and hoping.
  uint32_t small = 7;
  Status st;
  double wait_s = 0;
  const auto first = std::chrono::steady_clock::now();
  for (uint64_t seq = 3; st.ok() && seconds_since(first) < kTestTimeoutMs / 1000.0 + loaded_host::kSlackS; ++seq) {
    RequestId send_id;
    REQUIRE(w.ranks[0]->isend(1, tag(seq, sizeof small), &small, sizeof small, &send_id).ok());
    const auto start = std::chrono::steady_clock::now();
    st = w.ranks[0]->wait(&send_id, 1);
    wait_s = seconds_since(start);
    if (st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(st.code() == COMM_ERR_REMOTE);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 reported") && Catch::Contains("broke on purpose"));
  CHECK(wait_s < kPromptS);  // the timeout is 20 s
  CHECK(w.ranks[0]->wait(&recv_id, 1).code() == COMM_ERR_REMOTE);  // the transport stays failed
  w.ranks[0].reset();  // the thread stops with its transport
}
