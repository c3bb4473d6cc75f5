// The snapshot the metrics plugin serves (libcomm/src/observe/snapshot.cc): every live
// communicator's counts as comm-bench counts them, its series gone with comm_destroy, and never
// a secret.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "abi/harness.h"
#include "communicator.h"
#include "observe/metrics.h"
#include "support/env_guard.h"

namespace {

nlohmann::json take() {
  std::string buf(1 << 20, '\0');
  const size_t n = comm::observe::snapshot(buf.data(), buf.size());
  REQUIRE(n < buf.size());
  buf.resize(n);
  INFO(buf);
  auto j = nlohmann::json::parse(buf, nullptr, false);
  REQUIRE(j.is_object());
  return j;
}

}  // namespace

TEST_CASE("the metrics snapshot counts each live communicator's calls and bytes, and nothing secret", "[snapshot]") {
  EnvGuard token("COMM_AUTH_TOKEN", "s3cret-token-for-the-test");
  abi::Ranks ranks = abi::init_ranks(2, "snapshot", 30000);
  REQUIRE(ranks.all_ok());
  abi::on_ranks(2, [&](int r) {
    float x[256] = {};
    for (int i = 0; i < 7; ++i) comm_allreduce(ranks.comms[static_cast<size_t>(r)], x, x, 256, COMM_FLOAT32, COMM_SUM, nullptr);
    comm_barrier(ranks.comms[static_cast<size_t>(r)], nullptr);
  });
  const nlohmann::json j = take();
  const std::string text = j.dump();
  CHECK(text.find("s3cret-token-for-the-test") == std::string::npos);
  for (comm_t c : ranks.comms) CHECK(text.find(c->secret) == std::string::npos);
  int seen = 0;
  for (const auto& c : j["comms"]) {
    if (c["comm"] != "0") continue;
    ++seen;
    CHECK(c["running"] == false);
    bool allreduce = false, barrier = false;
    for (const auto& k : c["collectives"]) {
      if (k["collective"] == "allreduce") {
        allreduce = true;
        CHECK(k["calls"] == 7);
        CHECK(k["bytes"] == 7 * 256 * 4);
        uint64_t in_buckets = 0;
        for (const auto& b : k["buckets"]) in_buckets += b.get<uint64_t>();
        CHECK(in_buckets == 7);
      }
      if (k["collective"] == "barrier") barrier = k["calls"] == 1;
    }
    CHECK(allreduce);
    CHECK(barrier);
    CHECK(c["peers"].size() == 1);  // the one peer it heard from
  }
  CHECK(seen == 2);
  abi::destroy_ranks(ranks.comms);
  for (const auto& c : take()["comms"]) CHECK(c["comm"] != "0");  // a destroyed communicator's series go
}

TEST_CASE("the metrics snapshot carries the engine's steps, exposed communication time and overlap", "[snapshot]") {
  abi::Ranks ranks = abi::init_ranks(2, "snapshot-engine", 30000);
  REQUIRE(ranks.all_ok());
  constexpr int kSteps = 3;
  std::vector<comm_engine_stats_t> stats(2);
  std::set<int> with_engine;  // the ranks whose communicator the snapshot listed with engine steps
  abi::on_ranks(2, [&](int r) {
    comm_engine_t eng = nullptr;
    REQUIRE(comm_engine_create(ranks.comms[static_cast<size_t>(r)], nullptr, &eng) == COMM_OK);
    std::vector<float> g(4096, 1.0f);
    int index = -1;
    REQUIRE(comm_engine_register(eng, g.size(), COMM_FLOAT32, &index) == COMM_OK);
    REQUIRE(comm_engine_finalize(eng) == COMM_OK);
    for (int s = 0; s < kSteps; ++s) {
      REQUIRE(comm_engine_begin(eng, 1) == COMM_OK);
      REQUIRE(comm_engine_grad_ready(eng, index, g.data()) == COMM_OK);
      REQUIRE(comm_engine_end(eng) == COMM_OK);
    }
    comm_engine_stats_t& st = stats[static_cast<size_t>(r)];
    st.size = sizeof st;
    REQUIRE(comm_engine_stats(eng, &st) == COMM_OK);
    // Counted on the communicator the engine was created on (the trainer's), not on its dup.
    comm_barrier(ranks.comms[static_cast<size_t>(r)], nullptr);
    if (r == 0) {
      const nlohmann::json j = take();
      for (const auto& c : j["comms"]) {
        if (!c.contains("engine")) continue;
        CHECK(c["comm"] == "0");
        with_engine.insert(c["rank"].get<int>());
        CHECK(c["engine"]["steps"] == kSteps);
        CHECK(c["engine"]["exposed_s"].get<double>() >= 0.0);
        CHECK(c["engine"]["exposed_s"].get<double>() <= c["engine"]["step_s"].get<double>() + 1e-6);
        // The last step's exposed time and overlap are comm_engine_stats' (the snapshot rounds to ns).
        if (c["rank"] == 0)
          CHECK(c["engine"]["last_exposed_s"].get<double>() == Approx(st.exposed_comm_us * 1e-6).margin(1e-5));
        const double overlap = c["engine"]["last_overlap"].get<double>();
        CHECK(overlap >= 0.0);
        CHECK(overlap <= 1.0);
      }
    }
    comm_barrier(ranks.comms[static_cast<size_t>(r)], nullptr);
    REQUIRE(comm_engine_destroy(eng) == COMM_OK);
  });
  CHECK(with_engine == std::set<int>{0, 1});
  abi::destroy_ranks(ranks.comms);
}
