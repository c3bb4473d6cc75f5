// rank_worker, one rank of the real-process ABI tests (rank_worker.cc: its output, modes and main):
// the helpers its sources share, Checker, and the modes, one source file per family.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

#include "comm/comm.h"
#include "reference.h"

namespace rank_worker {

double mono_ms();
void say(const std::string& line);
std::string one_line(const char* s);
// ABI_START_GATE: say STARTED, then wait (bounded) until the harness has made that file (rank_worker.cc).
void wait_at_start_gate();
comm_t init_or_report(int* rank, int* size);

class Checker {
 public:
  Checker(comm_t comm, int rank, int n) : comm_(comm), rank_(rank), n_(n) {}
  int failures = 0;

  bool status(comm_status_t st, const std::string& what) {
    if (st == COMM_OK) return true;
    fail(what + " returned " + std::to_string(st) + ": " + one_line(comm_last_error(comm_)));
    return false;
  }
  void result(const abi::CheckResult& res, const std::string& what) {
    if (!res.ok()) fail(what + ": " + std::to_string(res.wrong) + " wrong, first " + res.first);
  }
  void fail(const std::string& what) {
    ++failures;
    say("FAIL rank " + std::to_string(rank_) + " " + what);
  }
  void hash(const std::string& label, const void* p, size_t bytes) {
    char h[32];
    std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(abi::fnv1a(p, bytes)));
    say("HASH " + label + " " + h);
  }
  int rank() const { return rank_; }
  int n() const { return n_; }

 private:
  comm_t comm_;
  int rank_, n_;
};

// rank_worker_collectives.cc
int mode_init();
int mode_collectives();
int mode_shm();
int mode_garbage();
// rank_worker_failures.cc
int mode_kill();
int mode_idle();
int mode_shrink();
int mode_stall();
// rank_worker_any_source.cc
int mode_any_source();
int mode_any_source_timeout();
// rank_worker_agree.cc
int mode_failure_order();
int mode_agree();

}  // namespace rank_worker
