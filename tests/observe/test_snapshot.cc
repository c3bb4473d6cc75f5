// The snapshot the metrics plugin serves (libcomm/src/observe/snapshot.cc): every live
// communicator's counts as comm-bench counts them, its series gone with comm_destroy, and never
// a secret.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>

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
