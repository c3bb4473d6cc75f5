// Lifecycle and queries: rank/size, dup, split, status strings, last error, version string, memory,
// and init disagreement (every rank fails, naming the difference).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <stdlib.h>

#include <catch2/catch.hpp>

#include "harness.h"
#include "probe.h"

namespace {

using namespace abi;

// Parent ranks in the order of c's ranks, by allgather.
std::vector<int32_t> member_order(comm_t c, int parent_rank, int size, comm_status_t* st) {
  std::vector<int32_t> order(static_cast<size_t>(size), -1);
  int32_t mine = parent_rank;
  *st = comm_allgather(c, &mine, order.data(), 1, COMM_INT32, nullptr);
  return order;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

}  // namespace

TEST_CASE("comm_rank and comm_size report each rank's place", "[lifecycle]") {
  Ranks ranks = init_ranks(3, "rank-size", 20000);
  REQUIRE(ranks.all_ok());
  struct Q {
    comm_status_t rs, ss;
    int rank = -1, size = -1;
  };
  auto q = on_ranks(3, [&](int r) {
    Q x;
    x.rs = comm_rank(ranks.comms[static_cast<size_t>(r)], &x.rank);
    x.ss = comm_size(ranks.comms[static_cast<size_t>(r)], &x.size);
    return x;
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(q[r].rs == COMM_OK);
    CHECK(q[r].ss == COMM_OK);
    CHECK(q[r].rank == r);
    CHECK(q[r].size == 3);
  }
}

TEST_CASE("comm_dump_flight_recorder writes each rank's last operations as JSON, on demand, %r expanded",
          "[lifecycle]") {
  Ranks ranks = init_ranks(2, "flight-recorder", 20000);
  REQUIRE(ranks.all_ok());
  char dir_template[] = "/tmp/abi-flight-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string pattern = dir + "/fr-%r.json";
  auto st = on_ranks(2, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    std::vector<comm_status_t> out;
    for (int i = 0; i < 3; ++i) out.push_back(allreduce_sum(c, r).status);
    out.push_back(comm_barrier(c, nullptr));
    out.push_back(comm_dump_flight_recorder(c, pattern.c_str()));
    return out;
  });
  // No path and no COMM_FLIGHT_RECORDER_FILE (the test's environment has none): a clear error.
  const comm_status_t none = comm_dump_flight_recorder(ranks.comms[0], nullptr);
  const std::string none_message = last_error(ranks.comms[0]);
  destroy_ranks(ranks.comms);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    for (comm_status_t s : st[r]) CHECK(s == COMM_OK);
    const std::string path = dir + "/fr-" + std::to_string(r) + ".json";
    FILE* f = std::fopen(path.c_str(), "r");
    REQUIRE(f != nullptr);
    std::string text(1 << 16, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    std::remove(path.c_str());
    INFO(text);
    CHECK(text.find("\"rank\": " + std::to_string(r) + ",") != std::string::npos);
    size_t done = 0;
    for (size_t at = text.find("\"collective\": \"allreduce\""); at != std::string::npos;
         at = text.find("\"collective\": \"allreduce\"", at + 1))
      done += text.compare(text.find("\"state\": ", at) + 9, 6, "\"done\"") == 0;
    CHECK(done == 3);
    CHECK(text.find("\"collective\": \"barrier\"") != std::string::npos);
  }
  rmdir(dir.c_str());
  CHECK(none == COMM_ERR_INVALID_ARGUMENT);
  CHECK(icontains(none_message, "COMM_FLIGHT_RECORDER_FILE"));
}

TEST_CASE("comm_status_string names every status code, distinctly", "[lifecycle]") {
  const std::vector<std::pair<comm_status_t, std::vector<std::string>>> codes = {
      {COMM_OK, {"ok", "success"}},
      {COMM_ERR_INVALID_ARGUMENT, {"argument"}},
      {COMM_ERR_INVALID_USAGE, {"usage"}},
      {COMM_ERR_SYSTEM, {"system"}},
      {COMM_ERR_TIMEOUT, {"time"}},
      {COMM_ERR_REMOTE, {"remote", "peer"}},
      {COMM_ERR_ABORTED, {"abort"}},
      {COMM_ERR_UNAVAILABLE, {"unavailable", "not available"}},
      {COMM_ERR_INTERNAL, {"internal"}},
  };
  std::set<std::string> seen;
  for (const auto& [code, words] : codes) {
    const char* s = comm_status_string(code);
    REQUIRE(s != nullptr);
    INFO(status_name(code) << " -> \"" << s << "\"");
    CHECK(std::strlen(s) > 0);
    bool named = false;
    for (const auto& w : words) named = named || icontains(s, w);
    CHECK(named);
    CHECK(seen.insert(s).second);
  }
  // Values are part of the ABI and never renumbered.
  CHECK(COMM_OK == 0);
  CHECK(COMM_ERR_INVALID_ARGUMENT == 1);
  CHECK(COMM_ERR_INVALID_USAGE == 2);
  CHECK(COMM_ERR_SYSTEM == 3);
  CHECK(COMM_ERR_TIMEOUT == 4);
  CHECK(COMM_ERR_REMOTE == 5);
  CHECK(COMM_ERR_ABORTED == 6);
  CHECK(COMM_ERR_UNAVAILABLE == 7);
  CHECK(COMM_ERR_INTERNAL == 8);
  const char* unknown = comm_status_string(static_cast<comm_status_t>(99));
  REQUIRE(unknown != nullptr);
  CHECK(std::strlen(unknown) > 0);
}

TEST_CASE("comm_get_version_string gives meson's release and the git commit", "[lifecycle]") {
  const char* text = comm_get_version_string();
  REQUIRE(text != nullptr);
  const std::string v = text;
  INFO(v);
  CHECK(v.rfind(std::string(ABI_PROJECT_VERSION) + " (git ", 0) == 0);  // "1.0.0 (git 868ddb39b8cc)"
  CHECK(v.back() == ')');
  CHECK(v.size() > std::strlen(ABI_PROJECT_VERSION) + 8);  // a commit, or "unknown", between the brackets
  CHECK(std::string(comm_get_version_string()) == v);      // static: the same text every time
}

TEST_CASE("comm_last_error is the calling thread's own, \"\" when nothing failed, whatever handle is passed",
          "[lifecycle]") {
  Ranks ranks = init_ranks(1, "last-error", 20000);
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  std::string fresh_a, after_a_null, after_a_comm, fresh_b;
  comm_status_t failed = COMM_OK;
  std::thread a([&] {
    fresh_a = last_error(nullptr);
    float x = 1;
    failed = comm_allreduce(c, &x, &x, 1, static_cast<comm_dtype_t>(77), COMM_SUM, nullptr);
    after_a_null = last_error(nullptr);
    after_a_comm = last_error(c);
  });
  a.join();
  std::thread b([&] { fresh_b = last_error(c); });
  b.join();
  destroy_ranks(ranks.comms);
  CHECK(fresh_a == "");
  CHECK(failed == COMM_ERR_INVALID_ARGUMENT);
  CHECK(icontains(after_a_null, "77"));
  CHECK(after_a_comm == after_a_null);
  INFO("another thread's comm_last_error: \"" << fresh_b << "\"");
  CHECK(fresh_b == "");
}

TEST_CASE("comm_dup gives an independent communicator: same ranks, own traffic, outlives nothing", "[lifecycle]") {
  const int n = 3;
  Ranks ranks = init_ranks(n, "dup", 20000);
  REQUIRE(ranks.all_ok());
  struct Seen {
    comm_status_t dup = COMM_ERR_INTERNAL, rank_st = COMM_ERR_INTERNAL, size_st = COMM_ERR_INTERNAL;
    int rank = -1, size = -1;
    Reduced on_dup, on_parent_after_destroy;
    comm_status_t crossed = COMM_ERR_INTERNAL;
    std::string crossed_message;
    double parent_result = 0, dup_result = 0;
    comm_status_t destroy_dup = COMM_ERR_INTERNAL;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t parent = ranks.comms[static_cast<size_t>(r)];
    comm_t dup = nullptr;
    s.dup = comm_dup(parent, &dup);
    if (s.dup != COMM_OK) return s;
    s.rank_st = comm_rank(dup, &s.rank);
    s.size_st = comm_size(dup, &s.size);
    s.on_dup = allreduce_sum(dup, r + 1);
    // Issued in opposite orders on different ranks: only independent sequences match up.
    double p_in = r + 1, d_in = 100.0 * (r + 1);
    comm_request_t preq = nullptr, dreq = nullptr;
    comm_status_t a, b;
    if (r == 0) {
      a = comm_iallreduce(parent, &p_in, &s.parent_result, 1, COMM_FLOAT64, COMM_SUM, &preq);
      b = comm_iallreduce(dup, &d_in, &s.dup_result, 1, COMM_FLOAT64, COMM_SUM, &dreq);
    } else {
      b = comm_iallreduce(dup, &d_in, &s.dup_result, 1, COMM_FLOAT64, COMM_SUM, &dreq);
      a = comm_iallreduce(parent, &p_in, &s.parent_result, 1, COMM_FLOAT64, COMM_SUM, &preq);
    }
    const comm_status_t wa = a == COMM_OK ? comm_wait(preq) : a;
    const comm_status_t wb = b == COMM_OK ? comm_wait(dreq) : b;
    s.crossed = wa != COMM_OK ? wa : wb;
    if (s.crossed != COMM_OK) s.crossed_message = last_error(parent);
    s.destroy_dup = comm_destroy(dup);
    s.on_parent_after_destroy = allreduce_sum(parent, 10);
    return s;
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[r];
    INFO("rank " << r << ": dup " << status_name(s.dup) << "; allreduce on dup " << status_name(s.on_dup.status) << " "
                 << s.on_dup.message << "; crossed order " << status_name(s.crossed) << " " << s.crossed_message
                 << "; parent after dup destroyed " << status_name(s.on_parent_after_destroy.status) << " "
                 << s.on_parent_after_destroy.message);
    REQUIRE(s.dup == COMM_OK);
    CHECK(s.rank_st == COMM_OK);
    CHECK(s.size_st == COMM_OK);
    CHECK(s.rank == r);
    CHECK(s.size == n);
    CHECK(s.on_dup.status == COMM_OK);
    CHECK(s.on_dup.sum == 6);
    CHECK(s.crossed == COMM_OK);
    CHECK(s.parent_result == 6.0);
    CHECK(s.dup_result == 600.0);
    CHECK(s.destroy_dup == COMM_OK);
    CHECK(s.on_parent_after_destroy.status == COMM_OK);
    CHECK(s.on_parent_after_destroy.sum == 30);
  }
}

TEST_CASE("comm_split by color (even/odd) and key (reverse order) gives the right sizes, ranks and a working "
          "allreduce in each",
          "[lifecycle]") {
  const int n = 5;
  Ranks ranks = init_ranks(n, "split", 20000);
  REQUIRE(ranks.all_ok());
  struct Seen {
    comm_status_t split = COMM_ERR_INTERNAL, order_st = COMM_ERR_INTERNAL;
    int rank = -1, size = -1;
    Reduced sum, parent_sum, dup_of_split_sum;
    std::vector<int32_t> order;
    comm_status_t tie_split = COMM_ERR_INTERNAL, tie_order_st = COMM_ERR_INTERNAL;
    std::vector<int32_t> tie_order;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t parent = ranks.comms[static_cast<size_t>(r)];
    comm_t sub = nullptr;
    s.split = comm_split(parent, r % 2, -r, &sub);
    if (s.split != COMM_OK) return s;
    comm_rank(sub, &s.rank);
    comm_size(sub, &s.size);
    s.sum = allreduce_sum(sub, r);
    s.order = member_order(sub, r, s.size > 0 ? s.size : 1, &s.order_st);
    comm_t dup = nullptr;
    if (comm_dup(sub, &dup) == COMM_OK) {
      s.dup_of_split_sum = allreduce_sum(dup, 1);
      comm_destroy(dup);
    }
    // Equal keys keep the parent's order.
    comm_t tie = nullptr;
    s.tie_split = comm_split(parent, 7, 0, &tie);
    if (s.tie_split == COMM_OK) {
      s.tie_order = member_order(tie, r, n, &s.tie_order_st);
      comm_destroy(tie);
    }
    comm_destroy(sub);
    s.parent_sum = allreduce_sum(parent, 1);
    return s;
  });
  destroy_ranks(ranks.comms);
  const std::vector<int32_t> even_order = {4, 2, 0}, odd_order = {3, 1};
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[r];
    const bool even = r % 2 == 0;
    const auto& order = even ? even_order : odd_order;
    INFO("rank " << r << ": split " << status_name(s.split) << ", new rank " << s.rank << " of " << s.size
                 << ", members in order " << join(s.order) << ", allreduce " << status_name(s.sum.status) << " "
                 << s.sum.message);
    REQUIRE(s.split == COMM_OK);
    CHECK(s.size == static_cast<int>(order.size()));
    CHECK(s.rank == static_cast<int>(std::find(order.begin(), order.end(), r) - order.begin()));
    CHECK(s.sum.status == COMM_OK);
    CHECK(s.sum.sum == (even ? 6 : 4));
    CHECK(s.order_st == COMM_OK);
    CHECK(join(s.order) == join(order));
    CHECK(s.dup_of_split_sum.status == COMM_OK);
    CHECK(s.dup_of_split_sum.sum == static_cast<int64_t>(order.size()));
    CHECK(s.tie_split == COMM_OK);
    CHECK(join(s.tie_order) == "0,1,2,3,4");
    CHECK(s.parent_sum.status == COMM_OK);
    CHECK(s.parent_sum.sum == n);
  }
}

