// comm_barrier_monitored (gloo's monitoredBarrier): when every rank arrives it passes, again and
// again; when some do not, rank 0 names exactly the missing ones (the first, or all of them with
// wait_all) once its own deadline has passed, the ranks that came are told by theirs, and nobody
// waits for the communicator's (much longer) timeout. Deadline tests: short explicit timeouts.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

namespace {

using namespace abi;

constexpr int kCommTimeoutMs = 30000;  // the communicator's: the barrier's own deadline is shorter
constexpr int kBarrierMs = 500;

struct Result {
  Outcome outcome;
  std::vector<int> missing;
};

// Ranks in `absent` do not call; the others call comm_barrier_monitored(timeout_ms, wait_all).
std::vector<Result> run_barrier(std::vector<comm_t>& comms, const std::vector<int>& absent, int timeout_ms,
                                int wait_all) {
  const int n = static_cast<int>(comms.size());
  return on_ranks(n, [&](int r) {
    Result res;
    for (int a : absent)
      if (a == r) return res;
    std::vector<int> missing(static_cast<size_t>(n), -1);
    int n_missing = -1;
    comm_t c = comms[static_cast<size_t>(r)];
    res.outcome = timed(c, [&] { return comm_barrier_monitored(c, timeout_ms, wait_all, missing.data(), n, &n_missing); });
    res.missing.assign(missing.begin(), missing.begin() + std::max(n_missing, 0));
    return res;
  });
}

}  // namespace

TEST_CASE("a monitored barrier passes when every rank arrives, also twice in a row", "[lifecycle][monitored]") {
  Ranks ranks = init_ranks(3, "monitored-ok", kCommTimeoutMs);
  REQUIRE(ranks.all_ok());
  for (int round = 0; round < 2; ++round) {
    auto results = run_barrier(ranks.comms, {}, 5000, round);
    for (size_t r = 0; r < results.size(); ++r) {
      INFO("rank " << r << ": " << describe(results[r].outcome));
      CHECK(results[r].outcome.status == COMM_OK);
      CHECK(results[r].missing.empty());
    }
  }
  destroy_ranks(ranks.comms);
}

TEST_CASE("rank 0 names the first missing rank after its own deadline, the others are released by theirs",
          "[deadline][monitored]") {
  Ranks ranks = init_ranks(4, "monitored-missing", kCommTimeoutMs);
  REQUIRE(ranks.all_ok());
  auto results = run_barrier(ranks.comms, {2, 3}, kBarrierMs, 0);
  INFO("rank 0: " << describe(results[0].outcome));
  CHECK(results[0].outcome.status == COMM_ERR_TIMEOUT);
  CHECK(results[0].missing == std::vector<int>{2, 3});
  CHECK(icontains(results[0].outcome.message, "Rank 2 failed to pass monitoredBarrier in 500 ms"));
  CHECK(results[0].outcome.ms >= kBarrierMs - 50);
  CHECK(results[0].outcome.ms < kCommTimeoutMs / 2);
  INFO("rank 1: " << describe(results[1].outcome));
  // Its own deadline (TIMEOUT), or rank 0's abort reaching it first (REMOTE).
  CHECK((results[1].outcome.status == COMM_ERR_TIMEOUT || results[1].outcome.status == COMM_ERR_REMOTE));
  CHECK(icontains(results[1].outcome.message,
                  "Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"));
  CHECK(results[1].outcome.ms < kCommTimeoutMs / 2);
  // The failure aborted the communicator on the ranks that called: a later call says so at once.
  CHECK(comm_barrier(ranks.comms[0], nullptr) == COMM_ERR_ABORTED);
  for (comm_t c : ranks.comms) comm_abort(c);
  destroy_ranks(ranks.comms);
}

TEST_CASE("with wait_all, rank 0 names every missing rank", "[deadline][monitored]") {
  Ranks ranks = init_ranks(4, "monitored-all", kCommTimeoutMs);
  REQUIRE(ranks.all_ok());
  auto results = run_barrier(ranks.comms, {1, 3}, kBarrierMs, 1);
  INFO("rank 0: " << describe(results[0].outcome));
  CHECK(results[0].outcome.status == COMM_ERR_TIMEOUT);
  CHECK(results[0].missing == std::vector<int>{1, 3});
  CHECK(icontains(results[0].outcome.message, "Ranks 1, 3 failed to pass monitoredBarrier"));
  for (comm_t c : ranks.comms) comm_abort(c);
  destroy_ranks(ranks.comms);
}

TEST_CASE("a monitored barrier rejects bad arguments and leaves the communicator usable", "[bad_input][monitored]") {
  Ranks ranks = init_ranks(2, "monitored-bad", kCommTimeoutMs);
  REQUIRE(ranks.all_ok());
  int n_missing = -1;
  CHECK(comm_barrier_monitored(nullptr, 100, 0, nullptr, 0, &n_missing) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_barrier_monitored(ranks.comms[0], -1, 0, nullptr, 0, &n_missing) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_barrier_monitored(ranks.comms[0], 100, 0, nullptr, 3, &n_missing) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(n_missing == 0);
  auto results = on_ranks(2, [&](int r) { return comm_barrier_monitored(ranks.comms[static_cast<size_t>(r)], 5000, 0, nullptr, 0, nullptr); });
  CHECK(results[0] == COMM_OK);
  CHECK(results[1] == COMM_OK);
  destroy_ranks(ranks.comms);
}
