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
#include "reference.h"

namespace {

using namespace abi;

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

class Checker {
 public:
  Checker(comm_t comm, int rank, int n) : comm_(comm), rank_(rank), n_(n) {}
  int failures = 0;

  bool status(comm_status_t st, const std::string& what) {
    if (st == COMM_OK) return true;
    fail(what + " returned " + std::to_string(st) + ": " + one_line(comm_last_error(comm_)));
    return false;
  }
  void result(const CheckResult& res, const std::string& what) {
    if (!res.ok()) fail(what + ": " + std::to_string(res.wrong) + " wrong, first " + res.first);
  }
  void fail(const std::string& what) {
    ++failures;
    say("FAIL rank " + std::to_string(rank_) + " " + what);
  }
  void hash(const std::string& label, const void* p, size_t bytes) {
    char h[32];
    std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(fnv1a(p, bytes)));
    say("HASH " + label + " " + h);
  }
  int rank() const { return rank_; }
  int n() const { return n_; }

 private:
  comm_t comm_;
  int rank_, n_;
};

// A cross-section of every collective (each dtype, op, placement at least once, counts
// from 0 to 1048579), checked in full on every rank.
int run_collectives(comm_t c, Checker& k) {
  const int r = k.rank(), n = k.n();
  const size_t un = static_cast<size_t>(n);
  const size_t max_elems = un * kLargeCount;
  std::vector<unsigned char> sendv(max_elems * 8), recvv(max_elems * 8);
  unsigned char* send = sendv.data();
  unsigned char* recv = recvv.data();
  uint64_t seed = 1;

  struct Red {
    comm_dtype_t d;
    comm_op_t op;
    size_t count;
    bool in_place;
  };
  const Red allreduces[] = {{COMM_FLOAT32, COMM_SUM, 1048579, false}, {COMM_FLOAT16, COMM_AVG, 1023, true},
                            {COMM_BFLOAT16, COMM_PROD, 7, false},    {COMM_INT8, COMM_SUM, 1023, true},
                            {COMM_UINT64, COMM_MAX, 65537, false},   {COMM_INT32, COMM_MIN, 1, false},
                            {COMM_FLOAT64, COMM_SUM, 0, false},      {COMM_INT64, COMM_AVG, 1048579, true},
                            {COMM_UINT8, COMM_PROD, 4099, false},    {COMM_UINT32, COMM_SUM, 262147, true}};
  for (const Red& a : allreduces) {
    const std::string what = std::string("allreduce ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
    if (!k.status(comm_allreduce(c, src, recv, a.count, a.d, a.op, nullptr), what)) return 1;
    k.result(check_reduced(recv, a.count, a.d, a.op, seed, n, 0), what);
    k.hash(what, recv, a.count * dtype_size(a.d));
  }

  const Red reduces[] = {{COMM_FLOAT32, COMM_SUM, 1023, false}, {COMM_INT32, COMM_PROD, 65537, true},
                         {COMM_BFLOAT16, COMM_AVG, 1048579, false}};
  int root = 0;
  for (const Red& a : reduces) {
    root = (root + 1) % n;
    const std::string what = std::string("reduce ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + " root " + std::to_string(root);
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
    if (!k.status(comm_reduce(c, src, recv, a.count, a.d, a.op, root, nullptr), what)) return 1;
    if (r == root) k.result(check_reduced(recv, a.count, a.d, a.op, seed, n, 0), what);
  }

  const Red broadcasts[] = {{COMM_FLOAT64, COMM_SUM, 1048579, false}, {COMM_UINT8, COMM_SUM, 7, true},
                            {COMM_FLOAT16, COMM_SUM, 1023, false}};
  root = 0;
  for (const Red& a : broadcasts) {
    root = (root + n - 1) % n;
    const std::string what = std::string("broadcast ") + dtype_name(a.d) + " " + std::to_string(a.count) + " root " +
                             std::to_string(root);
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, COMM_SUM, ++seed, r, 0);  // only the root's matters
    if (!k.status(comm_broadcast(c, src, recv, a.count, a.d, root, nullptr), what)) return 1;
    k.result(check_copied(recv, a.count, a.d, COMM_SUM, seed, root, 0), what);
    k.hash(what, recv, a.count * dtype_size(a.d));
  }

  const Red allgathers[] = {{COMM_FLOAT16, COMM_SUM, 1023, false}, {COMM_UINT32, COMM_SUM, 262147, true},
                            {COMM_INT8, COMM_SUM, 1048579, false}};
  for (const Red& a : allgathers) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("allgather ") + dtype_name(a.d) + " " + std::to_string(a.count) +
                             (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv + static_cast<size_t>(r) * a.count * es : send;
    fill_input(src, a.count, a.d, COMM_SUM, ++seed, r, 0);
    if (!k.status(comm_allgather(c, src, recv, a.count, a.d, nullptr), what)) return 1;
    for (int j = 0; j < n; ++j) {
      k.result(check_copied(recv + static_cast<size_t>(j) * a.count * es, a.count, a.d, COMM_SUM, seed, j, 0), what);
    }
    k.hash(what, recv, un * a.count * es);
  }

  const Red scatters[] = {{COMM_FLOAT32, COMM_SUM, 262147, false}, {COMM_BFLOAT16, COMM_MAX, 7, true},
                          {COMM_INT64, COMM_AVG, 1023, false}};
  for (const Red& a : scatters) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("reduce_scatter ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + (a.in_place ? " in-place" : "");
    fill_input(send, un * a.count, a.d, a.op, ++seed, r, 0);
    unsigned char* dst = a.in_place ? send + static_cast<size_t>(r) * a.count * es : recv;
    if (!k.status(comm_reduce_scatter(c, send, dst, a.count, a.d, a.op, nullptr), what)) return 1;
    k.result(check_reduced(dst, a.count, a.d, a.op, seed, n, static_cast<size_t>(r) * a.count), what);
  }

  const Red alltoalls[] = {{COMM_INT64, COMM_SUM, 1023, false}, {COMM_UINT8, COMM_SUM, 65537, true},
                           {COMM_FLOAT32, COMM_SUM, 262147, false}};
  for (const Red& a : alltoalls) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("alltoall ") + dtype_name(a.d) + " " + std::to_string(a.count) +
                             (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, un * a.count, a.d, COMM_SUM, ++seed, r, 0);
    if (!k.status(comm_alltoall(c, src, recv, a.count, a.d, nullptr), what)) return 1;
    for (int j = 0; j < n; ++j) {
      k.result(check_copied(recv + static_cast<size_t>(j) * a.count * es, a.count, a.d, COMM_SUM, seed, j,
                            static_cast<size_t>(r) * a.count),
               what);
    }
  }

  if (!k.status(comm_barrier(c, nullptr), "barrier")) return 1;

  // Grouped ring: send right, receive from left.
  {
    const size_t count = 1048579;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    fill_input(send, count, COMM_FLOAT32, COMM_SUM, ++seed, r, 0);
    comm_status_t st = comm_group_start();
    const comm_status_t s1 = comm_send(c, send, count, COMM_FLOAT32, right, nullptr);
    const comm_status_t s2 = comm_recv(c, recv, count, COMM_FLOAT32, left, nullptr);
    const comm_status_t s3 = comm_group_end();
    for (comm_status_t s : {s1, s2, s3}) {
      if (st == COMM_OK) st = s;
    }
    if (!k.status(st, "send/recv ring")) return 1;
    k.result(check_copied(recv, count, COMM_FLOAT32, COMM_SUM, seed, left, 0), "send/recv ring");
  }

  // Non-blocking, back to back.
  {
    const size_t count = 65537;
    fill_input(send, count, COMM_FLOAT64, COMM_SUM, ++seed, r, 0);
    comm_request_t a = nullptr, b = nullptr;
    comm_status_t st = comm_iallreduce(c, send, recv, count, COMM_FLOAT64, COMM_SUM, &a);
    if (st == COMM_OK) st = comm_ibarrier(c, &b);
    if (st == COMM_OK) st = comm_wait(b);
    if (st == COMM_OK) st = comm_wait(a);
    if (!k.status(st, "iallreduce + ibarrier")) return 1;
    k.result(check_reduced(recv, count, COMM_FLOAT64, COMM_SUM, seed, n, 0), "iallreduce");
    k.hash("iallreduce", recv, count * 8);
  }
  return 0;
}

