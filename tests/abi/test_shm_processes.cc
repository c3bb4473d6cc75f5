// Shared memory between real processes (issue 3): comm_mem_alloc buffers read in place across
// processes, two "hosts" of two ranks each (COMM_HOST_ID) through the hierarchical all-reduce,
// COMM_TRANSPORT=shm refused across hosts, and a rank killed mid-collective: the survivors
// get COMM_ERR_REMOTE within the timeout and /dev/shm holds nothing of the job afterwards.
// Run one at a time (is_parallel: false): they measure deadlines.
#include <dirent.h>

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

// Names that appeared since `before` and are still there once any other job had time to finish
// starting up: another job's segments live only while it starts up, which on a busy host (CI
// beside a process-spawning job) can take longer than the 1 s this used to allow; a segment the
// test's own job left, after that job ended, never goes. So each name is watched until it goes,
// up to a busy host's margin.
std::set<std::string> left_behind(const std::set<std::string>& before) {
  std::set<std::string> left;
  for (const auto& n : shm_names())
    if (!before.count(n)) left.insert(n);
  const double deadline = now_ms() + loaded_host::kSlackMs;
  while (!left.empty() && now_ms() < deadline) {
    usleep(100 * 1000);
    const std::set<std::string> later = shm_names();
    for (auto it = left.begin(); it != left.end();) it = later.count(*it) ? std::next(it) : left.erase(it);
  }
  return left;
}

std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : " ") + n;
  return s;
}

// Four ranks of "collectives" as two hosts of two (COMM_HOST_ID), with `extra` settings: every
// collective correct, identical on every rank, within four minutes.
Job two_hosts_of_two(const TempDir& dir, const Env& extra) {
  const int n = 4, port = free_port();
  Job job = run_job(dir, "collectives", n, [&](int r) {
    Env env = extra;
    env.emplace_back("COMM_HOST_ID", r < 2 ? "host-a" : "host-b");
    return torchrun_env(r, n, port, 30000, env);
  }, 240000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  check_done_and_identical(job.procs, 15, /*every_label_on_rank0=*/false);
  return job;
}

}  // namespace

TEST_CASE("shm processes: comm_mem_alloc buffers on the world, a dup and a split, read in place across processes",
          "[shm_process]") {
  TempDir dir;
  const auto before = shm_names();
  const int n = 3, port = free_port();
  Job job = run_job(dir, "shm", n, [&](int r) {
    return torchrun_env(r, n, port, 30000, {{"COMM_TRANSPORT", "shm"}, {"COMM_DEBUG", "INFO"}});
  }, 240000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  check_done_and_identical(job.procs, 20, /*every_label_on_rank0=*/false);
  check_outputs_contain(job.procs, {"transport shm"});
  const auto left = left_behind(before);
  INFO("left in /dev/shm: " << joined(left));
  CHECK(left.empty());
}

TEST_CASE("shm processes: 2 hosts x 2 ranks (COMM_HOST_ID): every collective correct and identical, large "
          "all-reduces hierarchical (shm inside a host, sockets between)",
          "[shm_process]") {
  TempDir dir;
  const Job job = two_hosts_of_two(dir, {{"COMM_DEBUG", "TRACE"}, {"COMM_DEBUG_SUBSYS", "ALG,INIT"}});
  INFO(describe_all(job.procs));
  check_outputs_contain(job.procs, {"transport shm+socket", ": hierarchical"});
}

TEST_CASE("ucx processes: 2 hosts x 2 ranks on InfiniBand hosts (COMM_TOPO_XML): the plan picks shared memory "
          "inside a host and UCX between hosts, logs why, and every collective is correct and identical",
          "[ucx_process]") {
  TempDir dir;
  const std::string topo = std::string(ABI_SOURCE_ROOT) + "/tests/fixtures/nccl-topo/ndv4-topo.xml";
  const Job job = two_hosts_of_two(dir, {{"COMM_TOPO_XML", topo}, {"COMM_DEBUG", "INFO"},
                                         {"COMM_DEBUG_SUBSYS", "NET,INIT"}, {"UCX_TLS", "tcp,self"}});
  INFO(describe_all(job.procs));
  check_outputs_contain(job.procs, {"transport shm+ucx", "ranks on other hosts",
                                     "-> ucx (topology plan: InfiniBand/RoCE HCA(s)", "-> shm (topology plan: same host"});
}

TEST_CASE("shm processes: 2 hosts x 2 ranks on InfiniBand hosts with UCX and libibverbs unloadable "
          "(COMM_UCX_LIBRARY, COMM_IBVERBS_LIBRARY=/nonexistent): libcomm still loads, the plan falls back to sockets "
          "between hosts and INFO says why",
          "[shm_process]") {
  TempDir dir;
  const std::string topo = std::string(ABI_SOURCE_ROOT) + "/tests/fixtures/nccl-topo/ndv4-topo.xml";
  const Job job = two_hosts_of_two(dir, {{"COMM_TOPO_XML", topo}, {"COMM_UCX_LIBRARY", "/nonexistent/libucp.so.0"},
                                         {"COMM_IBVERBS_LIBRARY", "/nonexistent/libibverbs.so.1"},
                                         {"COMM_DEBUG", "INFO"}, {"COMM_DEBUG_SUBSYS", "NET,INIT"}});
  INFO(describe_all(job.procs));
  check_outputs_contain(job.procs, {"transport shm+socket",
                                     "UCX library not loadable: dlopen(/nonexistent/libucp.so.0) (COMM_UCX_LIBRARY) "
                                     "failed",
                                     "the UCX transport is off, hosts talk over sockets",
                                     "-> socket (topology plan: InfiniBand/RoCE HCA(s)", "UCX is not available here"});
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
  const Kill kill = kill_in_third_iteration(procs, victim, timeout_ms);
  INFO("outputs:\n" << describe_all(procs));
  REQUIRE(kill.in_third);
  check_survivors(procs, victim, kill, timeout_ms, {COMM_ERR_REMOTE});  // a dead local peer is seen, not waited out
  const auto left = left_behind(before);
  INFO("left in /dev/shm: " << joined(left));
  CHECK(left.empty());
}
