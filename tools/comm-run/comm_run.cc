// comm-run: the local, single-machine launcher. Starts N ranks with torchrun's environment,
// pins them to cores as mpirun does, tags their output with the rank, forwards Ctrl-C, and
// when one rank fails stops the rest, so a broken job never hangs the terminal.
//
// Signals are taken through a signalfd (blocked, then read in the poll loop), so there is no
// handler and no global state; the children get the original mask back before exec.

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "params.h"

extern char** environ;

namespace {

enum class Bind { kNone, kCore };
enum class Prefix { kAuto, kAlways, kQuiet, kNone };

struct Options {
  int nranks = 0;
  Bind bind = Bind::kCore;
  double timeout_s = 0;  // 0: no limit
  double grace_s = 5;    // SIGTERM -> SIGKILL
  Prefix prefix = Prefix::kAuto;
  bool print_params = false;
  std::vector<char*> program;  // argv of the rank program, null-terminated
};

constexpr int kMaxRanks = 4096;
constexpr size_t kMaxPartialLine = 64 * 1024;

void usage(FILE* out) {
  std::fprintf(out,
      "usage: comm-run -n N [options] [--] PROGRAM [ARGS...]\n"
      "       comm-run --params\n"
      "\n"
      "Starts N local ranks of PROGRAM with torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "LOCAL_WORLD_SIZE=N, GROUP_RANK=0, ROLE_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port,\n"
      "unless MASTER_PORT is already set) and TORCHELASTIC_RUN_ID (unique per run).\n"
      "\n"
      "options:\n"
      "  -n, --nproc N        number of ranks (1..%d)\n"
      "  --bind core|none     core (default): pin rank i to the i-th CPU (mod count) of the CPUs\n"
      "                       comm-run may use, as mpirun does; none: do not pin\n"
      "  --timeout-s S        stop the job after S seconds (exit 124); 0 (default): no limit\n"
      "  --grace-s S          after SIGTERM, wait S seconds (default 5) before SIGKILL\n"
      "  --prefix             prefix every output line with \"[rank] \", even with one rank\n"
      "  --quiet-prefix       leave rank 0's lines as they are, prefix the other ranks' lines: keeps\n"
      "                       rank-0-only output such as comm-bench's table parseable\n"
      "  --no-prefix          no prefixes; the ranks write straight to comm-run's stdout/stderr\n"
      "  --params             print libcomm's parameters (environment variables) and exit\n"
      "  -h, --help           this text\n"
      "\n"
      "Output: by default, with N > 1 every line of stdout and stderr is prefixed with \"[rank] \"\n"
      "(line-buffered; a last line without a newline is still printed); with N = 1 nothing is.\n"
      "Ranks run in their own process groups with stdin from /dev/null.\n"
      "\n"
      "Signals: SIGINT, SIGTERM and SIGHUP are forwarded to every rank; a second one, or the grace\n"
      "period running out, sends SIGKILL. When a rank exits non-zero or dies by a signal, the others\n"
      "get SIGTERM, then SIGKILL after the grace period.\n"
      "\n"
      "Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit status\n"
      "(128+signal when it was killed), 124 on --timeout-s, 128+signal when interrupted.\n",
      kMaxRanks);
}

bool parse_number(const char* text, double min, double max, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max)) return false;
  *out = v;
  return true;
}

