// Shared memory between real processes (issue 3): comm_mem_alloc buffers read in place across
// processes, two "hosts" of two ranks each (COMM_HOST_ID) through the hierarchical all-reduce,
// COMM_TRANSPORT=shm refused across hosts, and a rank killed mid-collective: the survivors
// get COMM_ERR_REMOTE within the timeout and /dev/shm holds nothing of the job afterwards.
// Run one at a time (is_parallel: false): they measure deadlines.
#include <dirent.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "harness.h"
#include "process_harness.h"

namespace {

using namespace abi;

// libcomm's segments in /dev/shm (their names start with "comm-").
std::set<std::string> shm_names() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("comm-", 0) == 0) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// Names that appeared since `before` and are still there a second later (other jobs' segments
// live only while they start up).
std::set<std::string> left_behind(const std::set<std::string>& before) {
  std::set<std::string> now = shm_names(), left;
  for (const auto& n : now)
    if (!before.count(n)) left.insert(n);
  if (left.empty()) return left;
  usleep(1000 * 1000);
  std::set<std::string> later = shm_names(), still;
  for (const auto& n : left)
    if (later.count(n)) still.insert(n);
  return still;
}

std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : " ") + n;
  return s;
}

// Every rank finished cleanly, and every HASH line a rank shares with rank 0 matches.
void check_done_and_identical(const std::vector<Proc>& procs, int min_hashes) {
  std::map<std::string, std::string> rank0;
  for (size_t r = 0; r < procs.size(); ++r) {
    const std::string out = procs[r].output();
    INFO("rank " << r);
    CHECK(procs[r].exited_zero());
    CHECK(line_after(out, "DONE ").value_or("missing") == "0");
    CHECK(!line_after(out, "FAIL ").has_value());
    std::istringstream in(out);
    std::string line;
    int hashes = 0;
    while (std::getline(in, line)) {
      if (line.rfind("HASH ", 0) != 0) continue;
      ++hashes;
      const auto space = line.rfind(' ');
      const std::string label = line.substr(5, space - 5), hash = line.substr(space + 1);
      if (r == 0) {
        rank0[label] = hash;
      } else if (rank0.count(label)) {
        INFO(label);
        CHECK(rank0[label] == hash);
      }
    }
    CHECK(hashes >= min_hashes);
  }
}

}  // namespace

TEST_CASE("shm processes: comm_mem_alloc buffers on the world, a dup and a split, read in place across processes",
          "[shm_process]") {
  TempDir dir;
  const auto before = shm_names();
  const int n = 3, port = free_port();
  auto procs = launch(dir, "shm", n, [&](int r) {
    return torchrun_env(r, n, port, 30000, {{"COMM_TRANSPORT", "shm"}, {"COMM_DEBUG", "INFO"}});
  });
  const bool ended = wait_all(procs, now_ms() + 240000);
  INFO(describe_all(procs));
  CHECK(ended);
  check_done_and_identical(procs, 20);
  for (const auto& p : procs) CHECK(p.output().find("transport shm") != std::string::npos);
  const auto left = left_behind(before);
  INFO("left in /dev/shm: " << joined(left));
  CHECK(left.empty());
}

TEST_CASE("shm processes: 2 hosts x 2 ranks (COMM_HOST_ID): every collective correct and identical, large "
          "all-reduces hierarchical (shm inside a host, sockets between)",
          "[shm_process]") {
  TempDir dir;
  const int n = 4, port = free_port();
  auto procs = launch(dir, "collectives", n, [&](int r) {
    return torchrun_env(r, n, port, 30000,
                        {{"COMM_HOST_ID", r < 2 ? "host-a" : "host-b"}, {"COMM_DEBUG", "TRACE"},
                         {"COMM_DEBUG_SUBSYS", "ALG,INIT"}});
  });
  const bool ended = wait_all(procs, now_ms() + 240000);
  INFO(describe_all(procs));
  CHECK(ended);
  check_done_and_identical(procs, 15);
  for (const auto& p : procs) {
    const std::string out = p.output();
    CHECK(out.find("transport shm+socket") != std::string::npos);
    CHECK(out.find(": hierarchical") != std::string::npos);
  }
}

