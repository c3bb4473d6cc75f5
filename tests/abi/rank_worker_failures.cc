// rank_worker's modes in which a rank dies or stops: kill (mid all-reduce), idle (while the others
// poll comm_get_async_error), shrink (comm_shrink after a SIGKILL, or healthy), stall (a chain of waits).
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

// 64 MiB all-reduces until one fails: the harness kills one rank in the middle.
int mode_kill() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const size_t count = (size_t{64} << 20) / sizeof(float);
  std::vector<float> x(count, 1.0f), y(count, 0.0f);  // touched before the first call
  say("READY");
  comm_status_t st = COMM_OK;
  double call_ms = 0;
  for (int i = 0; i < 1000 && st == COMM_OK; ++i) {
    say("ITER " + std::to_string(i));
    const double t0 = mono_ms();
    st = comm_allreduce(c, x.data(), y.data(), count, COMM_FLOAT32, COMM_SUM, nullptr);
    call_ms = mono_ms() - t0;
  }
  say("END " + std::to_string(st) + " " + std::to_string(static_cast<long long>(mono_ms())) + " " +
      std::to_string(static_cast<long>(call_ms)));
  if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  const double t0 = mono_ms();
  const comm_status_t ds = comm_destroy(c);
  say("DESTROY " + std::to_string(ds) + " " + std::to_string(static_cast<long>(mono_ms() - t0)));
  return 0;
}

// Idle detection: a few calls connect the ranks (8 B and 1 MiB all-reduces), then rank
// IDLE_VICTIM waits to be killed or stopped by the harness while the others call nothing and
// poll comm_get_async_error every 10 ms for IDLE_WAIT_MS; then each tries one more call.
//   READY <monotonic ms> / ASYNC <status> <monotonic ms> / NEXT <status> <call ms> / MSG <text>
int mode_idle() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const char* v_env = std::getenv("IDLE_VICTIM");
  const char* w_env = std::getenv("IDLE_WAIT_MS");
  const int victim = v_env ? std::atoi(v_env) : n - 1;
  const double wait_ms = w_env ? std::atof(w_env) : 20000;
  std::vector<float> small(2, 1.0f), big(256 * 1024, 1.0f);
  comm_status_t st = comm_allreduce(c, small.data(), small.data(), small.size(), COMM_FLOAT32, COMM_SUM, nullptr);
  if (st == COMM_OK) st = comm_allreduce(c, big.data(), big.data(), big.size(), COMM_FLOAT32, COMM_SUM, nullptr);
  if (st == COMM_OK) st = comm_barrier(c, nullptr);
  if (st != COMM_OK) {
    say("MSG " + one_line(comm_last_error(c)));
    return 3;
  }
  say("READY " + std::to_string(static_cast<long long>(mono_ms())));
  if (rank == victim) {
    for (;;) pause();  // until the harness's SIGKILL (or SIGSTOP, then SIGKILL)
  }
  const double t0 = mono_ms();
  comm_status_t async = COMM_OK;
  while (async == COMM_OK && mono_ms() - t0 < wait_ms) {
    usleep(10 * 1000);
    async = comm_get_async_error(c);
  }
  say("ASYNC " + std::to_string(async) + " " + std::to_string(static_cast<long long>(mono_ms())));
  if (std::getenv("IDLE_NO_NEXT") != nullptr) {  // leave at once, as a rank that finished first
    comm_destroy(c);
    return 0;
  }
  const double t1 = mono_ms();
  st = comm_allreduce(c, small.data(), small.data(), small.size(), COMM_FLOAT32, COMM_SUM, nullptr);
  say("NEXT " + std::to_string(st) + " " + std::to_string(static_cast<long>(mono_ms() - t1)));
  if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  comm_destroy(c);
  return 0;
}

// comm_shrink (issue 15). SHRINK_VICTIM=v: rank v dies by SIGKILL while the others are in an
// all-reduce waiting for it; the survivors see the error, then shrink. Without a victim the
// communicator is healthy when they shrink. Every rank excludes SHRINK_EXCLUDE (comma list;
// default: the victim), or SHRINK_EXCLUDE_<rank> when set (mismatched lists); a rank in its own
// list leaves (LEFT) unless SHRINK_SELF=1 makes it call comm_shrink anyway (bad input). On the
// new communicator: checked all-reduces of exact float32 sums, 1 to 1 Mi elements.
std::vector<int> parse_ranks(const char* text) {
  std::vector<int> out;
  if (text == nullptr) return out;
  std::string s = text;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(std::atoi(s.substr(pos, end - pos).c_str()));
    pos = end + 1;
  }
  return out;
}

