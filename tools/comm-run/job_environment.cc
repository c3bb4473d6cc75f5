#include "job_environment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

extern char** environ;

namespace comm_run {

namespace {

// A port nobody listens on right now: bind port 0 and let the kernel choose.
bool pick_free_port(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (ok) *port = ntohs(addr.sin_port);
  return ok;
}

}  // namespace

bool job_port(std::string* port) {
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') {
    *port = p;
    return true;
  }
  int free_port = 0;
  if (!pick_free_port(&free_port)) return false;
  *port = std::to_string(free_port);
  return true;
}

std::string job_run_id() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return "comm-run-" + std::to_string(getpid()) + "-" + std::to_string(ts.tv_sec);
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<std::string> rank_environment(const Options& opt, int rank, const std::string& port,
                                          const std::string& run_id, bool join) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(opt.nranks)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(opt.nranks)},
      {"GROUP_RANK", "0"},
      {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(opt.nranks)},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", port},
      {"TORCHELASTIC_RUN_ID", run_id},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
  };
  if (opt.replace_failed) ours.emplace_back("COMM_STORE_EXTERNAL", "1");
  if (join) ours.emplace_back("COMM_JOIN", "1");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : ours) replaced = replaced || k == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

}  // namespace comm_run
