// What only real processes show: rendezvous through torchrun's environment (env://), a rank
// killed with SIGKILL, bad launcher variables, ports in use or unreachable, ranks started
// with different settings, and garbage sent to the job's listening ports. The harness
// (process_harness.h) starts rank_worker N times with posix_spawn and judges its
// one-fact-per-line output.
// Run one at a time (is_parallel: false): several of these measure deadlines.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "harness.h"
#include "process_harness.h"

namespace {

using namespace abi;

// Listening TCP ports held by the given processes (from /proc: socket inodes of their fds).
std::set<int> listening_ports(const std::vector<pid_t>& pids) {
  std::map<unsigned long, int> inode_port;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout;
      unsigned long inode = 0;
      in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A") continue;  // LISTEN
      const auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      inode_port[inode] = static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16));
    }
  }
  std::set<int> ports;
  for (pid_t pid : pids) {
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* dir = opendir(fd_dir.c_str());
    if (!dir) continue;
    while (dirent* e = readdir(dir)) {
      char target[256];
      const ssize_t len = readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (len <= 0) continue;
      target[len] = '\0';
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1) {
        auto it = inode_port.find(inode);
        if (it != inode_port.end()) ports.insert(it->second);
      }
    }
    closedir(dir);
  }
  return ports;
}

}  // namespace

TEST_CASE("processes: a cross-section of every collective with 3 and 4 real processes, correct and identical on "
          "every rank",
          "[process]") {
  TempDir dir;
  for (int n : {3, 4}) {
    const int port = free_port();
    Job job = run_job(dir, "collectives", n, [&](int r) { return torchrun_env(r, n, port, 30000); }, 240000);
    INFO(n << " processes:\n" << describe_all(job.procs));
    CHECK(job.ended);
    check_done_and_identical(job.procs, 15, /*every_label_on_rank0=*/true);
  }
}

TEST_CASE("processes: SIGKILL of a rank during a 64 MiB allreduce: every survivor returns COMM_ERR_REMOTE or "
          "COMM_ERR_TIMEOUT within COMM_TIMEOUT_MS",
          "[process]") {
  TempDir dir;
  const int n = 3, victim = 1, timeout_ms = 3000;
  const int port = free_port();
  auto procs = launch(dir, "kill", n, [&](int r) { return torchrun_env(r, n, port, timeout_ms); });
  const Kill kill = kill_in_third_iteration(procs, victim, timeout_ms);
  INFO("outputs:\n" << describe_all(procs));
  REQUIRE(kill.in_third);
  CHECK((WIFSIGNALED(procs[victim].wstatus) && WTERMSIG(procs[victim].wstatus) == SIGKILL));
  check_survivors(procs, victim, kill, timeout_ms, {COMM_ERR_REMOTE, COMM_ERR_TIMEOUT});
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    INFO("survivor rank " << r);
    long destroy_ms = -1;
    int destroy_status = -1;
    if (auto d = line_after(procs[r].output(), "DESTROY ")) std::istringstream(*d) >> destroy_status >> destroy_ms;
    CHECK(destroy_ms >= 0);
    CHECK(destroy_ms <= timeout_ms + loaded_host::kSlackMs);  // bounded by the timeout, not a hang
  }
}