TEST_CASE("comm_split with color COMM_UNSET: that rank gets NULL, the others a working communicator", "[lifecycle]") {
  const int n = 3;
  Ranks ranks = init_ranks(n, "split-unset", 20000);
  REQUIRE(ranks.all_ok());
  struct Seen {
    comm_status_t split = COMM_ERR_INTERNAL;
    comm_t out = nullptr;
    int rank = -1, size = -1;
    Reduced sum;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t parent = ranks.comms[static_cast<size_t>(r)];
    s.out = reinterpret_cast<comm_t>(uintptr_t{1});  // must be overwritten with NULL
    s.split = comm_split(parent, r == 1 ? COMM_UNSET : 0, r, &s.out);
    if (s.split == COMM_OK && s.out != nullptr) {
      comm_rank(s.out, &s.rank);
      comm_size(s.out, &s.size);
      s.sum = allreduce_sum(s.out, r);
      comm_destroy(s.out);
    }
    return s;
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << status_name(seen[r].split) << " " << seen[r].sum.message);
    CHECK(seen[r].split == COMM_OK);
  }
  CHECK(seen[1].out == nullptr);
  CHECK(seen[0].out != nullptr);
  CHECK(seen[2].out != nullptr);
  CHECK(seen[0].rank == 0);
  CHECK(seen[2].rank == 1);
  CHECK(seen[0].size == 2);
  CHECK(seen[0].sum.sum == 2);
  CHECK(seen[2].sum.sum == 2);
}

