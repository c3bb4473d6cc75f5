// Real processes for the ABI tests: rank_worker started N times with posix_spawn and
// torchrun's environment, each writing one fact per line to its own file, judged afterwards.
// Every process test spawns, waits, kills and reads its ranks through this file alone.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

extern char** environ;

#ifndef ABI_RANK_WORKER
#define ABI_RANK_WORKER "rank_worker"
#endif

namespace abi {

using Env = std::vector<std::pair<std::string, std::string>>;

inline std::string worker_path() {
  const char* p = std::getenv("ABI_RANK_WORKER");
  return p && *p ? p : ABI_RANK_WORKER;
}

// A scratch directory for the ranks' output, removed with the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/abi-processes-XXXXXX";
    const char* d = mkdtemp(tmpl);
    path_ = d ? d : "/tmp";
  }
  ~TempDir() {
    if (path_ == "/tmp") return;
    if (DIR* dir = opendir(path_.c_str())) {
      while (dirent* e = readdir(dir)) {
        if (e->d_name[0] != '.') unlink((path_ + "/" + e->d_name).c_str());
      }
      closedir(dir);
    }
    rmdir(path_.c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A TCP socket bound to `address` (host order, e.g. INADDR_LOOPBACK) on a port the kernel
// picks; *port is that port. -1 on failure.
inline int bound_socket(in_addr_t address, int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(address);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

inline int free_port() {
  int port = -1;
  const int fd = bound_socket(INADDR_LOOPBACK, &port);
  if (fd >= 0) close(fd);
  return port;
}

// Our environment without anything a launcher or libcomm would read, so only what a test
// sets reaches the ranks (COMM_DEBUG stays: it only changes logging).
inline std::vector<std::string> clean_environment() {
  static const char* const drop[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
                                     "MASTER_ADDR=", "MASTER_PORT=", "TORCHELASTIC_", "OMPI_", "PMI", "SLURM_",
                                     "NCCL_", "UCX_"};
  std::vector<std::string> env;
  const bool keep_ucx = std::getenv("ABI_TRANSPORT") != nullptr;  // e.g. UCX_TLS for ABI_TRANSPORT=ucx
  for (char** e = environ; *e; ++e) {
    const std::string s(*e);
    bool keep = true;
    for (const char* d : drop) keep = keep && (s.rfind(d, 0) != 0 || (keep_ucx && s.rfind("UCX_", 0) == 0));
    if (s.rfind("COMM_", 0) == 0 && s.rfind("COMM_DEBUG", 0) != 0) keep = false;
    if (keep) env.push_back(s);
  }
  return env;
}

struct Proc {
  pid_t pid = -1;
  std::string out_path;
  int wstatus = 0;
  bool reaped = false;
  bool killed_by_harness = false;
  std::string output() const {
    std::ifstream f(out_path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  bool exited_zero() const { return reaped && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0; }
  std::string how() const {
    if (!reaped) return "still running";
    if (killed_by_harness) return "killed by the harness at its deadline";
    if (WIFEXITED(wstatus)) return "exit " + std::to_string(WEXITSTATUS(wstatus));
    if (WIFSIGNALED(wstatus)) return "signal " + std::to_string(WTERMSIG(wstatus));
    return "?";
  }
};

inline Proc spawn_worker(const std::string& mode, const Env& env, const std::string& out_path) {
  Proc p;
  p.out_path = out_path;
  std::vector<std::string> envs = clean_environment();
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string path = worker_path();
  std::string m = mode;
  char* argv[] = {path.data(), m.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (posix_spawn(&p.pid, path.c_str(), &fa, nullptr, argv, envp.data()) != 0) p.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

// torchrun's variables for rank r of n, then the test's overrides (same name: override wins).
inline Env torchrun_env(int r, int n, int port, int timeout_ms, const Env& extra = {}) {
  Env env = {{"RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(n)},
             {"LOCAL_RANK", std::to_string(r)},
             {"LOCAL_WORLD_SIZE", std::to_string(n)},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)},
             {"COMM_TIMEOUT_MS", std::to_string(timeout_ms)}};
  // ABI_TRANSPORT runs the same process tests over another transport (COMM_TRANSPORT); a test
  // that sets COMM_TRANSPORT itself keeps its own.
  if (const char* t = std::getenv("ABI_TRANSPORT")) env.emplace_back("COMM_TRANSPORT", t);
  // ABI_TLS=1: the same with COMM_TLS=1 (its key from the COMM_AUTH_TOKEN set here), so failures
  // are checked to read the same over TLS (issue 28).
  if (std::getenv("ABI_TLS") != nullptr) {
    env.emplace_back("COMM_TLS", "1");
    env.emplace_back("COMM_AUTH_TOKEN", "abi-tls-token");
  }
  for (const auto& [k, v] : extra) {
    bool replaced = false;
    for (auto& e : env) {
      if (e.first == k) {
        e.second = v;
        replaced = true;
      }
    }
    if (!replaced) env.emplace_back(k, v);
  }
  return env;
}

// Waits for every process until deadline (steady ms); kills and reaps those still running.
// Returns true when all ended by themselves.
inline bool wait_all(std::vector<Proc>& procs, double deadline) {
  for (;;) {
    bool all = true;
    for (Proc& p : procs) {
      if (p.reaped || p.pid < 0) continue;
      if (waitpid(p.pid, &p.wstatus, WNOHANG) == p.pid) {
        p.reaped = true;
      } else {
        all = false;
      }
    }
    if (all) return true;
    if (now_ms() > deadline) break;
    usleep(5000);
  }
  for (Proc& p : procs) {
    if (p.reaped || p.pid < 0) continue;
    kill(p.pid, SIGKILL);
    waitpid(p.pid, &p.wstatus, 0);
    p.reaped = true;
    p.killed_by_harness = true;
  }
  return false;
}

// Starts n ranks and lets them call comm_init together: each says STARTED and waits for a gate
// file (rank_worker.cc, ABI_START_GATE) that is made once every rank has said it (or ended), or
// after 120 s. On a busy host starting a process (exec, the dynamic loader) can take seconds,
// and the short COMM_TIMEOUT_MS these tests use to see a failure quickly would otherwise also
// bound the wait for the last rank to start: init then failed before the test began.
inline std::vector<Proc> launch(const TempDir& dir, const std::string& mode, int n,
                         const std::function<Env(int rank)>& env_of) {
  static int launches = 0;
  const std::string gate = dir.file(mode + "-start-gate-" + std::to_string(++launches));
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    Env env = env_of(r);
    env.emplace_back("ABI_START_GATE", gate);
    procs.push_back(spawn_worker(mode, env, dir.file(mode + "-rank" + std::to_string(r) + ".out")));
  }
  const double deadline = now_ms() + 120000;
  for (;;) {
    int started = 0;
    for (Proc& p : procs) {
      if (!p.reaped && p.pid >= 0 && waitpid(p.pid, &p.wstatus, WNOHANG) == p.pid) p.reaped = true;
      if (p.reaped || p.pid < 0 || p.output().find("STARTED\n") != std::string::npos) ++started;
    }
    if (started == n || now_ms() > deadline) break;
    usleep(2000);
  }
  std::ofstream(gate).put('\n');
  return procs;
}

// The rest of the first line that starts with prefix.
inline std::optional<std::string> line_after(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return std::nullopt;
}

struct InitLine {
  bool present = false;
  int status = -1;
  long ms = -1;
  std::string message;
};
inline InitLine init_line(const std::string& out) {
  InitLine l;
  if (auto s = line_after(out, "INIT ")) {
    l.present = true;
    std::istringstream(*s) >> l.status >> l.ms;
  }
  l.message = line_after(out, "MSG ").value_or("");
  return l;
}

inline std::string describe_all(const std::vector<Proc>& procs) {
  std::string s;
  for (size_t r = 0; r < procs.size(); ++r) {
    std::string out = procs[r].output();
    if (out.size() > 4000) out = out.substr(0, 2000) + "\n...\n" + out.substr(out.size() - 2000);
    s += "--- rank " + std::to_string(r) + " (" + procs[r].how() + "):\n" + out;
  }
  return s;
}

// One process's init with the given environment; the test judges the INIT/MSG lines.
struct Single {
  Proc proc;
  InitLine init;
};
inline Single run_single(const TempDir& dir, const std::string& name, const Env& env, double limit_ms) {
  Single s;
  s.proc = spawn_worker("init", env, dir.file(name + ".out"));
  std::vector<Proc> procs{s.proc};
  wait_all(procs, now_ms() + limit_ms);
  s.proc = procs[0];
  s.init = init_line(s.proc.output());
  return s;
}

// A job: n ranks of `mode` started at once, waited on until limit_ms from now (stragglers
// are killed; `ended` says whether none was).
struct Job {
  std::vector<Proc> procs;
  bool ended = false;
};
inline Job run_job(const TempDir& dir, const std::string& mode, int n, const std::function<Env(int rank)>& env_of,
                   double limit_ms) {
  Job job;
  job.procs = launch(dir, mode, n, env_of);
  job.ended = wait_all(job.procs, now_ms() + limit_ms);
  return job;
}

// Every rank finished cleanly (DONE 0, no FAIL line), printed at least min_hashes HASH lines,
// and every HASH line matches rank 0's of the same label. With every_label_on_rank0 a label
// rank 0 did not print is a mismatch too (all ranks run the same calls).
inline void check_done_and_identical(const std::vector<Proc>& procs, int min_hashes, bool every_label_on_rank0) {
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
      } else if (every_label_on_rank0 || rank0.count(label)) {
        INFO(label);
        CHECK(rank0[label] == hash);
      }
    }
    CHECK(hashes >= min_hashes);
  }
}

// Every rank's output contains each of `words` (what its log must show).
inline void check_outputs_contain(const std::vector<Proc>& procs, const std::vector<std::string>& words) {
  for (size_t r = 0; r < procs.size(); ++r) {
    const std::string out = procs[r].output();
    INFO("rank " << r);
    for (const auto& w : words) {
      INFO("the output should contain \"" << w << "\"");
      CHECK(out.find(w) != std::string::npos);
    }
  }
}

// The "kill" mode's victim, SIGKILLed inside its third all-reduce (the first two show the job
// is up and moving); then every rank is waited on until timeout_ms + a busy host's margin after
// the kill, plus slack for the survivors to report.
struct Kill {
  bool in_third = false;  // the victim reached its third iteration
  double killed_at = 0;   // now_ms() of the kill
};
// Sends `sig` to `victim` 30 ms into its third iteration (the "kill" worker's "ITER 2"), or after
// two minutes without it; k.in_third says which.
inline Kill signal_in_third_iteration(std::vector<Proc>& procs, int victim, int sig) {
  Kill k;
  const double t0 = now_ms();
  while (!k.in_third && now_ms() - t0 < 120000) {
    k.in_third = procs[victim].output().find("ITER 2\n") != std::string::npos;
    if (!k.in_third) usleep(2000);
  }
  usleep(30000);
  k.killed_at = now_ms();
  kill(procs[victim].pid, sig);
  return k;
}

inline Kill kill_in_third_iteration(std::vector<Proc>& procs, int victim, int timeout_ms) {
  Kill k = signal_in_third_iteration(procs, victim, SIGKILL);
  wait_all(procs, k.killed_at + timeout_ms + loaded_host::kSlackMs + 15000);
  return k;
}

// A survivor's "END status ended_at call_ms" line.
struct EndLine {
  bool present = false;
  int status = -1;
  double ended_at = 0;
  double call_ms = 0;
};
inline EndLine end_line(const std::string& out) {
  EndLine l;
  if (auto s = line_after(out, "END ")) {
    l.present = true;
    std::istringstream(*s) >> l.status >> l.ended_at >> l.call_ms;
  }
  return l;
}

// Every survivor of kill_in_third_iteration exited cleanly, its all-reduce ending with one of
// `allowed` within timeout_ms of the kill (+ the margin a busy host may add: this tells "ended by
// its deadline" from "hung", tests/support/loaded_host.h), and because of it (not before).
inline void check_survivors(const std::vector<Proc>& procs, int victim, const Kill& kill, int timeout_ms,
                            const std::vector<int>& allowed) {
  for (int r = 0; r < static_cast<int>(procs.size()); ++r) {
    if (r == victim) continue;
    INFO("survivor rank " << r);
    CHECK(procs[r].exited_zero());
    const EndLine end = end_line(procs[r].output());
    REQUIRE(end.present);
    INFO("status " << end.status << ", returned " << (end.ended_at - kill.killed_at) << " ms after the kill");
    CHECK(std::find(allowed.begin(), allowed.end(), end.status) != allowed.end());
    CHECK(end.ended_at - kill.killed_at <= timeout_ms + loaded_host::kSlackMs);
    CHECK(end.ended_at - kill.killed_at > -100);
  }
}

}  // namespace abi
