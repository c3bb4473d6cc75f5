// Straggler detection (docs/observability.md): each rank's own wait for each peer's first
// message of a collective, over real communicators (ranks as threads, shared memory and
// sockets), read from the counters the metrics plugin exports.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "abi/harness.h"
#include "common/arrivals.h"
#include "communicator.h"
#include "support/env_guard.h"

namespace {

constexpr int kRanks = 4;
constexpr int kSlow = 3;
constexpr int kCalls = 110;  // one window of straggler detection (observe/stats.h) and some

// Follows each rank's named straggler to the rank at the end of the chain (a rank that waited
// for a late one names that one, as blame.cc follows a hang's waits): -1 when it names none.
int chain_end(const std::vector<comm_t>& comms, int r) {
  int named = -1;
  for (int hops = 0; hops < kRanks; ++hops) {
    const int next = comms[static_cast<size_t>(r)]->stats.straggler();
    if (next < 0 || next == r) break;
    named = r = next;
  }
  return named;
}

void run_with_straggler(const char* transport) {
  EnvGuard t("COMM_TRANSPORT", transport);
  EnvGuard late("COMM_STRAGGLER_MS", "10");
  abi::Ranks ranks = abi::init_ranks(kRanks, std::string("stragglers-") + transport, 30000);
  REQUIRE(ranks.all_ok());
  abi::Failures failures;
  abi::on_ranks(kRanks, [&](int r) {
    float x = 1;
    for (int i = 0; i < kCalls; ++i) {
      // Rank 3's compute takes 40 ms longer per step: every other rank waits for it.
      if (r == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(40));
      if (comm_allreduce(ranks.comms[static_cast<size_t>(r)], &x, &x, 1, COMM_FLOAT32, COMM_MAX, nullptr) != COMM_OK)
        failures.add("rank " + std::to_string(r) + ": " + abi::last_error(ranks.comms[static_cast<size_t>(r)]));
    }
  });
  INFO(failures.summary());
  REQUIRE(failures.count() == 0);
  int direct = 0;
  for (int r = 0; r < kRanks; ++r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    INFO("transport " << transport << ", rank " << r << " names " << c->stats.straggler() << " (late in "
                      << c->stats.straggler_count() << " of 100, " << c->stats.straggler_wait_ns() / 1000000 << " ms)");
    // The slow rank waits on nobody; every other rank's chain of named stragglers ends at it.
    if (r == kSlow) {
      CHECK(c->stats.straggler() == -1);
      continue;
    }
    CHECK(chain_end(ranks.comms, r) == kSlow);
    if (c->stats.straggler() == kSlow) {
      ++direct;
      CHECK(c->stats.late(kSlow) >= 50);
      CHECK(c->arrivals->messages(kSlow) >= static_cast<uint64_t>(kCalls));
    }
    // Counted as comm-bench counts them: calls, and bytes as its size column.
    const auto& ar = c->stats.coll(static_cast<size_t>(comm::transport::CollKind::kAllreduce));
    CHECK(ar.calls.load() == static_cast<uint64_t>(kCalls));
    CHECK(ar.bytes.load() == static_cast<uint64_t>(kCalls) * sizeof(float));
  }
  CHECK(direct >= 1);
  abi::destroy_ranks(ranks.comms);
}

}  // namespace

TEST_CASE("a rank whose compute is slower is named by the ranks that wait for its first message", "[stragglers]") {
  SECTION("shared memory") { run_with_straggler("shm"); }
  SECTION("sockets") { run_with_straggler("socket"); }
}

TEST_CASE("COMM_STRAGGLER_MS=0 turns straggler detection off: no clock is read per message", "[stragglers]") {
  EnvGuard late("COMM_STRAGGLER_MS", "0");
  abi::Ranks ranks = abi::init_ranks(2, "stragglers-off", 30000);
  REQUIRE(ranks.all_ok());
  for (comm_t c : ranks.comms) {
    CHECK(c->arrivals == nullptr);
    CHECK_FALSE(c->stats.detecting());
  }
  abi::destroy_ranks(ranks.comms);
}