TEST_CASE("comm_mem_alloc gives memory collectives work on; comm_mem_free takes it back", "[lifecycle]") {
  const int n = 2;
  Ranks ranks = init_ranks(n, "mem", 20000);
  REQUIRE(ranks.all_ok());
  struct Seen {
    comm_status_t alloc = COMM_ERR_INTERNAL, reduce = COMM_ERR_INTERNAL, free = COMM_ERR_INTERNAL;
    bool right = false;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    const size_t count = 1 << 18;
    void* p = nullptr;
    s.alloc = comm_mem_alloc(c, count * sizeof(float), &p);
    if (s.alloc != COMM_OK || !p) return s;
    auto* f = static_cast<float*>(p);
    for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(r + 1) * static_cast<float>(i % 100);
    s.reduce = comm_allreduce(c, f, f, count, COMM_FLOAT32, COMM_SUM, nullptr);
    s.right = true;
    for (size_t i = 0; i < count && s.right; ++i) s.right = f[i] == 3.0f * static_cast<float>(i % 100);
    s.free = comm_mem_free(c, p);
    return s;
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(seen[r].alloc == COMM_OK);
    CHECK(seen[r].reduce == COMM_OK);
    CHECK(seen[r].right);
    CHECK(seen[r].free == COMM_OK);
  }
}