TEST_CASE("ucx processes: 2 hosts x 2 ranks on InfiniBand hosts (COMM_TOPO_XML): the plan picks shared memory "
          "inside a host and UCX between hosts, logs why, and every collective is correct and identical",
          "[ucx_process]") {
  TempDir dir;
  const int n = 4, port = free_port();
  const std::string topo = std::string(ABI_SOURCE_ROOT) + "/tests/fixtures/nccl-topo/ndv4-topo.xml";
  auto procs = launch(dir, "collectives", n, [&](int r) {
    return torchrun_env(r, n, port, 30000,
                        {{"COMM_HOST_ID", r < 2 ? "host-a" : "host-b"}, {"COMM_TOPO_XML", topo},
                         {"COMM_DEBUG", "INFO"}, {"COMM_DEBUG_SUBSYS", "NET,INIT"}, {"UCX_TLS", "tcp,self"}});
  });
  const bool ended = wait_all(procs, now_ms() + 240000);
  INFO(describe_all(procs));
  CHECK(ended);
  check_done_and_identical(procs, 15);
  for (const auto& p : procs) {
    const std::string out = p.output();
    CHECK(out.find("transport shm+ucx") != std::string::npos);
    CHECK(out.find("ranks on other hosts") != std::string::npos);
    CHECK(out.find("-> ucx (topology plan: InfiniBand/RoCE HCA(s)") != std::string::npos);
    CHECK(out.find("-> shm (topology plan: same host") != std::string::npos);
  }
}

TEST_CASE("shm processes: COMM_TRANSPORT=shm with ranks on two hosts fails init on every rank with "
          "COMM_ERR_UNAVAILABLE saying why",
          "[shm_process]") {
  TempDir dir;
  const int n = 2, port = free_port();
  auto procs = launch(dir, "init", n, [&](int r) {
    return torchrun_env(r, n, port, 10000, {{"COMM_TRANSPORT", "shm"}, {"COMM_HOST_ID", r == 0 ? "a" : "b"}});
  });
  wait_all(procs, now_ms() + 30000);
  INFO(describe_all(procs));
  for (const auto& p : procs) {
    const InitLine l = init_line(p.output());
    CHECK(l.status == COMM_ERR_UNAVAILABLE);
    CHECK(l.message.find("COMM_TRANSPORT=shm") != std::string::npos);
    CHECK(l.message.find("another host") != std::string::npos);
  }
}

TEST_CASE("shm processes: SIGKILL of a rank during a 64 MiB allreduce over shared memory: every survivor returns "
          "COMM_ERR_REMOTE within COMM_TIMEOUT_MS + 1 s, and /dev/shm holds nothing of the job",
          "[shm_process]") {
  TempDir dir;
  const auto before = shm_names();
  const int n = 3, victim = 1, timeout_ms = 3000;
  const int port = free_port();
  auto procs = launch(dir, "kill", n, [&](int r) { return torchrun_env(r, n, port, timeout_ms, {{"COMM_TRANSPORT", "shm"}}); });
  const double t0 = now_ms();
  bool in_third = false;
  while (!in_third && now_ms() - t0 < 120000) {
    in_third = procs[victim].output().find("ITER 2\n") != std::string::npos;
    if (!in_third) usleep(2000);
  }
  usleep(30000);
  const double killed_at = now_ms();
  kill(procs[victim].pid, SIGKILL);
  wait_all(procs, killed_at + timeout_ms + 1000 + 15000);
  INFO("outputs:\n" << describe_all(procs));
  REQUIRE(in_third);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = procs[r].output();
    INFO("survivor rank " << r);
    CHECK(procs[r].exited_zero());
    const auto end = line_after(out, "END ");
    REQUIRE(end.has_value());
    int status = -1;
    double ended_at = 0;
    std::istringstream(*end) >> status >> ended_at;
    INFO("status " << status << ", returned " << (ended_at - killed_at) << " ms after the kill");
    CHECK(status == COMM_ERR_REMOTE);  // a dead local peer is seen, not waited out
    CHECK(ended_at - killed_at <= timeout_ms + 1000);
    CHECK(ended_at - killed_at > -100);
  }
  const auto left = left_behind(before);
  INFO("left in /dev/shm: " << joined(left));
  CHECK(left.empty());
}