// Returns -1 to go on, otherwise the exit status for main.
int parse_options(int argc, char** argv, Options* opt) {
  enum { kBind = 256, kTimeout, kGrace, kPrefix, kQuiet, kNoPrefix, kParams };
  const option longopts[] = {
      {"nproc", required_argument, nullptr, 'n'},
      {"nproc-per-node", required_argument, nullptr, 'n'},
      {"bind", required_argument, nullptr, kBind},
      {"timeout-s", required_argument, nullptr, kTimeout},
      {"grace-s", required_argument, nullptr, kGrace},
      {"prefix", no_argument, nullptr, kPrefix},
      {"quiet-prefix", no_argument, nullptr, kQuiet},
      {"no-prefix", no_argument, nullptr, kNoPrefix},
      {"params", no_argument, nullptr, kParams},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  // '+': stop at the first non-option, so PROGRAM's own options are left alone.
  for (;;) {
    int c = getopt_long(argc, argv, "+n:h", longopts, nullptr);
    if (c == -1) break;
    double v = 0;
    switch (c) {
      case 'n':
        if (!parse_number(optarg, 1, kMaxRanks, &v) || v != static_cast<int>(v)) {
          std::fprintf(stderr, "comm-run: -n %s: expected a whole number of ranks in 1..%d\n", optarg, kMaxRanks);
          return 2;
        }
        opt->nranks = static_cast<int>(v);
        break;
      case kBind:
        if (std::strcmp(optarg, "core") == 0) {
          opt->bind = Bind::kCore;
        } else if (std::strcmp(optarg, "none") == 0) {
          opt->bind = Bind::kNone;
        } else {
          std::fprintf(stderr, "comm-run: --bind %s: expected core or none\n", optarg);
          return 2;
        }
        break;
      case kTimeout:
        if (!parse_number(optarg, 0, 1e9, &opt->timeout_s)) {
          std::fprintf(stderr, "comm-run: --timeout-s %s: expected seconds >= 0\n", optarg);
          return 2;
        }
        break;
      case kGrace:
        if (!parse_number(optarg, 0, 3600, &opt->grace_s)) {
          std::fprintf(stderr, "comm-run: --grace-s %s: expected seconds in 0..3600\n", optarg);
          return 2;
        }
        break;
      case kPrefix: opt->prefix = Prefix::kAlways; break;
      case kQuiet: opt->prefix = Prefix::kQuiet; break;
      case kNoPrefix: opt->prefix = Prefix::kNone; break;
      case kParams: opt->print_params = true; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (opt->print_params) return -1;
  if (opt->nranks == 0) {
    std::fprintf(stderr, "comm-run: -n N is required\n");
    usage(stderr);
    return 2;
  }
  if (optind >= argc) {
    std::fprintf(stderr, "comm-run: no program given\n");
    usage(stderr);
    return 2;
  }
  opt->program.assign(argv + optind, argv + argc);
  opt->program.push_back(nullptr);
  return -1;
}

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void write_all(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout is gone (EPIPE with SIGPIPE ignored): drop the output
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
}

// One pipe from a rank (its stdout or its stderr), reassembled into whole lines.
struct Stream {
  int fd = -1;
  int dest = -1;
  std::string pending;     // bytes after the last newline
  bool mid_line = false;   // a long line was already emitted in part, with its prefix

  // Emits every complete line, prefixed, in one write so lines of different ranks never mix.
  void emit(const std::string& prefix, bool at_eof) {
    std::string out;
    size_t start = 0;
    for (;;) {
      size_t nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      if (!mid_line) out += prefix;
      out.append(pending, start, nl + 1 - start);
      mid_line = false;
      start = nl + 1;
    }
    pending.erase(0, start);
    if (!pending.empty() && (at_eof || pending.size() >= kMaxPartialLine)) {
      if (!mid_line) out += prefix;
      out += pending;
      pending.clear();
      if (at_eof) {
        out += '\n';
        mid_line = false;
      } else {
        mid_line = true;
      }
    }
    if (!out.empty()) write_all(dest, out.data(), out.size());
  }

  // Reads what is there. Returns false at end of file (or error): the stream is closed.
  bool pump(const std::string& prefix) {
    char buf[65536];
    for (;;) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n > 0) {
        pending.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        emit(prefix, false);
        return true;
      }
      emit(prefix, true);
      close(fd);
      fd = -1;
      return false;
    }
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  bool signalled_by_us = false;
  std::string prefix;
  Stream out, err;
};

std::string describe_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
}

bool failed(int wait_status) {
  return WIFSIGNALED(wait_status) || (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0);
}

int exit_code_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WEXITSTATUS(wait_status);
}

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

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// The environment of rank `rank`: ours, minus what we set, plus torchrun's variables.
std::vector<std::string> rank_environment(const Options& opt, int rank, const std::string& port,
                                          const std::string& run_id) {
  const std::vector<std::pair<std::string, std::string>> ours = {
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

class Launcher {
 public:
  explicit Launcher(const Options& opt) : opt_(opt), ranks_(static_cast<size_t>(opt.nranks)) {}

  int run();

 private:
  bool prefixed() const {
    return opt_.prefix == Prefix::kAlways || opt_.prefix == Prefix::kQuiet ||
           (opt_.prefix == Prefix::kAuto && opt_.nranks > 1);
  }
  bool start(int rank, const std::vector<std::string>& env, const std::vector<int>& cpus,
             const sigset_t& child_mask);
  void signal_all(int sig);
  void stop_all(int sig);
  void reap();
  void handle_signal(int sig);

  const Options& opt_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  int first_failure_ = -1;   // rank whose failure stopped the job
  bool start_failed_ = false;
  int interrupted_by_ = 0;   // the signal a user sent us
  bool timed_out_ = false;
  double kill_at_ = 0;       // when stopping: SIGKILL the survivors at this time
};

bool Launcher::start(int rank, const std::vector<std::string>& env, const std::vector<int>& cpus,
                     const sigset_t& child_mask) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (prefixed() && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
    std::fprintf(stderr, "comm-run: pipe: %s\n", std::strerror(errno));
    return false;
  }
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "comm-run: fork for rank %d: %s\n", rank, std::strerror(errno));
    return false;
  }
  if (pid == 0) {
    // Child: its own process group, so a signal reaches everything the rank started, and a
    // terminal's Ctrl-C reaches only comm-run, which forwards it exactly once.
    setpgid(0, 0);
    if (prefixed()) {
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (opt_.bind == Bind::kCore && !cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<size_t>(rank) % cpus.size()], &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0)
        std::fprintf(stderr, "comm-run: rank %d: sched_setaffinity: %s (running unpinned)\n", rank,
                     std::strerror(errno));
    }
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    execvpe(opt_.program[0], opt_.program.data(), envp.data());
    std::fprintf(stderr, "comm-run: rank %d: cannot run '%s': %s\n", rank, opt_.program[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that signalling the group cannot race the child's own call
  r.pid = pid;
  r.running = true;
  ++running_;
  if (prefixed()) {
    close(out_pipe[1]);
    close(err_pipe[1]);
    fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
    fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
    r.out.fd = out_pipe[0];
    r.out.dest = STDOUT_FILENO;
    r.err.fd = err_pipe[0];
    r.err.dest = STDERR_FILENO;
    if (opt_.prefix != Prefix::kQuiet || rank != 0) {
      // snprintf, not "[" + to_string(): GCC 12 -O3 warns falsely (-Wrestrict) on the latter.
      char text[32];
      int len = std::snprintf(text, sizeof text, "[%d] ", rank);
      r.prefix = std::string(text, static_cast<size_t>(len));
    }
  }
  return true;
}

void Launcher::signal_all(int sig) {
  for (Rank& r : ranks_) {
    if (!r.running) continue;
    r.signalled_by_us = true;
    if (kill(-r.pid, sig) != 0) kill(r.pid, sig);
  }
}

// Asks every rank to stop with `sig` and arms the SIGKILL that follows the grace period.
void Launcher::stop_all(int sig) {
  signal_all(sig);
  if (kill_at_ == 0) kill_at_ = now_s() + opt_.grace_s;
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      if (r.pid != pid || !r.running) continue;
      r.running = false;
      r.wait_status = status;
      --running_;
      bool stopping = first_failure_ >= 0 || start_failed_ || interrupted_by_ != 0 || timed_out_;
      if (failed(status) && !stopping) {
        first_failure_ = static_cast<int>(i);
        std::fprintf(stderr, "comm-run: rank %zu %s; stopping the other ranks\n", i, describe_status(status).c_str());
        stop_all(SIGTERM);
      }
    }
  }
}

