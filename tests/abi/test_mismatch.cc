// Ranks that disagree on a collective all get COMM_ERR_INVALID_USAGE within the timeout, with
// a message naming both sides; the communicator is broken afterwards (docs/design/core.md, "Broken communicators").
// Deadline tests: run one at a time, short explicit timeouts.
#include <cstring>
#include <functional>
#include <vector>

#include <catch2/catch.hpp>

#include <unistd.h>

#include "../support/env_guard.h"
#include "harness.h"
#include "probe.h"

namespace {

using namespace abi;

constexpr int kTimeoutMs = 3000;
constexpr size_t kBig = size_t{1} << 20;

struct RankOutcome {
  Outcome first;    // the disagreeing call
  Outcome after;    // a well-formed call that every rank agrees on
  Outcome destroy;
};

using Call = std::function<comm_status_t(comm_t comm, int rank, void* send, void* recv)>;

std::vector<RankOutcome> run_mismatch(int n, const std::string& what, const Call& call) {
  Ranks ranks = init_ranks(n, what, kTimeoutMs);
  if (!ranks.all_ok()) {
    destroy_ranks(ranks.comms);
    FAIL("comm_init failed:\n" << ranks.describe());
  }
  return on_ranks(n, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    std::vector<double> send(kBig + 1, 1.0), recv(kBig + 1, 0.0);
    RankOutcome o;
    o.first = timed(c, [&] { return call(c, r, send.data(), recv.data()); });
    o.after = timed(c, [&] { return comm_allreduce(c, send.data(), recv.data(), 4, COMM_FLOAT32, COMM_SUM, nullptr); });
    o.destroy = timed(nullptr, [&] { return comm_destroy(c); });
    return o;
  });
}

void check_mismatch(const std::vector<RankOutcome>& outcomes, const Words& words) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    const RankOutcome& o = outcomes[r];
    const std::string who = "rank " + std::to_string(r);
    check_probe({"the disagreeing call", COMM_ERR_INVALID_USAGE, words, o.first}, who);
    INFO(who << ": the disagreeing call took " << o.first.ms << " ms; the timeout is " << kTimeoutMs << " ms");
    CHECK(o.first.ms < kTimeoutMs + loaded_host::kSlackMs);  // the status says "not the timeout"; this, "no hang"
    INFO(who << ": the call after it -> " << describe(o.after));
    CHECK(o.after.status != COMM_OK);  // broken: a later call fails ...
    CHECK(status_name(o.after.status) == status_name(o.first.status));  // ... with that error (docs/design/core.md, "Broken communicators")
    CHECK(o.after.ms < kTimeoutMs + loaded_host::kSlackMs);
    INFO(who << ": comm_destroy -> " << describe(o.destroy));
    CHECK(o.destroy.ms < kTimeoutMs + loaded_host::kSlackMs);
  }
}

}  // namespace

TEST_CASE("mismatch: allreduce of 100 elements on one rank and 101 on the other", "[mismatch][deadline]") {
  auto out = run_mismatch(2, "count-100-101", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, r == 0 ? 100 : 101, COMM_FLOAT32, COMM_SUM, nullptr);
  });
  check_mismatch(out, {{"100"}, {"101"}});
}

TEST_CASE("mismatch: 3 ranks where only the last one's count differs: every rank is told", "[mismatch][deadline]") {
  auto out = run_mismatch(3, "count-one-of-three", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, r == 2 ? 101 : 100, COMM_FLOAT32, COMM_SUM, nullptr);
  });
  check_mismatch(out, {{"100"}, {"101"}});
}

TEST_CASE("mismatch: allreduce on one rank, broadcast on the other", "[mismatch][deadline]") {
  auto out = run_mismatch(2, "allreduce-broadcast", [](comm_t c, int r, void* s, void* d) {
    return r == 0 ? comm_allreduce(c, s, d, 100, COMM_FLOAT32, COMM_SUM, nullptr)
                  : comm_broadcast(c, s, d, 100, COMM_FLOAT32, 0, nullptr);
  });
  check_mismatch(out, {{"allreduce"}, {"broadcast"}});
}

TEST_CASE("mismatch: the same allreduce with different dtypes", "[mismatch][deadline]") {
  auto out = run_mismatch(2, "dtypes", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, 100, r == 0 ? COMM_FLOAT32 : COMM_INT64, COMM_SUM, nullptr);
  });
  check_mismatch(out, {{"float32", "float"}, {"int64"}});
}

TEST_CASE("mismatch: the same allreduce with different ops", "[mismatch][deadline]") {
  auto out = run_mismatch(2, "ops", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, 100, COMM_FLOAT32, r == 0 ? COMM_SUM : COMM_MAX, nullptr);
  });
  check_mismatch(out, {{"sum"}, {"max"}});
}

TEST_CASE("mismatch: large counts that differ by one element (the pipelined path)", "[mismatch][deadline]") {
  auto out = run_mismatch(2, "count-large", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, r == 0 ? kBig : kBig + 1, COMM_FLOAT32, COMM_SUM, nullptr);
  });
  check_mismatch(out, {{std::to_string(kBig)}, {std::to_string(kBig + 1)}});
}

TEST_CASE("mismatch: a small count on one rank, a large one on the other (different algorithms)",
          "[mismatch][deadline]") {
  auto out = run_mismatch(3, "count-small-large", [](comm_t c, int r, void* s, void* d) {
    return comm_allreduce(c, s, d, r == 1 ? kBig : 100, COMM_FLOAT32, COMM_SUM, nullptr);
  });
  check_mismatch(out, {{"100"}, {std::to_string(kBig)}});
}