int mode_collectives() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  run_collectives(c, k);
  const comm_status_t st = comm_destroy(c);
  if (st != COMM_OK) k.fail("comm_destroy returned " + std::to_string(st));
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

int mode_init() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (c) {
    comm_barrier(c, nullptr);
    comm_destroy(c);
  }
  return 0;
}

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
// healthy and waits on v.
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
  if (rank == a) {
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

// comm_mem_alloc buffers (shared memory local peers read in place) on the world, a dup and an
// even/odd split: all-reduces small and large, in and out of place, checked and hashed.
int mode_shm() {
  int rank = -1, n = -1;
  comm_t world = init_or_report(&rank, &n);
  if (!world) return 2;
  Checker k(world, rank, n);
  comm_t dup = nullptr, split = nullptr;
  k.status(comm_dup(world, &dup), "comm_dup");
  k.status(comm_split(world, rank % 2, rank, &split), "comm_split");
  struct Case {
    comm_dtype_t d;
    comm_op_t op;
    size_t count;
  };
  const Case cases[] = {{COMM_FLOAT32, COMM_SUM, 7},       {COMM_FLOAT32, COMM_SUM, 4099},
                        {COMM_BFLOAT16, COMM_AVG, 1048579}, {COMM_INT64, COMM_MAX, 262147},
                        {COMM_FLOAT32, COMM_SUM, 4194307}};
  uint64_t seed = 100;
  for (comm_t c : {world, dup, split}) {
    if (c == nullptr) continue;
    int r = -1, size = -1;
    comm_rank(c, &r);
    comm_size(c, &size);
    const std::string which = c == world ? "world" : c == dup ? "dup" : "split" + std::to_string(rank % 2);
    for (const Case& a : cases) {
      for (bool in_place : {false, true}) {
        const size_t bytes = a.count * dtype_size(a.d);
        void* send = nullptr;
        void* recv = nullptr;
        const std::string what = which + " allreduce " + dtype_name(a.d) + " " + op_name(a.op) + " " +
                                 std::to_string(a.count) + (in_place ? " in-place" : "") + " (comm_mem_alloc)";
        if (!k.status(comm_mem_alloc(c, bytes, &send), what + ": comm_mem_alloc")) return 1;
        if (!k.status(comm_mem_alloc(c, bytes, &recv), what + ": comm_mem_alloc")) return 1;
        auto* src = static_cast<unsigned char*>(in_place ? recv : send);
        fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
        if (!k.status(comm_allreduce(c, src, recv, a.count, a.d, a.op, nullptr), what)) return 1;
        k.result(check_reduced(static_cast<unsigned char*>(recv), a.count, a.d, a.op, seed, size, 0), what);
        k.hash(what, recv, bytes);
        k.status(comm_mem_free(c, send), what + ": comm_mem_free");
        k.status(comm_mem_free(c, recv), what + ": comm_mem_free");
      }
    }
  }
  for (comm_t c : {split, dup, world})
    if (c != nullptr && comm_destroy(c) != COMM_OK) k.fail("comm_destroy failed");
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

// Many small collectives over a few seconds while the harness sprays garbage at every
// listening port of the job.
int mode_garbage() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  say("READY");
  std::vector<unsigned char> send(262147 * 4), recv(262147 * 4);
  for (int i = 0; i < 150 && k.failures == 0; ++i) {
    const size_t count = i % 10 == 9 ? 262147 : 1023;
    const uint64_t seed = 5000 + static_cast<uint64_t>(i);
    fill_input(send.data(), count, COMM_FLOAT32, COMM_SUM, seed, rank, 0);
    const std::string what = "iteration " + std::to_string(i) + " allreduce " + std::to_string(count);
    if (!k.status(comm_allreduce(c, send.data(), recv.data(), count, COMM_FLOAT32, COMM_SUM, nullptr), what)) break;
    k.result(check_reduced(recv.data(), count, COMM_FLOAT32, COMM_SUM, seed, n, 0), what);
    if (!k.status(comm_barrier(c, nullptr), "iteration " + std::to_string(i) + " barrier")) break;
    usleep(10000);
  }
  const comm_status_t st = comm_destroy(c);
  if (st != COMM_OK) k.fail("comm_destroy returned " + std::to_string(st));
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

// Receives from any rank (COMM_ANY_SOURCE), 3 or more ranks; rank 0 receives, the others send.
// Every message carries its sender and its number, so rank 0 checks what it got against the
// source libcomm reported, and that one sender's messages came in the order sent.
int mode_any_source() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  const int per = 20;  // messages per sender in phase 1
  std::vector<int32_t> msg(4);
  auto fill = [&](int32_t i) { msg = {rank, i, rank, i}; };
  // Local misuse: INVALID_ARGUMENT, the communicator stays usable.
  int src = 0;
  int32_t one = 0;
  comm_request_t req = nullptr;
  if (comm_send(c, &one, 1, COMM_INT32, COMM_ANY_SOURCE, nullptr) != COMM_ERR_INVALID_ARGUMENT)
    k.fail("a send to COMM_ANY_SOURCE is not INVALID_ARGUMENT");
  if (comm_recv_any(c, &one, 0, COMM_INT32, &src, nullptr) != COMM_ERR_INVALID_ARGUMENT)
    k.fail("a receive of 0 elements from any rank is not INVALID_ARGUMENT");
  comm_group_start();
  const comm_status_t grouped = comm_recv(c, &one, 1, COMM_INT32, COMM_ANY_SOURCE, nullptr);
  comm_group_end();
  if (grouped != COMM_ERR_INVALID_ARGUMENT) k.fail("a receive from any rank inside a group is not INVALID_ARGUMENT");

  // Phase 1: every other rank sends `per` messages; rank 0 takes them all from any rank,
  // alternating comm_recv_any, comm_irecv_any and comm_recv(COMM_ANY_SOURCE) (no source: the
  // content says who sent it).
  if (rank != 0) {
    for (int32_t i = 0; i < per; ++i) {
      fill(i);
      if (!k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 1 send " + std::to_string(i))) break;
    }
  } else {
    std::vector<int> next(static_cast<size_t>(n), 0);
    for (int m = 0; m < per * (n - 1) && k.failures == 0; ++m) {
      std::vector<int32_t> got(4, -1);
      src = -7;
      const std::string what = "phase 1 receive " + std::to_string(m);
      if (m % 3 == 0) {
        if (!k.status(comm_recv_any(c, got.data(), 4, COMM_INT32, &src, nullptr), what)) break;
      } else if (m % 3 == 1) {
        if (!k.status(comm_irecv_any(c, got.data(), 4, COMM_INT32, &src, &req), what)) break;
        if (!k.status(comm_wait(req), what + " (wait)")) break;
      } else {
        if (!k.status(comm_recv(c, got.data(), 4, COMM_INT32, COMM_ANY_SOURCE, nullptr), what)) break;
        src = got[0];
      }
      if (src < 1 || src >= n || got[0] != src || got[2] != src)
        k.fail(what + ": reported source " + std::to_string(src) + " but the message says " + std::to_string(got[0]));
      else if (got[1] != next[static_cast<size_t>(src)] || got[3] != got[1])
        k.fail(what + ": from rank " + std::to_string(src) + " message " + std::to_string(got[1]) + " came when " +
               std::to_string(next[static_cast<size_t>(src)]) + " was next (overtaken)");
      else
        ++next[static_cast<size_t>(src)];
    }
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 1");

  // Phase 2: a directed receive posted before receives from any rank takes its rank's first
  // message; and a receive from any rank posted before a directed one takes the first.
  if (rank == 1 || rank == 2) {
    for (int32_t i = 0; i < (rank == 1 ? 2 : 1); ++i) {
      fill(100 + i);
      k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 2 send");
    }
  } else if (rank == 0) {
    std::vector<int32_t> a(4, -1), b(4, -1), d(4, -1);
    int sb = -1, sd = -1;
    comm_request_t ra = nullptr, rb = nullptr, rd = nullptr;
    k.status(comm_irecv(c, a.data(), 4, COMM_INT32, 1, &ra), "phase 2 irecv from 1");
    k.status(comm_irecv_any(c, b.data(), 4, COMM_INT32, &sb, &rb), "phase 2 irecv_any #1");
    k.status(comm_irecv_any(c, d.data(), 4, COMM_INT32, &sd, &rd), "phase 2 irecv_any #2");
    k.status(comm_wait(rd), "phase 2 wait any #2");
    k.status(comm_wait(ra), "phase 2 wait directed");
    k.status(comm_wait(rb), "phase 2 wait any #1");
    if (a[0] != 1 || a[1] != 100) k.fail("phase 2: the directed receive from 1 got " + std::to_string(a[0]) + "/" +
                                         std::to_string(a[1]) + ", not rank 1's first message");
    const bool right = (sb == 1 && sd == 2 && b[1] == 101 && d[0] == 2) || (sb == 2 && sd == 1 && b[0] == 2 && d[1] == 101);
    if (!right || b[0] != sb || d[0] != sd)
      k.fail("phase 2: the receives from any rank got " + std::to_string(b[0]) + "/" + std::to_string(b[1]) + " (source " +
             std::to_string(sb) + ") and " + std::to_string(d[0]) + "/" + std::to_string(d[1]) + " (source " +
             std::to_string(sd) + ")");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 2a");
  if (rank == 2) {
    for (int32_t i = 0; i < 2; ++i) {
      fill(200 + i);
      k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 2b send");
    }
  } else if (rank == 0) {
    std::vector<int32_t> x(4, -1), y(4, -1);
    int sx = -1;
    comm_request_t rx = nullptr, ry = nullptr;
    k.status(comm_irecv_any(c, x.data(), 4, COMM_INT32, &sx, &rx), "phase 2b irecv_any");
    k.status(comm_irecv(c, y.data(), 4, COMM_INT32, 2, &ry), "phase 2b irecv from 2");
    k.status(comm_wait(ry), "phase 2b wait directed");
    k.status(comm_wait(rx), "phase 2b wait any");
    if (sx != 2 || x[1] != 200 || y[1] != 201)
      k.fail("phase 2b: the receive from any rank (posted first) got message " + std::to_string(x[1]) + " (source " +
             std::to_string(sx) + "), the directed one " + std::to_string(y[1]) + ": expected 200 then 201");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 2b");

  // Phase 3: large messages (zero-copy over shared memory, striped over sockets), every rank
  // to rank 0 at once, while rank 0 also sends to rank 1 (a send is never held back).
  const size_t big = 300007;
  std::vector<int32_t> large(big);
  if (rank != 0) {
    for (size_t i = 0; i < big; ++i) large[i] = static_cast<int32_t>(rank * 1000003 + static_cast<int>(i));
    k.status(comm_send(c, large.data(), big, COMM_INT32, 0, nullptr), "phase 3 send");
    if (rank == 1) {
      k.status(comm_recv(c, &one, 1, COMM_INT32, 0, nullptr), "phase 3 receive from 0");
      if (one != 77) k.fail("phase 3: rank 0's message is " + std::to_string(one));
    }
  } else {
    one = 77;
    comm_request_t rs = nullptr;
    k.status(comm_isend(c, &one, 1, COMM_INT32, 1, &rs), "phase 3 isend to 1");
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (int m = 0; m < n - 1; ++m) {
      src = -1;
      if (!k.status(comm_recv_any(c, large.data(), big, COMM_INT32, &src, nullptr), "phase 3 receive")) break;
      size_t wrong = 0;
      for (size_t i = 0; i < big; ++i) wrong += large[i] != static_cast<int32_t>(src * 1000003 + static_cast<int>(i));
      if (src < 1 || src >= n || seen[static_cast<size_t>(src)] || wrong != 0)
        k.fail("phase 3: source " + std::to_string(src) + ", " + std::to_string(wrong) + " wrong elements");
      else
        seen[static_cast<size_t>(src)] = true;
    }
    k.status(comm_wait(rs), "phase 3 wait isend");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 3");
  if (comm_destroy(c) != COMM_OK) k.fail("comm_destroy failed");
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

// Rank 0 receives from any rank and nobody sends: COMM_ERR_TIMEOUT after COMM_TIMEOUT_MS, its
// message naming the receive from any rank. The others stay out of libcomm (a wait of theirs
// would time out too, and its report reach rank 0 first) until rank 0 has made the file
// ABI_ANY_SOURCE_DONE.
int mode_any_source_timeout() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const char* done = std::getenv("ABI_ANY_SOURCE_DONE");
  if (rank != 0) {
    const double t0 = mono_ms();
    while (done != nullptr && access(done, F_OK) != 0 && mono_ms() - t0 < 120000) usleep(10000);
    comm_abort(c);
    comm_destroy(c);
    say("DONE 0");
    return 0;
  }
  int32_t buf[4];
  int src = 0;
  const double t0 = mono_ms();
  const comm_status_t st = comm_recv_any(c, buf, 4, COMM_INT32, &src, nullptr);
  say("END " + std::to_string(st) + " " + std::to_string(static_cast<long>(mono_ms() - t0)) + " " + std::to_string(src));
  if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  if (done != nullptr) {
    if (FILE* f = std::fopen(done, "w")) std::fclose(f);
  }
  comm_abort(c);
  comm_destroy(c);
  say("DONE 0");
  return 0;
}

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

}  // namespace

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