void Launcher::handle_signal(int sig) {
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  if (kill_at_ != 0 && interrupted_by_ != 0) {
    std::fprintf(stderr, "comm-run: %s again: killing every rank\n", strsignal(sig));
    signal_all(SIGKILL);
    return;
  }
  if (interrupted_by_ == 0) interrupted_by_ = sig;
  std::fprintf(stderr, "comm-run: %s: forwarding it to every rank\n", strsignal(sig));
  stop_all(sig);
}

int Launcher::run() {
  std::string port;
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') {
    port = p;
  } else {
    int free_port = 0;
    if (!pick_free_port(&free_port)) {
      std::fprintf(stderr, "comm-run: cannot find a free port on 127.0.0.1: %s\n", std::strerror(errno));
      return 1;
    }
    port = std::to_string(free_port);
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  std::string run_id = "comm-run-" + std::to_string(getpid()) + "-" + std::to_string(ts.tv_sec);
  std::vector<int> cpus = allowed_cpus();

  // Signals arrive through a signalfd: blocked here, read in the loop; children get the old mask.
  sigset_t mask;
  sigset_t old_mask;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, s);
  sigprocmask(SIG_BLOCK, &mask, &old_mask);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    std::fprintf(stderr, "comm-run: signalfd: %s\n", std::strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher before it stops the ranks

  const double deadline = opt_.timeout_s > 0 ? now_s() + opt_.timeout_s : 0;
  for (int i = 0; i < opt_.nranks; ++i) {
    if (!start(i, rank_environment(opt_, i, port, run_id), cpus, old_mask)) {
      start_failed_ = true;
      stop_all(SIGTERM);
      break;
    }
  }

  while (running_ > 0) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({sfd, POLLIN, 0});
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    double wake = 0;
    if (kill_at_ != 0) wake = kill_at_;
    if (deadline != 0 && !timed_out_) wake = wake == 0 ? deadline : std::min(wake, deadline);
    int timeout_ms = -1;
    if (wake != 0) timeout_ms = std::max(0, static_cast<int>((wake - now_s()) * 1000.0) + 1);
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "comm-run: poll: %s\n", std::strerror(errno));
      stop_all(SIGKILL);
    }
    if (n > 0) {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Stream* s = streams[i - 1];
        for (Rank& r : ranks_)
          if (s == &r.out || s == &r.err) s->pump(r.prefix);
      }
      if (fds[0].revents != 0) {
        signalfd_siginfo si{};
        while (read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si))
          handle_signal(static_cast<int>(si.ssi_signo));
      }
    }
    const double t = now_s();
    if (deadline != 0 && !timed_out_ && t >= deadline && running_ > 0) {
      timed_out_ = true;
      std::fprintf(stderr, "comm-run: timeout after %g s: stopping every rank\n", opt_.timeout_s);
      stop_all(SIGTERM);
    }
    if (kill_at_ != 0 && t >= kill_at_ && running_ > 0) {
      std::fprintf(stderr, "comm-run: ranks still running after %g s grace: SIGKILL\n", opt_.grace_s);
      signal_all(SIGKILL);
      kill_at_ = t + 3600;  // SIGKILL cannot be ignored; just wait for the exits now
    }
  }

  // Whatever the ranks wrote before exiting is in the pipes. Do not wait for end of file: a
  // process a rank left behind may hold the pipe open.
  for (Rank& r : ranks_) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd < 0) continue;
      if (s->pump(r.prefix)) {
        s->emit(r.prefix, true);
        close(s->fd);
        s->fd = -1;
      }
    }
  }
  close(sfd);

  int code = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.pid < 0 || !failed(r.wait_status) || static_cast<int>(i) == first_failure_) continue;
    std::fprintf(stderr, "comm-run: rank %zu %s%s\n", i, describe_status(r.wait_status).c_str(),
                 r.signalled_by_us ? " (stopped by comm-run)" : "");
  }
  if (first_failure_ >= 0) {
    const Rank& r = ranks_[static_cast<size_t>(first_failure_)];
    std::fprintf(stderr, "comm-run: job failed: rank %d %s\n", first_failure_, describe_status(r.wait_status).c_str());
    code = exit_code_of(r.wait_status);
  } else if (start_failed_) {
    std::fprintf(stderr, "comm-run: job failed: could not start every rank\n");
    code = 1;
  } else if (timed_out_) {
    code = 124;
  } else if (interrupted_by_ != 0) {
    code = 128 + interrupted_by_;
  } else {
    for (const Rank& r : ranks_)
      if (failed(r.wait_status)) code = 1;  // cannot happen: a failure sets first_failure_
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (int code = parse_options(argc, argv, &opt); code >= 0) return code;
  if (opt.print_params) {
    std::fputs(comm::params::describe_all().c_str(), stdout);
    return 0;
  }
  Launcher launcher(opt);
  return launcher.run();
}
