#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <utility>

#include "job_environment.h"

namespace comm_run {

namespace {

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

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

}  // namespace

int Launcher::run() {
  std::string port;
  if (!job_port(&port)) {
    std::fprintf(stderr, "comm-run: cannot find a free port on 127.0.0.1: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string run_id = job_run_id();

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

  if (opt_.replace_failed) {
    if (!store_.serve(port, opt_.nranks)) return 1;
    replacements_.assign(static_cast<size_t>(opt_.nranks), 0);
    restarts_.assign(static_cast<size_t>(opt_.nranks), 0);
    port_ = port;
    run_id_ = run_id;
    child_mask_ = old_mask;
  }
  const double deadline = opt_.timeout_s > 0 ? now_s() + opt_.timeout_s : 0;
  start_all(port, run_id, old_mask);
  supervise(sfd, deadline);
  drain_output();
  close(sfd);
  return report();
}

// ---- Starting ----

void Launcher::start_all(const std::string& port, const std::string& run_id, const sigset_t& child_mask) {
  const std::vector<int> cpus = allowed_cpus();
  for (int i = 0; i < opt_.nranks; ++i) {
    if (!start(i, rank_environment(opt_, i, port, run_id), cpus, child_mask)) {
      start_failed_ = true;
      stop_all(SIGTERM);
      break;
    }
  }
}

bool Launcher::start(int rank, const std::vector<std::string>& env, const std::vector<int>& cpus,
                     const sigset_t& child_mask) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (opt_.prefixed() && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
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
  if (pid == 0) exec_rank(rank, out_pipe, err_pipe, cpus, child_mask, envp);
  setpgid(pid, pid);  // also here, so that signalling the group cannot race the child's own call
  r.pid = pid;
  r.running = true;
  ++running_;
  if (opt_.prefixed()) attach_output(rank, out_pipe, err_pipe);
  return true;
}

// In the child: the rank's process group, stdio, CPU and signal mask, then the program.
void Launcher::exec_rank(int rank, const int* out_pipe, const int* err_pipe, const std::vector<int>& cpus,
                         const sigset_t& child_mask, const std::vector<char*>& envp) {
  // Its own process group, so a signal reaches everything the rank started, and a terminal's
  // Ctrl-C reaches only comm-run, which forwards it exactly once.
  setpgid(0, 0);
  if (opt_.prefixed()) {
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

// In comm-run: the read ends of the rank's pipes, and its prefix.
void Launcher::attach_output(int rank, const int* out_pipe, const int* err_pipe) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
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

// ---- Supervising ----

// Until every rank has exited: passes output on, handles signals, and acts on the clocks.
void Launcher::supervise(int sfd, double deadline) {
  while (running_ > 0) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Stream*, const std::string*>> streams;  // fds[i + 1]'s stream and prefix
    fds.push_back({sfd, POLLIN, 0});
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(s, &r.prefix);
      }
    }
    int n = poll(fds.data(), fds.size(), poll_timeout_ms(deadline));
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "comm-run: poll: %s\n", std::strerror(errno));
      stop_all(SIGKILL);
    }
    if (n > 0) {
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) streams[i - 1].first->pump(*streams[i - 1].second);
      if (fds[0].revents != 0) read_signals(sfd);
    }
    check_clocks(deadline);
    if (opt_.replace_failed && kill_at_ == 0) {
      replace_excluded();
      restart_unadmitted();
    }
  }
}

void Launcher::restart_unadmitted() {
  constexpr int kMaxRestarts = 3;  // a replacement that cannot start at all must not loop forever
  // A member's exclusion comes within the agreement (about a second after a death; a timeout
  // when another rank is stopped meanwhile), and a joiner whose admission the members undid is
  // named by them (comm_exclude, python/libcomm/fault_tolerance.py, _undo_grow). A process that
  // exited and that no record named by then was never excluded: an undoing member's record that
  // could not be written (the store did not answer), or a trainer that undoes admissions without
  // comm_exclude; without this the slot would stay empty. Replacing it after this wait is safe
  // even if a record comes later: a record names the generation at which the excluded process
  // was admitted, which the launcher no longer runs (grow_records.cc, record_exclusion).
  constexpr double kRecordWaitS = 3.0;
  if (rank_finished_ || running_ == 0) return;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (r.running || restarts_[i] > kMaxRestarts || !failed(r.wait_status)) continue;
    const int64_t admitted = store_.admitted(static_cast<int>(i));
    if (admitted < 0) continue;
    if (admitted >= replacements_[i]) {
      // A member when it died: its exclusion brings the next one, or it never comes. Not while
      // fewer than a majority of the slots run: such a job is ending (its survivors cannot agree),
      // and a joiner would wait for a grow that never comes. Counted with the restarts below.
      if (now_s() - r.exited_at < kRecordWaitS || 2 * running_ <= opt_.nranks) continue;
      if (++restarts_[i] > kMaxRestarts) {
        std::fprintf(stderr, "comm-run: rank %zu: %d processes in a row exited unadmitted or unnamed by an "
                     "exclusion; the slot stays empty\n", i, kMaxRestarts);
        continue;
      }
      for (Stream* st : {&r.out, &r.err}) st->drain(r.prefix);
      ++replacements_[i];
      std::fprintf(stderr, "comm-run: rank %zu %s and no exclusion named it within %.0f s (an admission the "
                   "others undid): starting its replacement #%lld with COMM_JOIN=1\n", i,
                   describe_status(r.wait_status).c_str(), kRecordWaitS, static_cast<long long>(replacements_[i]));
      start_joiner(static_cast<int>(i));
      continue;
    }
    if (++restarts_[i] > kMaxRestarts) {
      std::fprintf(stderr, "comm-run: rank %zu: its replacement died %d times before it was admitted; the slot "
                   "stays empty\n", i, kMaxRestarts);
      continue;
    }
    for (Stream* st : {&r.out, &r.err}) st->drain(r.prefix);
    std::fprintf(stderr, "comm-run: rank %zu: its replacement #%lld %s before the others admitted it: starting it "
                 "again\n", i, static_cast<long long>(replacements_[i]), describe_status(r.wait_status).c_str());
    start_joiner(static_cast<int>(i));
  }
}