namespace {

// Two ranks over sockets (where a send completes once its bytes are written): rank 0 and rank 1
// each run their own call, then rank 0, if its call succeeded, polls comm_get_async_error until
// it reports (for up to the timeout + a busy host's margin), then both try an allreduce they
// agree on.
struct OnlySends {
  Outcome first;
  comm_status_t async = COMM_OK;
  Outcome after;
};

std::vector<OnlySends> run_only_sends(const std::string& what, const Call& call) {
  Ranks ranks = init_ranks(2, what, kTimeoutMs, [](int, comm_config_t& cfg) { cfg.transport = "socket"; });
  if (!ranks.all_ok()) {
    destroy_ranks(ranks.comms);
    FAIL("comm_init failed:\n" << ranks.describe());
  }
  auto out = on_ranks(2, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    std::vector<float> send(128, 1.0f), recv(128, 0.0f);
    OnlySends o;
    o.first = timed(c, [&] { return call(c, r, send.data(), recv.data()); });
    const double t0 = now_ms();
    while (r == 0 && o.first.status == COMM_OK && (o.async = comm_get_async_error(c)) == COMM_OK &&
           now_ms() - t0 < kTimeoutMs + loaded_host::kSlackMs)
      usleep(10000);
    o.after = timed(c, [&] { return comm_allreduce(c, send.data(), recv.data(), 4, COMM_FLOAT32, COMM_SUM, nullptr); });
    return o;
  });
  destroy_ranks(ranks.comms);
  return out;
}

}  // namespace

TEST_CASE("mismatch: a broadcast root that completed its call locally learns of the disagreement from "
          "comm_get_async_error, and its next call fails with it",
          "[mismatch][deadline]") {
  auto out = run_only_sends("root-completes", [](comm_t c, int r, void* s, void* d) {
    return comm_broadcast(c, s, d, r == 0 ? 100 : 101, COMM_FLOAT32, 0, nullptr);
  });
  INFO("rank 0: " << describe(out[0].first) << "; async " << out[0].async << "; then " << describe(out[0].after));
  INFO("rank 1: " << describe(out[1].first) << "; then " << describe(out[1].after));
  CHECK(out[1].first.status == COMM_ERR_INVALID_USAGE);
  CHECK(out[0].first.status == COMM_OK);  // the root only sends: its bytes left, nothing came back
  CHECK(out[0].async == COMM_ERR_INVALID_USAGE);
  CHECK(out[0].after.status == COMM_ERR_INVALID_USAGE);
  CHECK(out[0].after.ms < kTimeoutMs + loaded_host::kSlackMs);
  CHECK(out[0].after.message.find("100") != std::string::npos);
  CHECK(out[0].after.message.find("101") != std::string::npos);
}

TEST_CASE("mismatch: strict mode (COMM_CHECK_COLLECTIVES=1) fails the call itself on every rank, also where a rank "
          "only sends, naming what each rank called",
          "[mismatch][deadline]") {
  EnvGuard strict("COMM_CHECK_COLLECTIVES", "1");
  SECTION("broadcast counts differ: the root hears it in its own call") {
    auto out = run_only_sends("strict-bcast", [](comm_t c, int r, void* s, void* d) {
      return comm_broadcast(c, s, d, r == 0 ? 100 : 101, COMM_FLOAT32, 0, nullptr);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << describe(out[r].first));
      CHECK(out[r].first.status == COMM_ERR_INVALID_USAGE);
      CHECK(out[r].first.ms < kTimeoutMs + loaded_host::kSlackMs);
      CHECK(out[r].first.message.find("100") != std::string::npos);
      CHECK(out[r].first.message.find("101") != std::string::npos);
    }
  }
  SECTION("a broadcast root and a reduce leaf: both only send, both are told") {
    auto out = run_only_sends("strict-bcast-reduce", [](comm_t c, int r, void* s, void* d) {
      return r == 0 ? comm_broadcast(c, s, d, 100, COMM_FLOAT32, 0, nullptr)
                    : comm_reduce(c, s, d, 100, COMM_FLOAT32, COMM_SUM, 0, nullptr);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << describe(out[r].first));
      CHECK(out[r].first.status == COMM_ERR_INVALID_USAGE);
      CHECK(out[r].first.ms < kTimeoutMs + loaded_host::kSlackMs);
      CHECK(out[r].first.message.find("broadcast") != std::string::npos);
      CHECK(out[r].first.message.find("reduce") != std::string::npos);
    }
  }
}

TEST_CASE("mismatch: strict mode (COMM_CHECK_COLLECTIVES=1) passes calls that agree, one-sided shared-memory "
          "all-reduces between its checks included",
          "[mismatch][deadline]") {
  EnvGuard strict("COMM_CHECK_COLLECTIVES", "1");
  const int n = 4;
  Ranks ranks = init_ranks(n, "strict-agree", kTimeoutMs);
  if (!ranks.all_ok()) {
    destroy_ranks(ranks.comms);
    FAIL("comm_init failed:\n" << ranks.describe());
  }
  auto out = on_ranks(n, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    std::vector<float> big(size_t{1} << 18, 1.0f), small(2, 1.0f);
    for (int i = 0; i < 40; ++i) {
      Outcome o = timed(c, [&] { return comm_allreduce(c, big.data(), big.data(), big.size(), COMM_FLOAT32, COMM_MAX, nullptr); });
      if (o.status == COMM_OK)
        o = timed(c, [&] { return comm_allreduce(c, small.data(), small.data(), 2, COMM_FLOAT32, COMM_MAX, nullptr); });
      if (o.status != COMM_OK) return o;
    }
    return Outcome{};
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << describe(out[static_cast<size_t>(r)]));
    CHECK(out[static_cast<size_t>(r)].status == COMM_OK);
  }
}
