// The socket transport's connections made on first use (mesh.h), COMM_SOCKET_EAGER, and its
// progress thread (COMM_SOCKET_PROGRESS_THREAD_BYTES), with ranks as threads over an in-memory
// store. Catch2 is not thread-safe: rank threads return what they saw and the main thread checks it.
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