void Launcher::start_joiner(int slot) {
  if (!start(slot, rank_environment(opt_, slot, port_, run_id_, /*join=*/true), allowed_cpus(), child_mask_))
    std::fprintf(stderr, "comm-run: rank %d: its replacement could not be started\n", slot);
}

void Launcher::replace_excluded() {
  for (const Exclusion& e : store_.new_exclusions()) {
    if (e.slot < 0 || e.slot >= opt_.nranks) continue;  // not a slot of ours (a joiner beyond the world)
    const size_t i = static_cast<size_t>(e.slot);
    // A record about a process this slot no longer runs (several communicators agreeing on one
    // death, a retried round): its replacement is already there.
    if (e.generation != replacements_[i]) continue;
    Rank& r = ranks_[i];
    if (r.running) {
      // Still alive: stopped (SIGSTOP) or cut off. Never two processes in one slot: it goes first.
      std::fprintf(stderr, "comm-run: rank %d was excluded by the others but still runs (stopped?): SIGKILL\n",
                   e.slot);
      if (kill(-r.pid, SIGKILL) != 0) kill(r.pid, SIGKILL);
      if (waitpid(r.pid, &r.wait_status, 0) == r.pid) {
        r.running = false;
        --running_;
      }
    }
    if (r.running) continue;  // cannot happen: SIGKILL; never start a second process in the slot
    for (Stream* st : {&r.out, &r.err}) st->drain(r.prefix);
    ++replacements_[i];
    restarts_[i] = 0;  // a record: the slot's process was a member
    std::fprintf(stderr, "comm-run: rank %d was excluded by the others (%s): starting its replacement #%lld with "
                 "COMM_JOIN=1\n", e.slot, describe_status(r.wait_status).c_str(),
                 static_cast<long long>(replacements_[i]));
    start_joiner(e.slot);
  }
}

// Until the next thing a clock decides (the timeout, the SIGKILL after the grace period); -1: none.
int Launcher::poll_timeout_ms(double deadline) const {
  double wake = 0;
  if (kill_at_ != 0) wake = kill_at_;
  if (deadline != 0 && !timed_out_) wake = wake == 0 ? deadline : std::min(wake, deadline);
  const int look_ms = opt_.replace_failed ? 100 : -1;  // --replace-failed: the exclusions, 10 times a second
  if (wake == 0) return look_ms;
  const int ms = std::max(0, static_cast<int>((wake - now_s()) * 1000.0) + 1);
  return look_ms < 0 ? ms : std::min(ms, look_ms);
}

void Launcher::read_signals(int sfd) {
  signalfd_siginfo si{};
  while (read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) handle_signal(static_cast<int>(si.ssi_signo));
}

void Launcher::check_clocks(double deadline) {
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
      r.exited_at = now_s();
      --running_;
      if (!failed(status)) rank_finished_ = true;
      bool stopping = first_failure_ >= 0 || start_failed_ || interrupted_by_ != 0 || timed_out_;
      if (failed(status) && !stopping && opt_.replace_failed) {
        // The others go on: they agree on the loss, and its exclusion brings a replacement.
        std::fprintf(stderr, "comm-run: rank %zu %s; the others go on (--replace-failed)\n", i,
                     describe_status(status).c_str());
      } else if (failed(status) && !stopping) {
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

// ---- Ending ----

// Whatever the ranks wrote before exiting is in the pipes. Do not wait for end of file: a
// process a rank left behind may hold the pipe open.
void Launcher::drain_output() {
  for (Rank& r : ranks_)
    for (Stream* s : {&r.out, &r.err}) s->drain(r.prefix);
}

// Says how each failed rank ended and returns comm-run's exit status.
int Launcher::report() const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.pid < 0 || !failed(r.wait_status) || static_cast<int>(i) == first_failure_ || opt_.replace_failed) continue;
    std::fprintf(stderr, "comm-run: rank %zu %s%s\n", i, describe_status(r.wait_status).c_str(),
                 r.signalled_by_us ? " (stopped by comm-run)" : "");
  }
  if (first_failure_ >= 0) {
    const Rank& r = ranks_[static_cast<size_t>(first_failure_)];
    std::fprintf(stderr, "comm-run: job failed: rank %d %s\n", first_failure_, describe_status(r.wait_status).c_str());
    return exit_code_of(r.wait_status);
  }
  if (start_failed_) {
    std::fprintf(stderr, "comm-run: job failed: could not start every rank\n");
    return 1;
  }
  if (timed_out_) return 124;
  if (interrupted_by_ != 0) return 128 + interrupted_by_;
  if (opt_.replace_failed) {
    int code = 0;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (!failed(ranks_[i].wait_status)) continue;
      std::fprintf(stderr, "comm-run: job failed: the last process of rank %zu %s\n", i,
                   describe_status(ranks_[i].wait_status).c_str());
      if (code == 0) code = exit_code_of(ranks_[i].wait_status);
    }
    return code;
  }
  int code = 0;
  for (const Rank& r : ranks_)
    if (failed(r.wait_status)) code = 1;  // cannot happen: a failure sets first_failure_
  return code;
}

}  // namespace comm_run