TEST_CASE("different communicators are used from different threads at once", "[lifecycle]") {
  Ranks a = init_ranks(2, "concurrent-a", 20000);
  Ranks b = init_ranks(2, "concurrent-b", 20000);
  REQUIRE(a.all_ok());
  REQUIRE(b.all_ok());
  auto results = on_ranks(4, [&](int t) {
    comm_t c = (t < 2 ? a : b).comms[static_cast<size_t>(t % 2)];
    int wrong = 0;
    for (int i = 0; i < 200; ++i) {
      Reduced x = allreduce_sum(c, (t < 2 ? 1 : 1000) * (i + t % 2));
      const int64_t expected = (t < 2 ? 1 : 1000) * (2 * i + 1);
      if (x.status != COMM_OK || x.sum != expected) ++wrong;
    }
    return wrong;
  });
  destroy_ranks(a.comms);
  destroy_ranks(b.comms);
  for (int t = 0; t < 4; ++t) CHECK(results[t] == 0);
}

// ---- init disagreement: every rank fails, naming the difference ----

namespace {

void check_disagreement(const Ranks& ranks, int max_timeout_ms, const Words& words) {
  for (size_t r = 0; r < ranks.outcomes.size(); ++r) {
    const Outcome& o = ranks.outcomes[r];
    INFO("rank " << r << ": comm_init -> " << describe(o));
    CHECK(o.status != COMM_OK);
    CHECK(o.ms < max_timeout_ms + loaded_host::kSlackMs);  // within the timeout, not a hang
    for (const auto& group : words) {
      bool found = false;
      for (const auto& w : group) found = found || icontains(o.message, w);
      INFO("the message should contain \"" << group.front() << "\"");
      CHECK(found);
    }
  }
}

}  // namespace