namespace {

// Waits for every rank but the stopped victim, then kills the victim (SIGKILL ends a stopped
// process too) and reaps it. True when the survivors ended by themselves.
bool wait_survivors_then_kill(std::vector<Proc>& procs, int victim, double deadline) {
  std::vector<Proc> survivors;
  for (int r = 0; r < static_cast<int>(procs.size()); ++r)
    if (r != victim) survivors.push_back(procs[r]);
  const bool ended = wait_all(survivors, deadline);
  for (int r = 0, k = 0; r < static_cast<int>(procs.size()); ++r)
    if (r != victim) procs[r] = survivors[k++];
  std::vector<Proc> stopped{procs[victim]};
  kill(stopped[0].pid, SIGKILL);
  wait_all(stopped, now_ms() + 10000);
  procs[victim] = stopped[0];
  return ended;
}

// What a shell command printed (stdout and stderr).
std::string command_output(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Every survivor failed, and its message names `victim` as the stalled rank and no other.
void check_names_stalled(const std::vector<Proc>& procs, int victim) {
  for (int r = 0; r < static_cast<int>(procs.size()); ++r) {
    if (r == victim) continue;
    INFO("survivor rank " << r);
    const std::string msg = line_after(procs[r].output(), "MSG ").value_or("");
    CHECK(end_line(procs[r].output()).status != COMM_OK);
    INFO("message: " << msg);
    CHECK(msg.rfind("rank " + std::to_string(victim) + " is stalled: ", 0) == 0);
    for (int other = 0; other < static_cast<int>(procs.size()); ++other)
      if (other != victim) CHECK(msg.find("rank " + std::to_string(other) + " is stalled") == std::string::npos);
  }
}

}  // namespace

// Issue 15's first defect: the first rank to time out named the peer it waited on, and every
// rank failed with that, also when that peer was healthy and itself waiting on the stopped rank.
TEST_CASE("processes: a rank stopped (SIGSTOP) at the end of a chain of waits is the rank every survivor names, "
          "also when the first rank to time out waits on a healthy one",
          "[process]") {
  struct Case {
    const char* transport;
    int victim;
  };
  // Victim 0 also stops the job store it serves: that silence names it.
  for (const Case& k : {Case{"socket", 3}, Case{"shm", 1}, Case{"socket", 0}}) {
    TempDir dir;
    const int n = 4, timeout_ms = 2000;
    const int port = free_port();
    INFO("COMM_TRANSPORT=" << k.transport << ", victim rank " << k.victim);
    auto procs = launch(dir, "stall", n, [&](int r) {
      return torchrun_env(r, n, port, timeout_ms,
                          {{"COMM_TRANSPORT", k.transport}, {"STALL_VICTIM", std::to_string(k.victim)}});
    });
    const bool ended = wait_survivors_then_kill(procs, k.victim, now_ms() + 60000);
    INFO("outputs:\n" << describe_all(procs));
    CHECK(ended);
    check_names_stalled(procs, k.victim);
  }
}

// Issue 35: the survivors of a SIGSTOP lost the timeout plus the trace's grace (2 s at a 10 s
// timeout), waiting for the stopped rank to report. A rank that has heard nothing from it, not
// even a heartbeat, for 3 heartbeats is not waited for (libcomm/src/blame.cc); the verdict says so.
// Over shared memory the beat counter each rank's watcher bumps in its control lines stands in
// for the heartbeat (looked at in a wait's slow path).
TEST_CASE("processes: the hang trace does not wait for a stopped rank its heartbeats already show silent", "[process]") {
  for (const char* transport : {"socket", "shm"}) {
    TempDir dir;
    const int n = 4, victim = 3, timeout_ms = 6000;
    const int port = free_port();
    INFO("COMM_TRANSPORT=" << transport);
    auto procs = launch(dir, "stall", n, [&](int r) {
      return torchrun_env(r, n, port, timeout_ms,
                          {{"COMM_TRANSPORT", transport}, {"COMM_SOCKET_EAGER", "1"},  // every pair hears the others
                           {"COMM_HEARTBEAT_MS", "300"}, {"STALL_VICTIM", "3"}});
    });
    const bool ended = wait_survivors_then_kill(procs, victim, now_ms() + 90000);
    INFO("outputs:\n" << describe_all(procs));
    CHECK(ended);
    check_names_stalled(procs, victim);
    int unheard = 0;  // a rank that reached it in its trace; the others may learn it from a report
    for (int r = 0; r < victim; ++r)
      unheard += line_after(procs[r].output(), "MSG ").value_or("").find(
                     "rank 3 sent this rank nothing, not even a heartbeat, for ") != std::string::npos;
    CHECK(unheard >= 1);
  }
}

// A wait that begins after its peer fell silent (a rank behind the others: the 4x2 chaos run whose
// last survivor began waiting on the stopped rank 10 s after the stop, and ran a timeout of its
// own). Rank 0 waits on the stopped rank 3 from 4 s after the stop, the others wait on rank 0 from
// 3 s: its wait must end on the silence (6 s from the stop), not at its own timeout (6 s from its
// start), before theirs (6 s from theirs) would end it with their report. Over sockets (heartbeat
// frames) and over shared memory, whose request waits judge the beat counter too, counted from
// what idle detection saw before the wait began (transports/shm/shm_transport.cc, note_beats).
TEST_CASE("processes: a wait that begins after its peer fell silent ends on the silence, not its own timeout",
          "[process]") {
  struct Case {
    const char* transport;
    const char* silence;  // how the transport words the silence
  };
  for (const Case& k : {Case{"socket", "rank 3 sent nothing, not even a heartbeat (every 300 ms, COMM_HEARTBEAT_MS), for "},
                        Case{"shm", "rank 3 did not bump its heartbeat in shared memory (every 300 ms, COMM_HEARTBEAT_MS) for "}}) {
    INFO("COMM_TRANSPORT=" << k.transport);
    TempDir dir;
    const int n = 4, victim = 3, timeout_ms = 6000;  // margins of ~3 s for a busy host
    const int port = free_port();
    auto procs = launch(dir, "stall", n, [&](int r) {
      return torchrun_env(r, n, port, timeout_ms,
                          {{"COMM_TRANSPORT", k.transport}, {"COMM_SOCKET_EAGER", "1"}, {"COMM_HEARTBEAT_MS", "300"},
                           {"STALL_VICTIM", "3"}, {"STALL_LONE_MS", "4000"}});
    });
    const bool ended = wait_survivors_then_kill(procs, victim, now_ms() + 90000);
    INFO("outputs:\n" << describe_all(procs));
    CHECK(ended);
    const std::string msg = line_after(procs[0].output(), "MSG ").value_or("");
    INFO("rank 0's message: " << msg);
    CHECK(msg.find(k.silence) != std::string::npos);
    CHECK(msg.find("while rank 0 waited on it in ") != std::string::npos);
  }
}

TEST_CASE("processes: SIGSTOP of a rank during a 64 MiB ring allreduce of 4 ranks: every survivor's error names the "
          "stopped rank (trials over sockets and shared memory)",
          "[process]") {
  struct Case {
    const char* transport;
    int victim;
  };
  for (const Case& k : {Case{"socket", 2}, Case{"shm", 3}, Case{"socket", 1}}) {
    TempDir dir;
    const int n = 4, timeout_ms = 2000;
    const int port = free_port();
    INFO("COMM_TRANSPORT=" << k.transport << ", victim rank " << k.victim);
    auto procs = launch(dir, "kill", n, [&](int r) {
      return torchrun_env(r, n, port, timeout_ms,
                          {{"COMM_TRANSPORT", k.transport},
                           {"COMM_ALGO", "ring"},
                           {"COMM_FLIGHT_RECORDER_FILE", dir.file("flight-%r.json")}});
    });
    const bool in_third = signal_in_third_iteration(procs, k.victim, SIGSTOP).in_third;
    const bool ended = wait_survivors_then_kill(procs, k.victim, now_ms() + 60000);
    INFO("outputs:\n" << describe_all(procs));
    REQUIRE(in_third);
    CHECK(ended);
    check_names_stalled(procs, k.victim);
    // Every survivor's flight recorder names it too, and comm-trace, merging them, says so.
    std::string dumps;
    for (int r = 0; r < n; ++r) {
      if (r == k.victim) continue;
      std::ifstream f(dir.file("flight-" + std::to_string(r) + ".json"));
      std::stringstream text;
      text << f.rdbuf();
      INFO("rank " << r << "'s flight recorder: " << text.str());
      CHECK(text.str().find("\"error\": \"rank " + std::to_string(k.victim) + " is stalled: ") != std::string::npos);
      CHECK(text.str().find("\"state\": \"failed\"") != std::string::npos);
      dumps += " " + dir.file("flight-" + std::to_string(r) + ".json");
    }
    const std::string trace = command_output(std::string("python3 ") + ABI_SOURCE_ROOT + "/tools/comm-trace/comm-trace" + dumps);
    INFO("comm-trace:\n" << trace);
    CHECK(trace.find("rank " + std::to_string(k.victim) + " wrote no dump and did not finish allreduce #") !=
          std::string::npos);
  }
}

// Several ranks per host (COMM_HOST_ID: 3 hosts of 2), so the routed transport and the hierarchical
// all-reduce, whose steps within a host wait on the shared-memory part directly (local()). The
// stopped rank's host neighbour times out first there; its wait must reach the hang trace. It did
// not (the routed transport kept only its own record): the neighbour published no wait, and the
// ranks waiting on it blamed it, a healthy rank, after the trace's grace (the 4x2 chaos runs).
TEST_CASE("processes: SIGSTOP of a rank with several ranks per host (routed transport, hierarchical allreduce): every "
          "survivor's error names the stopped rank, not its host neighbour that timed out first",
          "[process]") {
  TempDir dir;
  const int n = 6, victim = 3, timeout_ms = 3000;
  const int port = free_port();
  auto procs = launch(dir, "kill", n, [&](int r) {
    // Heartbeats every 250 ms: the stopped rank's neighbour waits on it in shared memory for the
    // whole timeout, and its socket peers' hang trace takes a rank silent for 3 heartbeats for the
    // stalled one. It hears the neighbour only because the socket part beats from the watcher while
    // the rank waits elsewhere (transports/socket/heartbeat.cc, beat()).
    return torchrun_env(r, n, port, timeout_ms,
                        {{"COMM_HOST_ID", "host" + std::to_string(r / 2)}, {"COMM_HEARTBEAT_MS", "250"}});
  });
  const bool in_third = signal_in_third_iteration(procs, victim, SIGSTOP).in_third;
  const bool ended = wait_survivors_then_kill(procs, victim, now_ms() + 60000);
  INFO("outputs:\n" << describe_all(procs));
  REQUIRE(in_third);
  CHECK(ended);
  check_names_stalled(procs, victim);
}

TEST_CASE("processes: malformed launcher variables are COMM_ERR_INVALID_ARGUMENT naming the variable", "[process]") {
  TempDir dir;
  struct Bad {
    const char* name;
    Env env;
    std::vector<std::string> must;  // case-sensitive: variable names are
  };
  const std::vector<Bad> bads = {
      {"RANK=abc", {{"RANK", "abc"}}, {"RANK", "abc"}},
      {"WORLD_SIZE=0", {{"WORLD_SIZE", "0"}, {"RANK", "0"}}, {"WORLD_SIZE"}},
      {"RANK=2 with WORLD_SIZE=2", {{"RANK", "2"}}, {"RANK", "2"}},
      {"RANK=-1", {{"RANK", "-1"}}, {"RANK", "-1"}},
      {"WORLD_SIZE=two", {{"WORLD_SIZE", "two"}}, {"WORLD_SIZE", "two"}},
      {"MASTER_PORT=notaport", {{"MASTER_PORT", "notaport"}}, {"MASTER_PORT", "notaport"}},
      {"MASTER_PORT=70000", {{"MASTER_PORT", "70000"}}, {"MASTER_PORT", "70000"}},
      {"COMM_TIMEOUT_MS=soon", {{"COMM_TIMEOUT_MS", "soon"}}, {"COMM_TIMEOUT_MS", "soon"}},
  };
  int i = 0;
  for (const Bad& bad : bads) {
    // A timeout far above what a busy host adds: a mistake found only by waiting would show.
    const Env env = torchrun_env(1, 2, free_port(), 3 * loaded_host::kSlackMs, bad.env);
    const Single s = run_single(dir, "bad" + std::to_string(i++), env, loaded_host::kSlackMs + 15000);
    INFO(bad.name << ": " << s.proc.how() << "\n" << s.proc.output());
    CHECK(s.proc.exited_zero());
    CHECK(s.init.status == COMM_ERR_INVALID_ARGUMENT);
    CHECK(s.init.ms < loaded_host::kSlackMs);  // found locally, before any waiting
    for (const auto& w : bad.must) {
      INFO("the message should contain \"" << w << "\"");
      CHECK(s.init.message.find(w) != std::string::npos);
    }
  }
}

TEST_CASE("processes: MASTER_PORT already in use: rank 0's init is COMM_ERR_SYSTEM naming the port", "[process]") {
  TempDir dir;
  // Hold a listening socket on every address, so rank 0's store cannot bind.
  int port = -1;
  const int fd = bound_socket(INADDR_ANY, &port);
  REQUIRE(fd >= 0);
  REQUIRE(listen(fd, 4) == 0);
  const Single s = run_single(dir, "port-in-use", torchrun_env(0, 2, port, 3 * loaded_host::kSlackMs),
                              loaded_host::kSlackMs + 15000);
  close(fd);
  INFO("port " << port << ": " << s.proc.how() << "\n" << s.proc.output());
  CHECK(s.proc.exited_zero());
  CHECK(s.init.status == COMM_ERR_SYSTEM);
  CHECK(s.init.message.find(std::to_string(port)) != std::string::npos);
  CHECK(s.init.ms < loaded_host::kSlackMs);  // at once, not after the timeout
}

TEST_CASE("processes: an unreachable MASTER_ADDR:MASTER_PORT ends in COMM_ERR_TIMEOUT after about the timeout, never "
          "a hang",
          "[process]") {
  TempDir dir;
  const int port = free_port();  // nobody listens there
  const Single s = run_single(dir, "unreachable", torchrun_env(1, 2, port, 1000), 1000 + loaded_host::kSlackMs + 15000);
  INFO("port " << port << ": " << s.proc.how() << "\n" << s.proc.output());
  CHECK(s.proc.exited_zero());
  CHECK(s.init.status == COMM_ERR_TIMEOUT);
  CHECK(s.init.ms >= 900);
  CHECK(s.init.ms <= 1000 + loaded_host::kSlackMs);  // the timeout ended it, not a hang
  CHECK(s.init.message.find(std::to_string(port)) != std::string::npos);
}

TEST_CASE("processes: ranks started with different COMM_TRANSPORT or COMM_TIMEOUT_MS fail init on every rank, "
          "naming the difference",
          "[process]") {
  TempDir dir;
  struct Disagreement {
    const char* name;
    std::function<Env(int r, int port)> env;
    int max_timeout_ms;
    std::vector<std::string> words;  // case-insensitive
  };
  const std::vector<Disagreement> cases = {
      {"COMM_TRANSPORT socket vs auto",
       [](int r, int port) { return torchrun_env(r, 2, port, 3000, {{"COMM_TRANSPORT", r ? "auto" : "socket"}}); },
       3000,
       {"transport", "socket", "auto"}},
      {"COMM_TIMEOUT_MS 3000 vs 4000",
       [](int r, int port) { return torchrun_env(r, 2, port, r ? 4000 : 3000); },
       4000,
       {"timeout", "3000", "4000"}},
  };
  for (const auto& c : cases) {
    const int port = free_port();
    auto procs = launch(dir, "init", 2, [&](int r) { return c.env(r, port); });
    wait_all(procs, now_ms() + c.max_timeout_ms + loaded_host::kSlackMs + 15000);
    INFO(c.name << ":\n" << describe_all(procs));
    for (int r = 0; r < 2; ++r) {
      const InitLine l = init_line(procs[r].output());
      INFO("rank " << r);
      CHECK(procs[r].exited_zero());
      CHECK(l.present);
      CHECK(l.status != COMM_OK);
      CHECK(l.ms < c.max_timeout_ms + loaded_host::kSlackMs);  // within the timeout, not a hang
      for (const auto& w : c.words) {
        INFO("the message should contain \"" << w << "\"");
        CHECK(icontains(l.message, w));
      }
    }
  }
}

TEST_CASE("processes: random bytes sent to the store port and every listening port of the job: the job completes",
          "[process]") {
  TempDir dir;
  const int n = 3;
  const int port = free_port();
  auto procs = launch(dir, "garbage", n, [&](int r) { return torchrun_env(r, n, port, 20000); });
  std::vector<pid_t> pids;
  for (const Proc& p : procs) pids.push_back(p.pid);
  std::atomic<bool> stop{false};
  std::atomic<int> connections{0};
  std::set<int> targets_seen;
  std::thread sprayer([&] {
    std::mt19937_64 rng(12345);
    std::vector<int> held;  // some connections stay open, idle, holding garbage
    std::vector<unsigned char> junk(65536);
    std::set<int> targets = {port};
    double last_scan = 0;
    while (!stop) {
      if (now_ms() - last_scan > 200) {
        for (int p : listening_ports(pids)) targets.insert(p);
        last_scan = now_ms();
      }
      for (int target : targets) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(target));
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
          close(fd);
          continue;
        }
        ++connections;
        const int kind = static_cast<int>(rng() % 4);
        const size_t len = 1 + rng() % junk.size();
        for (size_t i = 0; i < len; ++i) {
          // Random, all 0xff (huge lengths), all zero, or a repeating small word.
          junk[i] = kind == 0 ? static_cast<unsigned char>(rng()) : kind == 1 ? 0xff : kind == 2 ? 0 : (i % 4 ? 0 : 7);
        }
        send(fd, junk.data(), len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rng() % 8 == 0 && held.size() < 8) {
          held.push_back(fd);
        } else {
          close(fd);
        }
      }
      usleep(5000);
    }
    for (int fd : held) close(fd);
    targets_seen = targets;
  });
  const bool ended = wait_all(procs, now_ms() + 120000);
  stop = true;
  sprayer.join();
  std::string ports;
  for (int p : targets_seen) ports += std::to_string(p) + " ";
  INFO("garbage connections: " << connections << " to ports " << ports << "(store port " << port << ")\n"
                               << describe_all(procs));
  CHECK(ended);
  // The socket transport may close its listener once the mesh is up: then the store port is
  // the only one the job listens on, and gets all the garbage.
  CHECK(connections > 10);
  for (int r = 0; r < n; ++r) {
    const std::string out = procs[r].output();
    INFO("rank " << r);
    CHECK(procs[r].exited_zero());
    CHECK(line_after(out, "DONE ").value_or("missing") == "0");
  }
}