int mode_shrink() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const char* v_env = std::getenv("SHRINK_VICTIM");
  const int victim = v_env ? std::atoi(v_env) : -1;
  std::vector<int> excluded = victim >= 0 ? std::vector<int>{victim} : std::vector<int>{};
  if (const char* e = std::getenv("SHRINK_EXCLUDE")) excluded = parse_ranks(e);
  if (const char* e = std::getenv(("SHRINK_EXCLUDE_" + std::to_string(rank)).c_str())) excluded = parse_ranks(e);
  const size_t count = 1 << 16;
  std::vector<float> x(count, 1.0f), y(count, 0.0f);
  say("READY");
  comm_status_t st = COMM_OK;
  if (victim >= 0) {
    for (int i = 0; i < 100 && st == COMM_OK; ++i) {
      if (rank == victim && i == 2) {
        usleep(300 * 1000);  // the others are in all-reduce #3, waiting for this rank
        raise(SIGKILL);
      }
      st = comm_allreduce(c, x.data(), y.data(), count, COMM_FLOAT32, COMM_SUM, nullptr);
    }
    say("END " + std::to_string(st) + " " + std::to_string(static_cast<long long>(mono_ms())) + " 0");
    if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  } else {
    st = comm_allreduce(c, x.data(), y.data(), count, COMM_FLOAT32, COMM_SUM, nullptr);
    say("END " + std::to_string(st) + " " + std::to_string(static_cast<long long>(mono_ms())) + " 0");
  }
  bool in_list = false;
  for (int r : excluded) in_list = in_list || r == rank;
  const char* self = std::getenv("SHRINK_SELF");
  if (in_list && !(self && std::atoi(self) == 1)) {
    say("LEFT");
    comm_destroy(c);
    return 0;
  }
  comm_t s = nullptr;
  const double t0 = mono_ms();
  const comm_status_t ss = comm_shrink(c, excluded.data(), static_cast<int>(excluded.size()), &s);
  int new_rank = -1, new_size = -1;
  if (ss == COMM_OK) {
    comm_rank(s, &new_rank);
    comm_size(s, &new_size);
  }
  say("SHRINK " + std::to_string(ss) + " " + std::to_string(static_cast<long>(mono_ms() - t0)) + " " +
      std::to_string(new_rank) + " " + std::to_string(new_size));
  Checker check(s, new_rank, new_size);
  if (ss != COMM_OK) {
    say("MSG " + one_line(comm_last_error(c)));
  } else {
    // Exact in float32: (new rank + 1) * (i % 7 + 1), summed over the ranks.
    const long ranks_sum = static_cast<long>(new_size) * (new_size + 1) / 2;
    for (size_t elems : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      std::vector<float> a(elems), b(elems, -1.0f);
      for (size_t i = 0; i < elems; ++i) a[i] = static_cast<float>((new_rank + 1) * static_cast<long>(i % 7 + 1));
      if (!check.status(comm_allreduce(s, a.data(), b.data(), elems, COMM_FLOAT32, COMM_SUM, nullptr),
                        "allreduce on the shrunk communicator"))
        break;
      size_t wrong = 0;
      for (size_t i = 0; i < elems; ++i) wrong += b[i] != static_cast<float>(ranks_sum * static_cast<long>(i % 7 + 1));
      if (wrong) check.fail("allreduce of " + std::to_string(elems) + " on the shrunk communicator: " +
                            std::to_string(wrong) + " wrong");
      check.hash("shrunk" + std::to_string(elems), b.data(), elems * sizeof(float));
    }
    const comm_status_t old = comm_allreduce(c, x.data(), y.data(), 1, COMM_FLOAT32, COMM_SUM, nullptr);
    say("OLD " + std::to_string(old));
    if (old != COMM_OK) say("OLDMSG " + one_line(comm_last_error(c)));
    check.status(comm_destroy(s), "comm_destroy of the shrunk communicator");
  }
  comm_destroy(c);
  say("DONE " + std::to_string(check.failures));
  return 0;
}

// A chain of waits on 4 ranks whose first timeout is not the stopped rank's neighbour:
// after a barrier, rank v (STALL_VICTIM, default 3) stops itself (SIGSTOP); a = v+1 receives
// from v a second late, b = v+2 receives from a at once, d = v+3 receives from b half a second
// late, each then passing the message on. So b times out first, waiting on a, which is
// healthy and waits on v. STALL_LONE_MS=D: a waits on v from D ms after the stop, b and d wait
// on a from 0.75 D (in a call, so no watcher of theirs looks at v, and their own timeouts come
// after v's silence limit when D is 2/3 of the timeout): only a's wait can find v silent, and a
// wait that begins after its peer fell silent must end on that silence, not at its own timeout.
int mode_stall() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const char* env = std::getenv("STALL_VICTIM");
  const int v = env ? std::atoi(env) : 3;
  comm_status_t st = comm_barrier(c, nullptr);
  say("READY " + std::to_string(st));
  std::vector<float> x(1024, 1.0f);
  const int a = (v + 1) % n, b = (v + 2) % n, d = (v + 3) % n;
  const double t0 = mono_ms();
  if (rank == v) {
    raise(SIGSTOP);
    return 0;
  }
  const char* lone = std::getenv("STALL_LONE_MS");
  if (lone != nullptr && rank != a) {
    usleep(static_cast<useconds_t>(std::atoi(lone)) * 750);  // in a call before v's silence counts
    st = comm_recv(c, x.data(), x.size(), COMM_FLOAT32, a, nullptr);
  } else if (lone != nullptr) {
    usleep(static_cast<useconds_t>(std::atoi(lone)) * 1000);
    st = comm_recv(c, x.data(), x.size(), COMM_FLOAT32, v, nullptr);
  } else if (rank == a) {
    usleep(1000 * 1000);
    st = comm_recv(c, x.data(), x.size(), COMM_FLOAT32, v, nullptr);
    if (st == COMM_OK) st = comm_send(c, x.data(), x.size(), COMM_FLOAT32, b, nullptr);
  } else if (rank == b) {
    st = comm_recv(c, x.data(), x.size(), COMM_FLOAT32, a, nullptr);
    if (st == COMM_OK) st = comm_send(c, x.data(), x.size(), COMM_FLOAT32, d, nullptr);
  } else if (rank == d) {
    usleep(500 * 1000);
    st = comm_recv(c, x.data(), x.size(), COMM_FLOAT32, b, nullptr);
  }
  say("END " + std::to_string(st) + " " + std::to_string(static_cast<long long>(mono_ms())) + " " +
      std::to_string(static_cast<long>(mono_ms() - t0)));
  if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  comm_abort(c);  // the stopped rank never answers a graceful destroy
  comm_destroy(c);
  return 0;
}

}  // namespace rank_worker
