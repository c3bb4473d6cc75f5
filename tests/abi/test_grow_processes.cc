// comm_grow in real processes (issue 35, "comm_grow"): 4 ranks, one SIGKILLed; the survivors
// agree, shrink, and admit a joiner (a process started with the job's environment plus
// COMM_JOIN=1, in the dead rank's slot) through comm_grow; an all-reduce on the grown
// communicator (small, and large on comm_mem_alloc and plain buffers) and on its comm_dup is right on all 4, and the communicator it grew from still works. Over sockets
// (COMM_GROW_WAITING polled, and an explicit count), shared memory, the routed transport, and TLS with
// COMM_AUTH_TOKEN; a joiner with other settings is refused. comm_grow(COMM_GROW_WAITING) with nobody
// waiting gives NULL on every member; a joiner that cannot reach the job's store fails, naming the
// fixes; env:// under torchrun's static rendezvous fails at once.
#include <sstream>

#include "process_harness.h"

using namespace abi;

namespace {

struct Triple {
  int status = -100, rank = -1, size = -1;
};

std::optional<Triple> triple(const std::string& out, const std::string& prefix) {
  auto s = line_after(out, prefix);
  if (!s) return std::nullopt;
  Triple t;
  std::istringstream(*s) >> t.status >> t.rank >> t.size;
  return t;
}

// Waits (up to 90 s) until every survivor printed its SHRINK line or ended.
void wait_for_shrink(std::vector<Proc>& procs, int victim) {
  const double deadline = now_ms() + 90000;
  while (now_ms() < deadline) {
    int ready = 0;
    for (int r = 0; r < static_cast<int>(procs.size()); ++r) {
      if (r == victim) continue;
      Proc& p = procs[static_cast<size_t>(r)];
      if (!p.reaped && waitpid(p.pid, &p.wstatus, WNOHANG) == p.pid) p.reaped = true;
      if (p.reaped || p.output().find("SHRINK ") != std::string::npos) ++ready;
    }
    if (ready == static_cast<int>(procs.size()) - 1) return;
    usleep(5000);
  }
}

// bad_joiner_first: a joiner whose settings differ from the job's (another COMM_TIMEOUT_MS) comes
// first: it is refused, naming the difference, and the members admit the right one after it.
void kill_shrink_grow(const std::string& transport, const Env& extra, bool bad_joiner_first = false) {
  TempDir dir;
  const int n = 4, victim = 2, timeout_ms = 20000;  // a SIGKILL is seen at once; a slow start is not a failure
  const int port = free_port();
  auto env_of = [&](int r) {
    // "routed": two "hosts" (COMM_HOST_ID), shared memory inside each and sockets between.
    const bool routed = transport == "routed";
    Env e = torchrun_env(r, n, port, timeout_ms, {{"COMM_TRANSPORT", routed ? "auto" : transport},
                                                  {"GROW_VICTIM", std::to_string(victim)}});
    if (routed) e.emplace_back("COMM_HOST_ID", r < 2 ? "host-a" : "host-b");
    for (const auto& kv : extra) e.push_back(kv);
    return e;
  };
  std::vector<Proc> procs = launch(dir, "member", n, env_of);
  wait_for_shrink(procs, victim);
  // The replacement: the job's environment (the dead rank's slot) plus COMM_JOIN=1.
  Env joiner_env = env_of(victim);
  joiner_env.emplace_back("COMM_JOIN", "1");
  std::string refused;
  if (bad_joiner_first) {
    Env bad = joiner_env;
    for (auto& kv : bad)
      if (kv.first == "COMM_TIMEOUT_MS") kv.second = "19000";  // differs from the job's
    std::vector<Proc> one{spawn_worker("joiner", bad, dir.file("bad-joiner.out"))};
    CHECK(wait_all(one, now_ms() + 60000));
    refused = one[0].output();
  }
  procs.push_back(spawn_worker("joiner", joiner_env, dir.file("joiner.out")));
  const bool ended = wait_all(procs, now_ms() + 90000);
  if (std::getenv("GROW_TEST_SHOW")) std::fprintf(stderr, "%s%s", describe_all(procs).c_str(), refused.c_str());
  INFO(transport << ":\n" << describe_all(procs));
  CHECK(ended);
  CHECK((WIFSIGNALED(procs[victim].wstatus) && WTERMSIG(procs[victim].wstatus) == SIGKILL));
  int expected = 0;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = procs[static_cast<size_t>(r)].output();
    INFO("survivor rank " << r);
    auto s = triple(out, "SHRINK ");
    REQUIRE(s.has_value());
    CHECK(s->status == COMM_OK);
    CHECK(s->size == n - 1);
    auto g = triple(out, "GROW ");
    REQUIRE(g.has_value());
    CHECK(g->status == COMM_OK);
    CHECK(g->rank == expected++);  // members keep their order
    CHECK(g->size == n);
    CHECK(out.find("RESULT bad") == std::string::npos);
    CHECK(line_after(out, "ARENA ").value_or("missing") == "ok");
    CHECK(line_after(out, "DONE ").value_or("missing") == "0");
  }
  if (bad_joiner_first) {
    INFO("the refused joiner:\n" << refused);
    auto b = triple(refused, "INIT ");
    REQUIRE(b.has_value());
    CHECK(b->status == COMM_ERR_INVALID_USAGE);
    CHECK(refused.find("timeout (COMM_TIMEOUT_MS") != std::string::npos);
    CHECK(refused.find("19000") != std::string::npos);
  }
  const std::string out = procs.back().output();
  auto j = triple(out, "INIT ");
  REQUIRE(j.has_value());
  CHECK(j->status == COMM_OK);
  CHECK(j->rank == n - 1);  // joiners come after the members
  CHECK(j->size == n);
  CHECK(line_after(out, "RESULT ").value_or("missing") == "ok");
  CHECK(line_after(out, "ARENA ").value_or("missing") == "ok");  // large calls: grow_worker.c, check_large_allreduce
  CHECK(line_after(out, "DONE ").value_or("missing") == "0");
}

}  // namespace

