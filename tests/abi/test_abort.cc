// comm_abort: local, non-blocking, idempotent, from any thread; every pending and future call
// ends with an error on every rank, never a hang; destroy afterwards is immediate.
// Deadline tests: run one at a time, short explicit timeouts.
#include <atomic>
#include <latch>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"
#include "probe.h"

namespace {

using namespace abi;

bool remote_or_timeout(comm_status_t s) { return s == COMM_ERR_REMOTE || s == COMM_ERR_TIMEOUT; }

// Every kind of call on an aborted communicator, each expected to return COMM_ERR_ABORTED at once.
Probes calls_after_abort(comm_t c) {
  Probes p;
  std::vector<float> a(64, 1.0f), b(128, 0.0f);
  const Words none;
  auto aborted = [&](const char* what, auto call) { p.run(what, COMM_ERR_ABORTED, none, c, call); };
  aborted("allreduce", [&] { return comm_allreduce(c, a.data(), b.data(), 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  aborted("broadcast", [&] { return comm_broadcast(c, a.data(), b.data(), 4, COMM_FLOAT32, 0, nullptr); });
  aborted("reduce", [&] { return comm_reduce(c, a.data(), b.data(), 4, COMM_FLOAT32, COMM_SUM, 0, nullptr); });
  aborted("allgather", [&] { return comm_allgather(c, a.data(), b.data(), 4, COMM_FLOAT32, nullptr); });
  aborted("reduce_scatter", [&] { return comm_reduce_scatter(c, a.data(), b.data(), 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  aborted("alltoall", [&] { return comm_alltoall(c, a.data(), b.data(), 4, COMM_FLOAT32, nullptr); });
  aborted("barrier", [&] { return comm_barrier(c, nullptr); });
  aborted("send", [&] { return comm_send(c, a.data(), 4, COMM_FLOAT32, 1, nullptr); });
  aborted("recv", [&] { return comm_recv(c, b.data(), 4, COMM_FLOAT32, 1, nullptr); });
  aborted("allreduce of 0 elements", [&] { return comm_allreduce(c, nullptr, nullptr, 0, COMM_FLOAT32, COMM_SUM, nullptr); });
  aborted("iallreduce, then wait", [&] {
    comm_request_t req = nullptr;
    const comm_status_t st = comm_iallreduce(c, a.data(), b.data(), 4, COMM_FLOAT32, COMM_SUM, &req);
    return st == COMM_OK ? comm_wait(req) : st;
  });
  aborted("ibarrier, then test", [&] {
    comm_request_t req = nullptr;
    comm_status_t st = comm_ibarrier(c, &req);
    int done = 0;
    for (int i = 0; st == COMM_OK && !done && i < 100000; ++i) st = comm_test(req, &done);
    return st;
  });
  aborted("dup", [&] {
    comm_t out = nullptr;
    return comm_dup(c, &out);
  });
  aborted("split", [&] {
    comm_t out = nullptr;
    return comm_split(c, 0, 0, &out);
  });
  return p;
}

}  // namespace

TEST_CASE("abort: comm_abort from another thread ends a pending allreduce whose peer never joins, promptly",
          "[abort][deadline]") {
  Ranks ranks = init_ranks(2, "abort-pending", 60000);
  REQUIRE(ranks.all_ok());
  comm_t c0 = ranks.comms[0], c1 = ranks.comms[1];
  std::vector<float> x(1000, 1.0f), y(1000);
  std::atomic<double> abort_at{0};
  comm_status_t abort1 = COMM_ERR_INTERNAL;
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    abort_at = now_ms();
    abort1 = comm_abort(c0);
  });
  // Rank 0's thread: rank 1 never calls the allreduce.
  const Outcome pending = timed(c0, [&] { return comm_allreduce(c0, x.data(), y.data(), x.size(), COMM_FLOAT32, COMM_SUM, nullptr); });
  const double returned_at = now_ms();
  aborter.join();
  const Probes after = calls_after_abort(c0);
  const Outcome again = timed(c0, [&] { return comm_abort(c0); });
  const Outcome destroy = timed(nullptr, [&] { return comm_destroy(c0); });
  comm_abort(c1);
  const Outcome destroy1 = timed(nullptr, [&] { return comm_destroy(c1); });

  INFO("pending allreduce -> " << describe(pending) << "; returned " << (returned_at - abort_at) << " ms after the abort");
  // Promptly: the configured timeout is 60 s; the margin is what a busy host may add.
  CHECK(status_name(pending.status) == "COMM_ERR_ABORTED");
  CHECK(returned_at - abort_at < loaded_host::kSlackMs);
  CHECK(abort1 == COMM_OK);
  for (const Probe& p : after.list) {
    check_probe(p, "after abort");
    CHECK(p.got.ms < loaded_host::kSlackMs);
  }
  INFO("second comm_abort -> " << describe(again));
  CHECK(again.status == abort1);  // idempotent
  INFO("comm_destroy after abort -> " << describe(destroy));
  CHECK(destroy.status == COMM_OK);
  CHECK(destroy.ms < loaded_host::kSlackMs);  // immediate: the configured timeout is 60 s
  INFO("rank 1: abort then destroy -> " << describe(destroy1));
  CHECK(destroy1.ms < loaded_host::kSlackMs);
}

TEST_CASE("abort: a pending non-blocking request ends with COMM_ERR_ABORTED", "[abort][deadline]") {
  Ranks ranks = init_ranks(2, "abort-request", 60000);
  REQUIRE(ranks.all_ok());
  comm_t c0 = ranks.comms[0];
  std::vector<double> x(1 << 16, 2.0), y(1 << 16);
  comm_request_t req = nullptr;
  const comm_status_t issued = comm_iallreduce(c0, x.data(), y.data(), x.size(), COMM_FLOAT64, COMM_SUM, &req);
  REQUIRE(issued == COMM_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread aborter([&] { comm_abort(c0); });
  const Outcome waited = timed(c0, [&] { return comm_wait(req); });
  aborter.join();
  for (auto c : ranks.comms) comm_abort(c);
  destroy_ranks(ranks.comms);
  INFO("comm_wait -> " << describe(waited));
  CHECK(status_name(waited.status) == "COMM_ERR_ABORTED");
  CHECK(waited.ms < loaded_host::kSlackMs);  // the configured timeout is 60 s
}

TEST_CASE("abort: a peer's abort ends this rank's pending call with an error within the timeout, never a hang",
          "[abort][deadline]") {
  constexpr int kTimeout = 3000;
  Ranks ranks = init_ranks(2, "abort-peer", kTimeout);
  REQUIRE(ranks.all_ok());
  struct Seen {
    Outcome call, destroy;
  };
  auto seen = on_ranks(2, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      s.call = timed(c, [&] { return comm_abort(c); });
    } else {
      std::vector<float> x(1000, 1.0f), y(1000);
      s.call = timed(c, [&] { return comm_allreduce(c, x.data(), y.data(), x.size(), COMM_FLOAT32, COMM_SUM, nullptr); });
    }
    s.destroy = timed(nullptr, [&] { return comm_destroy(c); });
    return s;
  });
  INFO("rank 0 aborts: " << describe(seen[0].call) << "; destroy " << describe(seen[0].destroy));
  INFO("rank 1's pending allreduce: " << describe(seen[1].call) << "; destroy " << describe(seen[1].destroy));
  CHECK(seen[0].call.status == COMM_OK);
  CHECK(remote_or_timeout(seen[1].call.status));
  // Bounded by the timeout (+ a busy host's margin), never a hang.
  CHECK(seen[1].call.ms < kTimeout + loaded_host::kSlackMs);
  CHECK(seen[0].destroy.ms < kTimeout + loaded_host::kSlackMs);
  CHECK(seen[1].destroy.ms < kTimeout + loaded_host::kSlackMs);
}

TEST_CASE("abort: in the middle of a 64 MiB allreduce both ranks joined: aborted here, an error there",
          "[abort][deadline]") {
  constexpr int kTimeout = 3000;
  Ranks ranks = init_ranks(2, "abort-midway", kTimeout);
  REQUIRE(ranks.all_ok());
  const size_t count = (size_t{64} << 20) / sizeof(float);
  std::latch started(2);
  std::atomic<double> abort_at{0};
  struct Seen {
    Outcome call;
    double returned_at = 0;
    int iterations = 0;
  };
  std::thread aborter([&] {
    started.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    abort_at = now_ms();
    comm_abort(ranks.comms[0]);
  });
  auto seen = on_ranks(2, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    std::vector<float> x(count, 1.0f), y(count, 0.0f);  // touched before the first call
    started.arrive_and_wait();
    // Allreduces until one fails (the abort lands inside one of them).
    for (s.iterations = 0; s.iterations < 200; ++s.iterations) {
      s.call = timed(c, [&] { return comm_allreduce(c, x.data(), y.data(), count, COMM_FLOAT32, COMM_SUM, nullptr); });
      if (s.call.status != COMM_OK) break;
    }
    s.returned_at = now_ms();
    return s;
  });
  aborter.join();
  for (auto c : ranks.comms) comm_abort(c);
  destroy_ranks(ranks.comms);
  INFO("rank 0 (aborted): " << describe(seen[0].call) << " in iteration " << seen[0].iterations << ", "
                            << (seen[0].returned_at - abort_at) << " ms after the abort");
  INFO("rank 1 (peer): " << describe(seen[1].call) << " in iteration " << seen[1].iterations << ", "
                         << (seen[1].returned_at - abort_at) << " ms after the abort");
  // ABORTED says the abort ended rank 0's call; the bounds tell "by the timeout at the latest"
  // (+ a busy host's margin) from a hang.
  CHECK(status_name(seen[0].call.status) == "COMM_ERR_ABORTED");
  CHECK(seen[0].returned_at - abort_at < kTimeout + loaded_host::kSlackMs);
  CHECK(remote_or_timeout(seen[1].call.status));
  CHECK(seen[1].returned_at - abort_at < kTimeout + loaded_host::kSlackMs);
}

TEST_CASE("async error: a non-blocking allreduce nobody waits on, whose peer never joins, is reported by "
          "comm_get_async_error within the timeout",
          "[abort][deadline]") {
  constexpr int kTimeout = 1000;
  Ranks ranks = init_ranks(2, "async-error", kTimeout);
  REQUIRE(ranks.all_ok());
  comm_t c0 = ranks.comms[0];
  const comm_status_t before = comm_get_async_error(c0);
  std::vector<float> x(1000, 1.0f), y(1000);
  comm_request_t req = nullptr;
  REQUIRE(comm_iallreduce(c0, x.data(), y.data(), x.size(), COMM_FLOAT32, COMM_SUM, &req) == COMM_OK);
  // A watchdog thread polls, as trainers do, while nothing waits on the request.
  comm_status_t async = COMM_OK;
  const double t0 = now_ms();
  std::thread watchdog([&] {
    while (now_ms() - t0 < kTimeout + loaded_host::kSlackMs) {  // ends when seen; a busy host may be late
      async = comm_get_async_error(c0);
      if (async != COMM_OK) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  watchdog.join();
  const double seen_after = now_ms() - t0;
  const Outcome waited = timed(c0, [&] { return comm_wait(req); });
  for (auto c : ranks.comms) comm_abort(c);
  destroy_ranks(ranks.comms);
  CHECK(before == COMM_OK);
  INFO("comm_get_async_error -> " << status_name(async) << " after " << seen_after << " ms");
  CHECK(status_name(async) == "COMM_ERR_TIMEOUT");
  INFO("comm_wait afterwards -> " << describe(waited));
  CHECK(status_name(waited.status) == "COMM_ERR_TIMEOUT");
}
