// One rank of the real-process ABI tests, started N times (by test_processes.cc or comm-run)
// with torchrun's environment. Reports on stdout, one fact per line, for the harness to judge:
//   STARTED                   before comm_init, when the harness gates the start (ABI_START_GATE)
//   INIT <status> <ms>        comm_init's status and duration     MSG <text>  a last error
//   HASH <label> <fnv1a>      a result that must be bitwise identical on every rank
//   FAIL <text>               a wrong result                      DONE <failures>
//   READY / ITER <i> / END <status> <monotonic ms> <call ms> / DESTROY <status> <ms>
//   SHRINK <status> <ms> <new rank> <new size> / OLD <status> / LEFT   (mode shrink)
// Modes: init | collectives | kill | garbage | shm | stall | idle | shrink | any_source | any_source_timeout |
// failure_order | agree.
// The modes live in rank_worker_<family>.cc, the helpers they share here and in rank_worker.h.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/comm.h"
#include "rank_worker.h"

namespace rank_worker {

double mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::string one_line(const char* s) {
  std::string out = s ? s : "(null)";
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

// ABI_START_GATE: say STARTED, then wait (bounded) until the harness has made that file, which
// it does once every rank has started (process_harness.h, launch): the ranks then call comm_init
// together, and a short COMM_TIMEOUT_MS bounds init, not a busy host's process start-up.
void wait_at_start_gate() {
  const char* gate = std::getenv("ABI_START_GATE");
  if (gate == nullptr || *gate == '\0') return;
  say("STARTED");
  const double t0 = mono_ms();
  while (access(gate, F_OK) != 0 && mono_ms() - t0 < 300000) usleep(1000);
}

comm_t init_or_report(int* rank, int* size) {
  wait_at_start_gate();
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm = nullptr;
  const double t0 = mono_ms();
  const comm_status_t st = comm_init(&cfg, &comm);
  say("INIT " + std::to_string(st) + " " + std::to_string(static_cast<long>(mono_ms() - t0)));
  if (st != COMM_OK) {
    say("MSG " + one_line(comm_last_error(nullptr)));
    return nullptr;
  }
  comm_rank(comm, rank);
  comm_size(comm, size);
  return comm;
}

}  // namespace rank_worker

using namespace rank_worker;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "init") return mode_init();
  if (mode == "collectives") return mode_collectives();
  if (mode == "kill") return mode_kill();
  if (mode == "garbage") return mode_garbage();
  if (mode == "shm") return mode_shm();
  if (mode == "stall") return mode_stall();
  if (mode == "idle") return mode_idle();
  if (mode == "shrink") return mode_shrink();
  if (mode == "any_source") return mode_any_source();
  if (mode == "any_source_timeout") return mode_any_source_timeout();
  if (mode == "failure_order") return mode_failure_order();
  if (mode == "agree") return mode_agree();
  std::fprintf(stderr, "usage: rank_worker init|collectives|kill|garbage|shm|stall|idle|shrink|any_source|any_source_timeout|"
               "failure_order|agree (with torchrun's environment)\n");
  return 64;
}