TEST_CASE("grow processes: 4 ranks over sockets, rank 2 SIGKILLed: the survivors agree, shrink, and a joiner "
          "(COMM_JOIN=1) joins through comm_grow(COMM_GROW_WAITING); the all-reduce on 4 is right", "[grow_process]") {
  kill_shrink_grow("socket", {});
}

TEST_CASE("grow processes: the same with comm_grow(comm, 1) waiting for the joiner", "[grow_process]") {
  kill_shrink_grow("socket", {{"GROW_N", "1"}});
}

TEST_CASE("grow processes: the same over shared memory", "[grow_process]") { kill_shrink_grow("shm", {}); }

TEST_CASE("grow processes: a joiner with other settings (COMM_TIMEOUT_MS) is refused naming the difference; the "
          "members go on and admit the next one", "[grow_process]") {
  kill_shrink_grow("socket", {}, /*bad_joiner_first=*/true);
}

TEST_CASE("grow processes: the same over the routed transport (two hosts by COMM_HOST_ID, the joiner on the second)",
          "[grow_process]") {
  kill_shrink_grow("routed", {});
}

TEST_CASE("grow processes: the same over sockets with COMM_TLS=1 and COMM_AUTH_TOKEN", "[grow_process]") {
  kill_shrink_grow("socket", {{"COMM_TLS", "1"}, {"COMM_AUTH_TOKEN", "grow-test-token"}});
}

TEST_CASE("grow processes: comm_grow(COMM_GROW_WAITING) with nobody waiting gives NULL on every member, and n_join 0 "
          "is refused", "[grow_process]") {
  TempDir dir;
  const int n = 3;
  const int port = free_port();
  Job job = run_job(dir, "waiting", n, [&](int r) { return torchrun_env(r, n, port, 10000); }, 60000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  for (const Proc& p : job.procs) {
    const std::string out = p.output();
    CHECK(line_after(out, "NULLS ").value_or("missing") == "5");
    CHECK(line_after(out, "ZERO ").value_or("missing") == std::to_string(COMM_ERR_INVALID_ARGUMENT));
    CHECK(line_after(out, "RESULT ").value_or("missing") == "ok");
    CHECK(line_after(out, "DONE ").value_or("missing") == "0");
  }
}

TEST_CASE("grow processes: a joiner whose job store is gone (it died with rank 0) fails within its timeout, naming the "
          "fixes", "[grow_process]") {
  TempDir dir;
  const int port = free_port();  // nobody serves it
  Env env = torchrun_env(1, 4, port, 2000, {{"COMM_JOIN", "1"}});
  std::vector<Proc> procs{spawn_worker("joiner", env, dir.file("lost-joiner.out"))};
  CHECK(wait_all(procs, now_ms() + 2000 + loaded_host::kSlackMs + 15000));
  const std::string out = procs[0].output();
  INFO(out);
  auto j = triple(out, "INIT ");
  REQUIRE(j.has_value());
  CHECK(j->status == COMM_ERR_UNAVAILABLE);
  for (const char* fix : {"comm-run --replace-failed", "COMM_STORE_EXTERNAL=1", "file://"}) {
    INFO(fix);
    CHECK(out.find(fix) != std::string::npos);
  }
}

TEST_CASE("grow processes: under torchrun's static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) env:// fails at "
          "once, naming --standalone", "[grow_process]") {
  TempDir dir;
  const int port = free_port();
  Env env = torchrun_env(0, 2, port, 300000, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  std::vector<Proc> procs{spawn_worker("joiner", env, dir.file("agent-store.out"))};  // a plain comm_init
  CHECK(wait_all(procs, now_ms() + loaded_host::kSlackMs + 40000));  // far before the 300 s timeout
  const std::string out = procs[0].output();
  INFO(out);
  auto j = triple(out, "INIT ");
  REQUIRE(j.has_value());
  CHECK(j->status == COMM_ERR_UNAVAILABLE);
  CHECK(out.find("--standalone") != std::string::npos);
}
