// Starts the ranks and supervises them until the job ends: forwards signals, stops every rank
// when one fails (SIGTERM, then SIGKILL after the grace period), enforces --timeout-s, passes
// the ranks' output on, and decides comm-run's exit status.
//
// Signals are taken through a signalfd (blocked, then read in the poll loop), so there is no
// handler and no global state; the children get the original mask back before exec.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "options.h"
#include "rank_output.h"
#include "replace_failed.h"

namespace comm_run {

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  double exited_at = 0;  // now_s() when reaped
  bool signalled_by_us = false;
  std::string prefix;
  Stream out, err;
};

class Launcher {
 public:
  explicit Launcher(const Options& opt) : opt_(opt), ranks_(static_cast<size_t>(opt.nranks)) {}

  // The whole job; returns comm-run's exit status.
  int run();

 private:
  // Starting.
  void start_all(const std::string& port, const std::string& run_id, const sigset_t& child_mask);
  bool start(int rank, const std::vector<std::string>& env, const std::vector<int>& cpus,
             const sigset_t& child_mask);
  [[noreturn]] void exec_rank(int rank, const int* out_pipe, const int* err_pipe, const std::vector<int>& cpus,
                              const sigset_t& child_mask, const std::vector<char*>& envp);
  void attach_output(int rank, const int* out_pipe, const int* err_pipe);

  // Supervising.
  void supervise(int sfd, double deadline);
  int poll_timeout_ms(double deadline) const;
  void read_signals(int sfd);
  void check_clocks(double deadline);
  void signal_all(int sig);
  void stop_all(int sig);
  void reap();
  void handle_signal(int sig);
  // --replace-failed: each new exclusion of the process running in its slot: SIGKILL it if it
  // still runs, then start its replacement with COMM_JOIN=1.
  void replace_excluded();
  // --replace-failed: a replacement that died before the members admitted it (the store's count
  // of admissions into its slot is below the replacements started) is started again: it was never
  // a member, so no exclusion will ever name it and the slot would stay empty. So is a process
  // that no exclusion named within a few seconds of its exit (an admission the members undid).
  void restart_unadmitted();
  // Starts slot's next process with COMM_JOIN=1 (the slot's environment), saying so if it cannot.
  void start_joiner(int slot);

  // Ending.
  void drain_output();
  int report() const;

  const Options& opt_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  int first_failure_ = -1;   // rank whose failure stopped the job
  bool start_failed_ = false;
  int interrupted_by_ = 0;   // the signal a user sent us
  bool timed_out_ = false;
  double kill_at_ = 0;       // when stopping: SIGKILL the survivors at this time
  // --replace-failed: the store comm-run serves, and per slot the replacements started.
  JobStore store_;
  std::vector<int64_t> replacements_;
  std::vector<int> restarts_;  // per slot: replacements restarted unadmitted, in a row
  bool rank_finished_ = false;  // a rank exited 0: the job ends, nothing more is started
  std::string port_, run_id_;
  sigset_t child_mask_{};
};

}  // namespace comm_run
