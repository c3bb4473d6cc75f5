// Ranks that disagree on a collective all get COMM_ERR_INVALID_USAGE within the timeout, with
// a message naming both sides; the communicator is broken afterwards (docs/design.md, "Broken communicators").
// Deadline tests: run one at a time, short explicit timeouts.
#include <cstring>
#include <functional>
#include <vector>

#include <catch2/catch.hpp>

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
    CHECK(o.first.ms < kTimeoutMs);
    INFO(who << ": the call after it -> " << describe(o.after));
    CHECK(o.after.status != COMM_OK);  // broken: a later call fails ...
    CHECK(status_name(o.after.status) == status_name(o.first.status));  // ... with that error (docs/design.md, "Broken communicators")
    CHECK(o.after.ms < kTimeoutMs);
    INFO(who << ": comm_destroy -> " << describe(o.destroy));
    CHECK(o.destroy.ms < kTimeoutMs + 1000);
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
