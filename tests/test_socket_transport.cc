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
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "params.h"
#include "store/store.h"
#include "interfaces.h"
#include "socket/net.h"
#include "socket/socket_transport.h"
#include "socket/wire.h"
#include "transport.h"
#include "env_guard.h"
#include "support/transport_test.h"

using namespace comm;
using namespace comm::testing;
using namespace comm::transport;
namespace topology = comm::topology;

namespace {

constexpr int kTestTimeoutMs = 20000;
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
  topology::Interface itf;
  std::string why;
  if (topology::choose_socket_interface(o.all_local, &itf, &why).ok()) o.listen = {itf.address, itf.family, why};
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

int configured_nconns() {
  int64_t n = 0;
  REQUIRE(params::get_int("COMM_SOCKET_NCONNS", 1, sock::kMaxConns, &n).ok());
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

std::string hello_bytes(int rank, int size, int index, int nconns, const std::string& secret) {
  sock::Hello h{sock::kHelloMagic, sock::kProtocolVersion, rank, size, static_cast<uint32_t>(index),
                static_cast<uint32_t>(nconns), static_cast<uint32_t>(secret.size())};
  return std::string(reinterpret_cast<const char*>(&h), sizeof h) + secret;
}

}  // namespace

TEST_CASE("strangers at the listener are dropped and setup still completes", "[socket]") {
  auto store = memory_store(unique_store_name());
  Status status0;
  std::unique_ptr<Transport> t0;
  std::thread rank0([&] { status0 = create_socket_transport(options_for(0, 2, store), &t0); });

  // Rank 0 publishes its address before it waits for peers.
  std::string address;
  REQUIRE(store->get("addr/0", &address, Deadline::after_ms(10000)).ok());

  // 1. Random bytes: closed without a reply.
  int garbage = connect_to(address);
  std::mt19937 rng(42);
  std::vector<uint8_t> noise(256);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  REQUIRE(send_all(garbage, noise.data(), noise.size()));
  char byte;
  ssize_t n = recv_some(garbage, &byte, 1);
  CHECK(n <= 0);  // EOF or reset: dropped, during setup
  ::close(garbage);

  // 2. A well-formed handshake with the wrong secret: refused with a reply, then closed.
  int stranger = connect_to(address);
  std::string hello = hello_bytes(1, 2, 0, configured_nconns(), "not-the-secret");
  REQUIRE(send_all(stranger, hello.data(), hello.size()));
  sock::Reply reply{};
  CHECK(recv_some(stranger, &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
  CHECK(reply.magic == sock::kReplyMagic);
  CHECK(reply.code == static_cast<uint32_t>(sock::ReplyCode::kBadSecret));
  CHECK(recv_some(stranger, &byte, 1) <= 0);
  ::close(stranger);

  // 3. A transport of another job: it fails fast, naming the secret; rank 0 keeps waiting.
  std::unique_ptr<Transport> wrong;
  auto start = std::chrono::steady_clock::now();
  Status wrong_status = create_socket_transport(options_for(1, 2, store, kTestTimeoutMs, "other-job"), &wrong);
  CHECK(wrong_status.code() == COMM_ERR_SYSTEM);
  CHECK_THAT(wrong_status.message(), Catch::Contains("secret"));
  CHECK(seconds_since(start) < 5.0);

  // 4. The real rank 1 joins; both finish and the mesh works.
  std::unique_ptr<Transport> t1;
  Status status1 = create_socket_transport(options_for(1, 2, store), &t1);
  rank0.join();
  INFO(status0.message() << " / " << status1.message());
  REQUIRE(status0.ok());
  REQUIRE(status1.ok());
  uint32_t out = 0xC0FFEE, in = 0;
  RequestId ids[2];
  REQUIRE(t1->isend(0, tag(1, 1), &out, sizeof out, &ids[0]).ok());
  REQUIRE(t0->irecv(1, tag(1, 1), &in, sizeof in, &ids[1]).ok());
  REQUIRE(t0->wait(&ids[1], 1).ok());
  REQUIRE(t1->wait(&ids[0], 1).ok());
  CHECK(in == out);
}

TEST_CASE("setup times out naming the ranks that never connected", "[socket]") {
  auto store = memory_store(unique_store_name());
  std::unique_ptr<Transport> t0;
  auto start = std::chrono::steady_clock::now();
  Status st = create_socket_transport(options_for(0, 3, store, 300), &t0);
  CHECK(st.code() == COMM_ERR_TIMEOUT);
  CHECK_THAT(st.message(), Catch::Contains("rank(s) 1, 2 never connected"));
  CHECK(seconds_since(start) < 1.5);
}

TEST_CASE("garbage from an authenticated peer closes its connection, never crashes", "[socket]") {
  auto store = memory_store(unique_store_name());
  const int nconns = configured_nconns();
  Status status0;
  std::unique_ptr<Transport> t0;
  std::thread rank0([&] { status0 = create_socket_transport(options_for(0, 2, store), &t0); });
  std::string address;
  REQUIRE(store->get("addr/0", &address, Deadline::after_ms(10000)).ok());
  std::vector<int> fake(static_cast<size_t>(nconns));
  for (int k = 0; k < nconns; ++k) {
    fake[static_cast<size_t>(k)] = connect_to(address);
    std::string hello = hello_bytes(1, 2, k, nconns, kSecret);
    REQUIRE(send_all(fake[static_cast<size_t>(k)], hello.data(), hello.size()));
    sock::Reply reply{};
    REQUIRE(recv_some(fake[static_cast<size_t>(k)], &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
    REQUIRE(reply.code == static_cast<uint32_t>(sock::ReplyCode::kOk));
  }
  rank0.join();
  REQUIRE(status0.ok());

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
  std::vector<uint8_t> buf(16);
  RequestId id;
  REQUIRE(t0->irecv(1, tag(1, 4), buf.data(), buf.size(), &id).ok());
  Status st = t0->wait(&id, 1);
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
    CHECK_THAT(published_address(w, 0), Catch::StartsWith("127.0.0.1:"));
    CHECK(exchange_big(w) == "");
  }
  {
    // COMM_SOCKET_IFNAME wins over NCCL_SOCKET_IFNAME (checked without sending anything
    // over a real NIC: only loopback carries test traffic).
    EnvGuard nccl("NCCL_SOCKET_IFNAME", "=nosuch0");
    EnvGuard comm("COMM_SOCKET_IFNAME", "=lo");
    World w = make_world(2);
    CHECK_THAT(published_address(w, 1), Catch::StartsWith("127.0.0.1:"));
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
