// What only real processes show: rendezvous through torchrun's environment (env://), a rank
// killed with SIGKILL, bad launcher variables, ports in use or unreachable, ranks started
// with different settings, and garbage sent to the job's listening ports. The harness
// starts rank_worker N times with posix_spawn and judges its one-fact-per-line output.
// Run one at a time (is_parallel: false): several of these measure deadlines.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
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

extern char** environ;

#ifndef ABI_RANK_WORKER
#define ABI_RANK_WORKER "rank_worker"
#endif

namespace {

using namespace abi;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string worker_path() {
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

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Our environment without anything a launcher or libcomm would read, so only what a test
// sets reaches the ranks (COMM_DEBUG stays: it only changes logging).
std::vector<std::string> clean_environment() {
  static const char* const drop[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
                                     "MASTER_ADDR=", "MASTER_PORT=", "TORCHELASTIC_", "OMPI_", "PMI", "SLURM_",
                                     "NCCL_", "UCX_"};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string s(*e);
    bool keep = true;
    for (const char* d : drop) keep = keep && s.rfind(d, 0) != 0;
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

Proc spawn_worker(const std::string& mode, const Env& env, const std::string& out_path) {
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
Env torchrun_env(int r, int n, int port, int timeout_ms, const Env& extra = {}) {
  Env env = {{"RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(n)},
             {"LOCAL_RANK", std::to_string(r)},
             {"LOCAL_WORLD_SIZE", std::to_string(n)},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)},
             {"COMM_TIMEOUT_MS", std::to_string(timeout_ms)}};
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
bool wait_all(std::vector<Proc>& procs, double deadline) {
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

std::vector<Proc> launch(const TempDir& dir, const std::string& mode, int n,
                         const std::function<Env(int rank)>& env_of) {
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    procs.push_back(spawn_worker(mode, env_of(r), dir.file(mode + "-rank" + std::to_string(r) + ".out")));
  }
  return procs;
}

// The rest of the first line that starts with prefix.
std::optional<std::string> line_after(const std::string& out, const std::string& prefix) {
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
InitLine init_line(const std::string& out) {
  InitLine l;
  if (auto s = line_after(out, "INIT ")) {
    l.present = true;
    std::istringstream(*s) >> l.status >> l.ms;
  }
  l.message = line_after(out, "MSG ").value_or("");
  return l;
}

std::string describe_all(const std::vector<Proc>& procs) {
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
Single run_single(const TempDir& dir, const std::string& name, const Env& env, double limit_ms) {
  Single s;
  s.proc = spawn_worker("init", env, dir.file(name + ".out"));
  std::vector<Proc> procs{s.proc};
  wait_all(procs, now_ms() + limit_ms);
  s.proc = procs[0];
  s.init = init_line(s.proc.output());
  return s;
}

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
    auto procs = launch(dir, "collectives", n, [&](int r) { return torchrun_env(r, n, port, 30000); });
    const bool ended = wait_all(procs, now_ms() + 240000);
    INFO(n << " processes:\n" << describe_all(procs));
    CHECK(ended);
    std::map<std::string, std::string> rank0_hashes;
    for (int r = 0; r < n; ++r) {
      const std::string out = procs[r].output();
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
          rank0_hashes[label] = hash;
        } else {
          INFO("rank " << r << ": " << label);
          CHECK(rank0_hashes[label] == hash);
        }
      }
      CHECK(hashes >= 15);
    }
  }
}

TEST_CASE("processes: SIGKILL of a rank during a 64 MiB allreduce: every survivor returns COMM_ERR_REMOTE or "
          "COMM_ERR_TIMEOUT within COMM_TIMEOUT_MS + 1 s",
          "[process]") {
  TempDir dir;
  const int n = 3, victim = 1, timeout_ms = 3000;
  const int port = free_port();
  auto procs = launch(dir, "kill", n, [&](int r) { return torchrun_env(r, n, port, timeout_ms); });
  // Kill the victim inside its third all-reduce (the first two show the job is up and moving).
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
  CHECK((WIFSIGNALED(procs[victim].wstatus) && WTERMSIG(procs[victim].wstatus) == SIGKILL));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = procs[r].output();
    INFO("survivor rank " << r);
    CHECK(procs[r].exited_zero());
    const auto end = line_after(out, "END ");
    REQUIRE(end.has_value());
    int status = -1;
    double ended_at = 0, call_ms = 0;
    std::istringstream(*end) >> status >> ended_at >> call_ms;
    INFO("status " << status << ", returned " << (ended_at - killed_at) << " ms after the kill");
    CHECK((status == COMM_ERR_REMOTE || status == COMM_ERR_TIMEOUT));
    CHECK(ended_at - killed_at <= timeout_ms + 1000);
    CHECK(ended_at - killed_at > -100);  // it failed because of the kill, not before it
    long destroy_ms = -1;
    int destroy_status = -1;
    if (auto d = line_after(out, "DESTROY ")) std::istringstream(*d) >> destroy_status >> destroy_ms;
    CHECK(destroy_ms >= 0);
    CHECK(destroy_ms <= timeout_ms + 1000);
  }
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
    const Env env = torchrun_env(1, 2, free_port(), 2000, bad.env);
    const Single s = run_single(dir, "bad" + std::to_string(i++), env, 15000);
    INFO(bad.name << ": " << s.proc.how() << "\n" << s.proc.output());
    CHECK(s.proc.exited_zero());
    CHECK(s.init.status == COMM_ERR_INVALID_ARGUMENT);
    CHECK(s.init.ms < 1500);  // found locally, before any waiting
    for (const auto& w : bad.must) {
      INFO("the message should contain \"" << w << "\"");
      CHECK(s.init.message.find(w) != std::string::npos);
    }
  }
}

TEST_CASE("processes: MASTER_PORT already in use: rank 0's init is COMM_ERR_SYSTEM naming the port", "[process]") {
  TempDir dir;
  // Hold a listening socket on every address, so rank 0's store cannot bind.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(fd, 4) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  const Single s = run_single(dir, "port-in-use", torchrun_env(0, 2, port, 2000), 15000);
  close(fd);
  INFO("port " << port << ": " << s.proc.how() << "\n" << s.proc.output());
  CHECK(s.proc.exited_zero());
  CHECK(s.init.status == COMM_ERR_SYSTEM);
  CHECK(s.init.message.find(std::to_string(port)) != std::string::npos);
  CHECK(s.init.ms < 1500);
}

TEST_CASE("processes: an unreachable MASTER_ADDR:MASTER_PORT ends in COMM_ERR_TIMEOUT after about the timeout, never "
          "a hang",
          "[process]") {
  TempDir dir;
  const int port = free_port();  // nobody listens there
  const Single s = run_single(dir, "unreachable", torchrun_env(1, 2, port, 1000), 15000);
  INFO("port " << port << ": " << s.proc.how() << "\n" << s.proc.output());
  CHECK(s.proc.exited_zero());
  CHECK(s.init.status == COMM_ERR_TIMEOUT);
  CHECK(s.init.ms >= 900);
  CHECK(s.init.ms <= 2500);
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
    wait_all(procs, now_ms() + c.max_timeout_ms + 15000);
    INFO(c.name << ":\n" << describe_all(procs));
    for (int r = 0; r < 2; ++r) {
      const InitLine l = init_line(procs[r].output());
      INFO("rank " << r);
      CHECK(procs[r].exited_zero());
      CHECK(l.present);
      CHECK(l.status != COMM_OK);
      CHECK(l.ms < c.max_timeout_ms + 1000);
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
