// rank_worker's modes of issue 35: failure_order (a failure fails no earlier call) and agree
// (comm_agree_failed, shrink and go on).
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "rank_worker.h"
#include "reference.h"

namespace rank_worker {

using namespace abi;

// The race of issue 35: a barrier, then a disagreement at the next call (rank 0 broadcasts, the
// others all-reduce), ABI_TRIALS times, each on a fresh comm_dup of the world (the disagreement
// breaks it). Per trial: "TRIAL <i> <barrier status> <second call's> <third call's>" and the
// messages of the failures (TMSG <i> <which> <text>). Every rank entered the barrier and every
// peer sent its part of it, so it must complete everywhere, whatever the others' reports of the
// later call overtake (docs/design/core.md, "Which calls a failure fails").
int mode_failure_order() {
  int rank = -1, n = -1;
  comm_t world = init_or_report(&rank, &n);
  if (!world) return 2;
  const char* t = std::getenv("ABI_TRIALS");
  const int trials = t != nullptr ? std::atoi(t) : 16;
  std::vector<float> a(1024, 1.0f), b(1024, 0.0f);
  int failures = 0;
  for (int i = 0; i < trials; ++i) {
    comm_t c = nullptr;
    if (comm_dup(world, &c) != COMM_OK) {
      say("FAIL rank " + std::to_string(rank) + " comm_dup: " + one_line(comm_last_error(world)));
      ++failures;
      break;
    }
    comm_status_t st[3];
    std::string msg[3];
    st[0] = comm_barrier(c, nullptr);
    msg[0] = st[0] == COMM_OK ? "" : one_line(comm_last_error(c));
    st[1] = rank == 0 ? comm_broadcast(c, a.data(), b.data(), a.size(), COMM_FLOAT32, 0, nullptr)
                      : comm_allreduce(c, a.data(), b.data(), a.size(), COMM_FLOAT32, COMM_SUM, nullptr);
    msg[1] = st[1] == COMM_OK ? "" : one_line(comm_last_error(c));
    st[2] = comm_barrier(c, nullptr);
    msg[2] = st[2] == COMM_OK ? "" : one_line(comm_last_error(c));
    say("TRIAL " + std::to_string(i) + " " + std::to_string(st[0]) + " " + std::to_string(st[1]) + " " +
        std::to_string(st[2]));
    for (int k = 0; k < 3; ++k)
      if (st[k] != COMM_OK) say("TMSG " + std::to_string(i) + " " + std::to_string(k) + " " + msg[k]);
    comm_destroy(c);
  }
  comm_destroy(world);
  say("DONE " + std::to_string(failures));
  return failures ? 1 : 0;
}

// Issue 35's agreement: all-reduces (each rank adds its world rank + 1, checked) in a loop of
// ABI_STEPS steps, ~20 ms apart (the harness kills or stops ranks meanwhile). When a step fails,
// the rank agrees on the failed ranks with the others (comm_agree_failed), shrinks to the rest
// and resumes at the earliest step any survivor had not completed (a rank may have completed the
// step the others failed); a failed shrink (a rank died during the agreement) agrees again.
//   ITER <step> (world-rank members)   AGREEING   AGREE <status> <failed, as world ranks>
//   SHRINK <status> <new rank> <new size>   FINAL <members, as world ranks>   DONE <failures>
//   TIME failed|agreed|shrunk <CLOCK_MONOTONIC ms>   after STEPFAIL, AGREE and SHRINK (bench/agree_timing.py)
// A rank the others excluded prints AGREE with its error (and MSG) and ends, DONE 0.
int mode_agree() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const int world_rank = rank;
  const char* s = std::getenv("ABI_STEPS");
  const int steps = s != nullptr ? std::atoi(s) : 100;
  std::vector<int> members(static_cast<size_t>(n));  // world rank of each rank of c
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  int failures = 0;
  auto members_text = [&] {
    std::string t;
    for (int m : members) {
      if (!t.empty()) t += ',';
      t += std::to_string(m);  // appended apart: GCC 12 warns (-Wrestrict) on "," + to_string
    }
    return "[" + t + "]";
  };
  for (int step = 0; step < steps;) {
    say("ITER " + std::to_string(step) + " " + members_text());
    int64_t mine = world_rank + 1, sum = 0, expected = 0;
    for (int m : members) expected += m + 1;
    comm_status_t st = comm_allreduce(c, &mine, &sum, 1, COMM_INT64, COMM_SUM, nullptr);
    if (st == COMM_OK) {
      if (sum != expected) {
        say("FAIL rank " + std::to_string(world_rank) + " step " + std::to_string(step) + ": sum " +
            std::to_string(sum) + ", expected " + std::to_string(expected));
        ++failures;
      }
      ++step;
      usleep(20000);
      continue;
    }
    say("STEPFAIL " + std::to_string(step) + " " + std::to_string(st) + " " + one_line(comm_last_error(c)));
    say("TIME failed " + std::to_string(mono_ms()));
    // ABI_AGREE_LATE_MS: world rank ABI_AGREE_LATE_RANK (0 unless set) comes to the agreement
    // this much later: so that another rank decides it (the test kills that one: world rank 0
    // serves the job store), or so that the others check in before the test kills the late one.
    const char* late_rank = std::getenv("ABI_AGREE_LATE_RANK");
    if (const char* late = std::getenv("ABI_AGREE_LATE_MS");
        late != nullptr && world_rank == (late_rank != nullptr ? std::atoi(late_rank) : 0))
      usleep(static_cast<useconds_t>(std::atoi(late)) * 1000);
    for (int attempt = 0;; ++attempt) {
      say("AGREEING");
      int failed[64];
      int nf = 0;
      st = comm_agree_failed(c, failed, 64, &nf);
      std::string list;
      for (int i = 0; i < nf && i < 64; ++i) {
        if (!list.empty()) list += ',';
        list += std::to_string(members[static_cast<size_t>(failed[i])]);
      }
      say("AGREE " + std::to_string(st) + " [" + list + "]");
      say("TIME agreed " + std::to_string(mono_ms()));
      if (st != COMM_OK) {
        say("MSG " + one_line(comm_last_error(c)));
        comm_destroy(c);
        say("DONE 0");
        return 0;
      }
      // ABI_DIE_BEFORE_SHRINK_RANK: that world rank is SIGKILLed between its first agreement and
      // its shrink (a second failure the agreement could not see).
      if (const char* die = std::getenv("ABI_DIE_BEFORE_SHRINK_RANK"); die != nullptr && std::atoi(die) == world_rank)
        kill(getpid(), SIGKILL);
      comm_t shrunk = nullptr;
      st = comm_shrink(c, failed, nf, &shrunk);
      int new_rank = -1, new_size = -1;
      if (st == COMM_OK) {
        comm_rank(shrunk, &new_rank);
        comm_size(shrunk, &new_size);
      }
      say("SHRINK " + std::to_string(st) + " " + std::to_string(new_rank) + " " + std::to_string(new_size));
      say("TIME shrunk " + std::to_string(mono_ms()));
      if (st != COMM_OK) {
        say("MSG " + one_line(comm_last_error(c)));
        if (attempt < 3) continue;  // a rank died during the agreement: agree again, without it
        ++failures;
        comm_destroy(c);
        say("DONE " + std::to_string(failures));
        return 1;
      }
      std::vector<int> kept;
      for (size_t r = 0; r < members.size(); ++r)
        if (std::find(failed, failed + nf, static_cast<int>(r)) == failed + nf) kept.push_back(members[r]);
      members = kept;
      comm_destroy(c);
      c = shrunk;
      // A failure fails the calls it concerns, no earlier one: a rank may have completed the step
      // its peers failed (the dead rank's part reached it first). Resume at the earliest step.
      int64_t at = step, earliest = step;
      if (comm_allreduce(c, &at, &earliest, 1, COMM_INT64, COMM_MIN, nullptr) == COMM_OK) step = static_cast<int>(earliest);
      break;
    }
  }
  say("FINAL " + members_text());
  comm_destroy(c);
  say("DONE " + std::to_string(failures));
  return failures ? 1 : 0;
}

}  // namespace rank_worker
