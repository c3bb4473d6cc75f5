// Idle detection (docs/design/core.md, "Idle detection"), with real processes: 4 ranks connect,
// then one is SIGKILLed (or SIGSTOPped) while the others call nothing. Each survivor's
// comm_get_async_error must report it within a bound far below COMM_TIMEOUT_MS, and its next
// call must fail at once naming the victim. Without the watcher (COMM_HEARTBEAT_MS=0) the
// survivors see nothing until a call of theirs times out.
#include <signal.h>

#include "process_harness.h"

using namespace abi;

namespace {

struct Idle {
  std::vector<Proc> procs;
  double signalled_at = -1;  // steady ms
};

// Starts n ranks of "idle", waits until every rank printed READY, sends `sig` to the victim,
// waits for the survivors, then SIGKILLs the victim (a stopped one too) and reaps it.
Idle run_idle(const TempDir& dir, int n, int victim, int sig, const Env& extra, int timeout_ms) {
  const int port = free_port();
  Idle run;
  run.procs = launch(dir, "idle", n, [&](int r) {
    Env env = extra;
    env.emplace_back("IDLE_VICTIM", std::to_string(victim));
    env.emplace_back("IDLE_WAIT_MS", "40000");  // beyond every bound below: a survivor that never hears fails them
    return torchrun_env(r, n, port, timeout_ms, env);
  });
  const double ready_deadline = now_ms() + 60000;
  for (;;) {
    int ready = 0;
    for (const Proc& p : run.procs) ready += line_after(p.output(), "READY ").has_value() ? 1 : 0;
    if (ready == n || now_ms() > ready_deadline) break;
    usleep(10000);
  }
  usleep(300 * 1000);  // a few heartbeats pass while everyone is alive: none may be taken for a death
  kill(run.procs[static_cast<size_t>(victim)].pid, sig);
  run.signalled_at = now_ms();
  std::vector<Proc> survivors;
  for (int r = 0; r < n; ++r)
    if (r != victim) survivors.push_back(run.procs[static_cast<size_t>(r)]);
  wait_all(survivors, now_ms() + 90000);
  for (int r = 0, k = 0; r < n; ++r)
    if (r != victim) run.procs[static_cast<size_t>(r)] = survivors[static_cast<size_t>(k++)];
  std::vector<Proc> v{run.procs[static_cast<size_t>(victim)]};
  kill(v[0].pid, SIGKILL);
  wait_all(v, now_ms() + 10000);
  run.procs[static_cast<size_t>(victim)] = v[0];
  return run;
}

// Each survivor: an async error of `expected` (its own verdict, or a peer's report of it) within bound_ms of the signal; the next call failed
// within next_ms; its message names the victim.
void check_noticed(const Idle& run, int victim, std::vector<comm_status_t> expected, double bound_ms, long next_ms) {
  for (int r = 0; r < static_cast<int>(run.procs.size()); ++r) {
    if (r == victim) continue;
    const std::string out = run.procs[static_cast<size_t>(r)].output();
    INFO("survivor rank " << r << ":\n" << out);
    int async = -1;
    long long async_at = -1;
    if (auto a = line_after(out, "ASYNC ")) std::istringstream(*a) >> async >> async_at;
    CHECK(std::find(expected.begin(), expected.end(), async) != expected.end());
    CHECK(async_at >= 0);
    CHECK(static_cast<double>(async_at) - run.signalled_at <= bound_ms);
    int next = -1;
    long next_call_ms = -1;
    if (auto x = line_after(out, "NEXT ")) std::istringstream(*x) >> next >> next_call_ms;
    CHECK(next != COMM_OK);
    CHECK(next_call_ms >= 0);
    CHECK(next_call_ms <= next_ms);
    auto msg = line_after(out, "MSG ");
    REQUIRE(msg.has_value());
    CHECK(msg->find("rank " + std::to_string(victim)) != std::string::npos);
  }
}

}  // namespace

// Rank 0 finishes at once, the others stay idle in their own code for idle_ms and then finish:
// none may report rank 0 (it said GOODBYE) or anyone else.
void check_staggered_finish(Env env, const char* idle_ms, int timeout_ms) {
  TempDir dir;
  const int n = 3;
  const int port = free_port();
  auto procs = launch(dir, "idle", n, [&](int r) {
    Env e = env;
    for (const auto& kv : Env{{"COMM_HEARTBEAT_MS", "200"}, {"IDLE_VICTIM", "-1"},
                              {"IDLE_WAIT_MS", r == 0 ? "0" : idle_ms}, {"IDLE_NO_NEXT", "1"}})
      e.push_back(kv);
    return torchrun_env(r, n, port, timeout_ms, e);
  });
  CHECK(wait_all(procs, now_ms() + 60000));
  INFO(describe_all(procs));
  for (int r = 1; r < n; ++r) {
    int async = -1;
    if (auto a = line_after(procs[static_cast<size_t>(r)].output(), "ASYNC ")) std::istringstream(*a) >> async;
    CHECK(async == COMM_OK);
  }
}