TEST_CASE("init disagreement: different timeout_ms per rank fails init on every rank, naming the timeout",
          "[lifecycle][deadline]") {
  Ranks ranks = init_ranks(2, "disagree-timeout", 3000, [](int r, comm_config_t& c) { c.timeout_ms = r ? 4000 : 3000; });
  destroy_ranks(ranks.comms);
  check_disagreement(ranks, 4000, {{"timeout"}, {"3000"}, {"4000"}});
}

TEST_CASE("init disagreement: transport \"socket\" on one rank and \"auto\" on another fails init on every rank",
          "[lifecycle][deadline]") {
  Ranks ranks = init_ranks(3, "disagree-transport", 3000,
                           [](int r, comm_config_t& c) { c.transport = r == 2 ? "auto" : "socket"; });
  destroy_ranks(ranks.comms);
  check_disagreement(ranks, 3000, {{"transport"}, {"socket"}, {"auto"}});
}

TEST_CASE("init disagreement: different world sizes fail init on every rank within the timeout",
          "[lifecycle][deadline]") {
  Ranks ranks = init_ranks(2, "disagree-world", 3000, [](int r, comm_config_t& c) { c.world_size = r ? 3 : 2; });
  destroy_ranks(ranks.comms);
  check_disagreement(ranks, 3000, {{"world", "size"}});
}
