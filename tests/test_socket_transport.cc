// The socket transport with ranks as threads over an in-memory store, on this machine's
// own addresses. Catch2 is not thread-safe: rank threads return what they saw and the
// main thread checks it.
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

using namespace comm;
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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

// Runs body(rank) on one thread per rank; returns each rank's complaint ("" = fine).
std::vector<std::string> run_ranks(int n, const std::function<std::string(int)>& body) {
  std::vector<std::string> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[static_cast<size_t>(r)] = body(r); });
  for (auto& t : threads) t.join();
  return out;
}

OpTag tag(uint64_t seq, uint64_t count = 0, CollKind coll = CollKind::kAllreduce) {
  OpTag t;
  t.seq = seq;
  t.coll = coll;
  t.dtype = COMM_FLOAT32;
  t.op = COMM_SUM;
  t.count = count;
  return t;
}

uint8_t pattern(int sender, size_t message, size_t i) {
  return static_cast<uint8_t>(sender * 131 + message * 31 + i * 7 + (i >> 9) + (i >> 17));
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

TEST_CASE("ring exchange delivers every size intact on 2 to 5 ranks", "[socket]") {
  const std::vector<size_t> sizes = {0, 1, 4097, size_t{1} << 20, (size_t{8} << 20) + 3};
  for (int n = 2; n <= 5; ++n) {
    SECTION("ranks " + std::to_string(n)) {
      World w = make_world(n);
      auto problems = run_ranks(n, [&](int r) -> std::string {
        Transport& t = *w.ranks[static_cast<size_t>(r)];
        int next = (r + 1) % n;
        int prev = (r + n - 1) % n;
        std::vector<std::vector<uint8_t>> out(sizes.size()), in(sizes.size());
        for (size_t m = 0; m < sizes.size(); ++m) {
          out[m].resize(sizes[m]);
          for (size_t i = 0; i < sizes[m]; ++i) out[m][i] = pattern(r, m, i);
          in[m].assign(sizes[m], 0xEE);
        }
        // All at once: small and striped messages interleave on the same connections, and
        // some headers arrive before their receive is posted.
        std::vector<RequestId> ids(2 * sizes.size());
        for (size_t m = 0; m < sizes.size(); ++m) {
          Status st = t.isend(next, tag(m, sizes[m]), out[m].data(), sizes[m], &ids[m]);
          if (!st.ok()) return "isend: " + st.message();
        }
        for (size_t m = 0; m < sizes.size(); ++m) {
          Status st = t.irecv(prev, tag(m, sizes[m]), in[m].data(), sizes[m], &ids[sizes.size() + m]);
          if (!st.ok()) return "irecv: " + st.message();
        }
        Status st = t.wait(ids.data(), ids.size());
        if (!st.ok()) return "wait: " + st.message();
        for (size_t m = 0; m < sizes.size(); ++m)
          for (size_t i = 0; i < sizes[m]; ++i)
            if (in[m][i] != pattern(prev, m, i))
              return "message " + std::to_string(m) + " byte " + std::to_string(i) + " is wrong";
        // And one at a time through sendrecv, the way algorithms call it.
        for (size_t m = 0; m < sizes.size(); ++m) {
          std::fill(in[m].begin(), in[m].end(), 0xEE);
          st = sendrecv(t, next, tag(100 + m, sizes[m]), out[m].data(), sizes[m], prev, in[m].data(), sizes[m]);
          if (!st.ok()) return "sendrecv: " + st.message();
          for (size_t i = 0; i < sizes[m]; ++i)
            if (in[m][i] != pattern(prev, m, i))
              return "sendrecv message " + std::to_string(m) + " byte " + std::to_string(i) + " is wrong";
        }
        return "";
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << " of " << n);
        CHECK(problems[static_cast<size_t>(r)] == "");
      }
    }
  }
}

TEST_CASE("messages sent before their receive is posted wait in the kernel and arrive intact", "[socket]") {
  World w = make_world(2);
  const std::vector<size_t> sizes = {10, (size_t{3} << 20) + 5, 0, 7};
  auto problems = run_ranks(2, [&](int r) -> std::string {
    Transport& t = *w.ranks[static_cast<size_t>(r)];
    std::vector<std::vector<uint8_t>> bufs(sizes.size());
    std::vector<RequestId> ids(sizes.size());
    if (r == 1) {
      for (size_t m = 0; m < sizes.size(); ++m) {
        bufs[m].resize(sizes[m]);
        for (size_t i = 0; i < sizes[m]; ++i) bufs[m][i] = pattern(1, m, i);
        Status st = t.isend(0, tag(m, sizes[m]), bufs[m].data(), sizes[m], &ids[m]);
        if (!st.ok()) return st.message();
      }
      Status st = t.wait(ids.data(), ids.size());
      return st.ok() ? "" : st.message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (size_t m = 0; m < sizes.size(); ++m) {
      bufs[m].assign(sizes[m], 0);
      Status st = t.irecv(1, tag(m, sizes[m]), bufs[m].data(), sizes[m], &ids[m]);
      if (!st.ok()) return st.message();
    }
    // Completed out of order, one test() at a time.
    for (size_t k = sizes.size(); k-- > 0;) {
      bool done = false;
      auto start = std::chrono::steady_clock::now();
      while (!done) {
        Status st = t.test(ids[k], &done);
        if (!st.ok()) return st.message();
        if (seconds_since(start) > 10) return "test() never completed";
      }
    }
    for (size_t m = 0; m < sizes.size(); ++m)
      for (size_t i = 0; i < sizes[m]; ++i)
        if (bufs[m][i] != pattern(1, m, i)) return "message " + std::to_string(m) + " is wrong";
    return "";
  });
  CHECK(problems[0] == "");
  CHECK(problems[1] == "");
}

TEST_CASE("ranks that disagree on the call fail with INVALID_USAGE naming both sides", "[socket]") {
  World w = make_world(2);
  std::vector<float> out(101, 1.0f), in(100, 0.0f);
  RequestId id;
  REQUIRE(w.ranks[1]->isend(0, tag(3, 101), out.data(), 101 * sizeof(float), &id).ok());
  REQUIRE(w.ranks[1]->wait(&id, 1).ok());  // small: handed to the kernel at once
  REQUIRE(w.ranks[0]->irecv(1, tag(3, 100), in.data(), 100 * sizeof(float), &id).ok());
  Status st = w.ranks[0]->wait(&id, 1);
  CHECK(st.code() == COMM_ERR_INVALID_USAGE);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 called allreduce #3 (count 101, float32, sum)"));
  CHECK_THAT(st.message(), Catch::Contains("rank 0 (this rank) called allreduce #3 (count 100, float32, sum)"));
  // Sticky: the transport stays failed with the same status.
  Status later = w.ranks[0]->isend(1, tag(4), nullptr, 0, &id);
  CHECK(later.code() == COMM_ERR_INVALID_USAGE);
  CHECK(later.message() == st.message());
}

TEST_CASE("same tag but a different length fails with INVALID_USAGE, not corrupt data", "[socket]") {
  World w = make_world(2);
  std::vector<uint8_t> out(404, 1), in(400, 0);
  RequestId id;
  REQUIRE(w.ranks[1]->isend(0, tag(7, 100), out.data(), out.size(), &id).ok());
  REQUIRE(w.ranks[1]->wait(&id, 1).ok());
  REQUIRE(w.ranks[0]->irecv(1, tag(7, 100), in.data(), in.size(), &id).ok());
  Status st = w.ranks[0]->wait(&id, 1);
  CHECK(st.code() == COMM_ERR_INVALID_USAGE);
  CHECK_THAT(st.message(), Catch::Contains("404 bytes"));
  CHECK_THAT(st.message(), Catch::Contains("400 bytes"));
  CHECK(std::all_of(in.begin(), in.end(), [](uint8_t b) { return b == 0; }));
}

TEST_CASE("notify_peers reaches a rank that waits on someone else", "[socket]") {
  World w = make_world(3);
  Status waited;
  double elapsed = 0;
  std::thread rank2([&] {
    std::vector<uint8_t> buf(100);
    RequestId id;
    auto start = std::chrono::steady_clock::now();
    waited = w.ranks[2]->irecv(1, tag(5, 100), buf.data(), buf.size(), &id);
    if (waited.ok()) waited = w.ranks[2]->wait(&id, 1);
    elapsed = seconds_since(start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  Status failure = InvalidUsage("rank 0 called broadcast #5 with root 2, the others root 1");
  w.ranks[0]->notify_peers(failure);
  rank2.join();
  CHECK(waited.code() == COMM_ERR_INVALID_USAGE);
  CHECK(waited.message() == "rank 0 reported: " + failure.message());
  CHECK(elapsed < 5.0);
  // The notifying rank is failed too, with its own reason.
  RequestId id;
  Status after = w.ranks[0]->isend(1, tag(6), nullptr, 0, &id);
  CHECK(after.code() == COMM_ERR_INVALID_USAGE);
  CHECK(after.message() == failure.message());
  // Rank 1 sees the report at its next wait, also on a peer that did not fail.
  std::vector<uint8_t> buf(8);
  REQUIRE(w.ranks[1]->irecv(2, tag(5, 8), buf.data(), buf.size(), &id).ok());
  Status r1 = w.ranks[1]->wait(&id, 1);
  CHECK(r1.code() == COMM_ERR_INVALID_USAGE);
  CHECK_THAT(r1.message(), Catch::StartsWith("rank 0 reported: "));
}

TEST_CASE("a non-usage failure is reported to peers as REMOTE", "[socket]") {
  World w = make_world(2);
  w.ranks[1]->notify_peers(Timeout("rank 1 waited on rank 7 for too long"));
  std::vector<uint8_t> buf(8);
  RequestId id;
  REQUIRE(w.ranks[0]->irecv(1, tag(1, 8), buf.data(), buf.size(), &id).ok());
  Status st = w.ranks[0]->wait(&id, 1);
  CHECK(st.code() == COMM_ERR_REMOTE);
  CHECK(st.message() == "rank 1 reported: rank 1 waited on rank 7 for too long");
}

TEST_CASE("a peer whose transport is destroyed mid-wait ends the wait with REMOTE", "[socket]") {
  World w = make_world(2);
  Status waited;
  double elapsed = 0;
  std::thread rank0([&] {
    std::vector<uint8_t> buf(size_t{1} << 20);
    RequestId id;
    auto start = std::chrono::steady_clock::now();
    waited = w.ranks[0]->irecv(1, tag(5, buf.size()), buf.data(), buf.size(), &id);
    if (waited.ok()) waited = w.ranks[0]->wait(&id, 1);
    elapsed = seconds_since(start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  w.ranks[1].reset();
  rank0.join();
  CHECK(waited.code() == COMM_ERR_REMOTE);
  CHECK_THAT(waited.message(), Catch::Contains("rank 1 closed its connection during allreduce #5"));
  CHECK_THAT(waited.message(), Catch::Contains("did it exit or crash?"));
  CHECK(elapsed < 5.0);
}

TEST_CASE("a wait with no progress times out after timeout_ms naming the peer", "[socket]") {
  World w = make_world(2, 300);
  std::vector<uint8_t> buf(400);
  RequestId id;
  REQUIRE(w.ranks[0]->irecv(1, tag(3, 100), buf.data(), buf.size(), &id).ok());
  auto start = std::chrono::steady_clock::now();
  Status st = w.ranks[0]->wait(&id, 1);
  double elapsed = seconds_since(start);
  CHECK(st.code() == COMM_ERR_TIMEOUT);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 (receive of allreduce #3 (count 100, float32, sum): 0 of 400"));
  CHECK(elapsed >= 0.29);
  CHECK(elapsed < 1.5);
  CHECK(w.ranks[0]->isend(1, tag(4), nullptr, 0, &id).code() == COMM_ERR_TIMEOUT);
  CHECK(w.ranks[0]->wait(&id, 0).code() == COMM_ERR_TIMEOUT);
}

TEST_CASE("abort from another thread ends a wait with ABORTED", "[socket]") {
  World w = make_world(2);
  Status waited;
  double elapsed = 0;
  std::thread rank0([&] {
    std::vector<uint8_t> buf(64);
    RequestId id;
    auto start = std::chrono::steady_clock::now();
    waited = w.ranks[0]->irecv(1, tag(9, 16), buf.data(), buf.size(), &id);
    if (waited.ok()) waited = w.ranks[0]->wait(&id, 1);
    elapsed = seconds_since(start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  w.ranks[0]->abort();
  rank0.join();
  CHECK(waited.code() == COMM_ERR_ABORTED);
  CHECK(elapsed < 5.0);
  RequestId id;
  CHECK(w.ranks[0]->isend(1, tag(10), nullptr, 0, &id).code() == COMM_ERR_ABORTED);
  bool done = false;
  CHECK(w.ranks[0]->test(id, &done).code() == COMM_ERR_ABORTED);
}

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

TEST_CASE("bad arguments are INVALID_ARGUMENT and leave the transport usable", "[socket]") {
  World w = make_world(2);
  RequestId id;
  CHECK(w.ranks[0]->isend(0, tag(1), nullptr, 0, &id).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(w.ranks[0]->isend(2, tag(1), nullptr, 0, &id).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(w.ranks[0]->irecv(1, tag(1), nullptr, 8, &id).code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(w.ranks[0]->wait(&id, 1).code() == COMM_ERR_INVALID_ARGUMENT);  // never issued
  // Still usable: an exchange goes through.
  uint8_t out = 7, in = 0;
  RequestId ids[2];
  REQUIRE(w.ranks[1]->isend(0, tag(1, 1), &out, 1, &ids[0]).ok());
  REQUIRE(w.ranks[0]->irecv(1, tag(1, 1), &in, 1, &ids[1]).ok());
  CHECK(w.ranks[0]->wait(&ids[1], 1).ok());
  CHECK(w.ranks[1]->wait(&ids[0], 1).ok());
  CHECK(in == 7);
}

TEST_CASE("request pool exhaustion is INTERNAL with a clear message", "[socket]") {
  World w = make_world(2);
  std::vector<RequestId> ids;
  Status st;
  uint8_t sink[1];
  for (int i = 0; i < 5000 && st.ok(); ++i) {
    RequestId id;
    st = w.ranks[0]->irecv(1, tag(static_cast<uint64_t>(i)), sink, 0, &id);
    if (st.ok()) ids.push_back(id);
  }
  CHECK(ids.size() == 4096);
  CHECK(st.code() == COMM_ERR_INTERNAL);
  CHECK_THAT(st.message(), Catch::Contains("request slots"));
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