TEST_CASE("idle: a SIGKILLed rank is reported by every idle survivor's comm_get_async_error within seconds, and "
          "their next call fails at once naming it (sockets, shared memory)",
          "[idle]") {
  TempDir dir;
  const int n = 4, victim = 2, timeout_ms = 60000;  // far above the bound: the timeout cannot be what ends it
  for (const char* transport : {"socket", "shm"}) {
    INFO("COMM_TRANSPORT=" << transport);
    Idle run = run_idle(dir, n, victim, SIGKILL, {{"COMM_TRANSPORT", transport}, {"COMM_HEARTBEAT_MS", "200"}},
                        timeout_ms);
    INFO(describe_all(run.procs));
    // Two periods to notice, one for a survivor the victim was not connected to to hear it
    // from one that was, and a busy host's margin: still far below the 60 s timeout.
    check_noticed(run, victim, {COMM_ERR_REMOTE}, loaded_host::kSlackMs, loaded_host::kSlackMs);
  }
}

TEST_CASE("idle: a SIGSTOPped rank is reported by its idle socket peers once it was silent for COMM_TIMEOUT_MS "
          "(a timeout, or the report of a peer that timed out first)", "[idle]") {
  TempDir dir;
  const int n = 3, victim = 1, timeout_ms = 2000;
  Idle run = run_idle(dir, n, victim, SIGSTOP, {{"COMM_TRANSPORT", "socket"}, {"COMM_HEARTBEAT_MS", "200"}},
                      timeout_ms);
  INFO(describe_all(run.procs));
  check_noticed(run, victim, {COMM_ERR_TIMEOUT, COMM_ERR_REMOTE}, timeout_ms + loaded_host::kSlackMs, loaded_host::kSlackMs);
}

TEST_CASE("idle: a SIGSTOPped rank is reported by its idle shared-memory peers once its heartbeat counter stood "
          "still for COMM_TIMEOUT_MS", "[idle]") {
  // Its pidfd shows nothing (the process lives): only the heartbeat in memory can.
  TempDir dir;
  const int n = 3, victim = 1, timeout_ms = 2000;
  Idle run = run_idle(dir, n, victim, SIGSTOP, {{"COMM_TRANSPORT", "shm"}, {"COMM_HEARTBEAT_MS", "200"}},
                      timeout_ms);
  INFO(describe_all(run.procs));
  check_noticed(run, victim, {COMM_ERR_TIMEOUT, COMM_ERR_REMOTE}, timeout_ms + loaded_host::kSlackMs, loaded_host::kSlackMs);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    auto msg = line_after(run.procs[static_cast<size_t>(r)].output(), "MSG ");
    REQUIRE(msg.has_value());
    CHECK(msg->find("heartbeat") != std::string::npos);
  }
}

TEST_CASE("idle: ranks that finish at different times, or compute longer than the silence limit, are not taken "
          "for dead or stopped (comm_destroy says goodbye; the watcher beats)", "[idle]") {
  // Rank 0 destroys and exits at once; the others stay idle (in their own code, as ranks that
  // compute) for 6 s, more than twice the silence limit of a 2 s timeout, and must see no
  // async error (nobody is signalled: no victim).
  for (const char* transport : {"socket", "shm"}) {
    INFO("COMM_TRANSPORT=" << transport);
    check_staggered_finish({{"COMM_TRANSPORT", transport}}, "6000", 2000);
  }
}

TEST_CASE("idle over UCX: a SIGKILLed rank is reported by every idle survivor within seconds (UCX's endpoint "
          "failure over tcp, the pid over shared memory alone), and ranks that finish at different times are not "
          "taken for dead (GOODBYE)",
          "[idle_ucx]") {
  // UCX reports a broken endpoint only from ucp_worker_progress: idle, nobody called it.
  for (const char* tls : {"tcp,self", "posix,self"}) {
    INFO("UCX_TLS=" << tls);
    {
      TempDir dir;
      const int n = 3, victim = 1, timeout_ms = 60000;
      Idle run = run_idle(dir, n, victim, SIGKILL,
                          {{"COMM_TRANSPORT", "ucx"}, {"UCX_TLS", tls}, {"COMM_HEARTBEAT_MS", "200"}}, timeout_ms);
      INFO(describe_all(run.procs));
      check_noticed(run, victim, {COMM_ERR_REMOTE}, loaded_host::kSlackMs, loaded_host::kSlackMs);
    }
    check_staggered_finish({{"COMM_TRANSPORT", "ucx"}, {"UCX_TLS", tls}}, "3000", 30000);
  }
}
