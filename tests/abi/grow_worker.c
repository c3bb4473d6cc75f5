/* One process of test_grow_processes.cc (issue 35, comm_grow), in C: it sees comm.h and
 * libcomm.so only. Writes one fact per line to stdout; the test judges them.
 *
 *   grow_worker member   a rank of the job: all-reduces; GROW_VICTIM's rank SIGKILLs itself in
 *                        its third; the others agree and shrink (COMM_SHRINK_AGREE), print
 *                        SHRINK, then grow: GROW_N=k waits for k joiners, else COMM_GROW_WAITING
 *                        is polled until one came; then an all-reduce on the grown communicator.
 *   grow_worker joiner   started with COMM_JOIN=1: comm_init returns the grown communicator.
 *   grow_worker waiting  comm_grow(COMM_GROW_WAITING) with nobody waiting, five times: NULL each.
 *   grow_worker train    under comm-run --replace-failed (tests/tools/test_comm_run_replace.sh).
 *
 * Lines: STARTED, ITER i, SHRINK status rank size, GROW status rank size, INIT status rank size,
 * RESULT ok|bad, ARENA ok|bad, NULLS n, WAITUS us, GROWMS ms, MSG text, DONE status, FINAL step rank size. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The harness (process_harness.h, launch) opens the gate once every rank said STARTED. */
static void wait_gate(void) {
  const char* gate = getenv("ABI_START_GATE");
  printf("STARTED\n");
  fflush(stdout);
  for (int i = 0; gate && *gate && i < 120000 / 5; ++i) {
    if (access(gate, F_OK) == 0) return;
    sleep_ms(5);
  }
}

static int fail(const char* what, comm_status_t st) {
  printf("MSG %s: %s\nDONE %d\n", what, comm_last_error(NULL), (int)st);
  fflush(stdout);
  return 0; /* the test reads DONE; exit 0 so that it judges the lines, not the status */
}

/* Every rank contributes rank + 1: the sum over n ranks is n(n+1)/2 everywhere. */
static int check_allreduce(comm_t c) {
  enum { kCount = 4096 };
  static float buf[kCount];
  int rank = -1, size = 0;
  comm_rank(c, &rank);
  comm_size(c, &size);
  for (int i = 0; i < kCount; ++i) buf[i] = (float)(rank + 1);
  comm_status_t st = comm_allreduce(c, buf, buf, kCount, COMM_FLOAT32, COMM_SUM, NULL);
  if (st != COMM_OK) return fail("allreduce on the grown communicator", st);
  const float want = (float)(size * (size + 1) / 2);
  int ok = 1;
  for (int i = 0; i < kCount; ++i) ok = ok && buf[i] == want;
  printf("RESULT %s\n", ok ? "ok" : "bad");
  return 1;
}

/* Large all-reduces (past the shared-memory slots: docs/design/core.md, "Growing a communicator"),
 * in place on comm_mem_alloc buffers (read in place from the grown communicator's arenas) and on
 * plain memory (staged in them). A joiner in a dead rank's slot has a lower world rank than the
 * members after it; its peers once found no arena for it and refused these ("exposed a buffer
 * outside its arena", transports/shm/setup.cc). Line: ARENA ok|bad. */
static int check_large_allreduce(comm_t c) {
  enum { kCount = 1 << 20 };
  int rank = -1, size = 0;
  comm_rank(c, &rank);
  comm_size(c, &size);
  void* arena = NULL;
  comm_status_t st = comm_mem_alloc(c, kCount * sizeof(float), &arena);
  if (st != COMM_OK) return fail("comm_mem_alloc on the grown communicator", st);
  float* heap = malloc(kCount * sizeof(float));
  if (heap == NULL) return fail("malloc", COMM_ERR_SYSTEM);
  const float want = (float)(size * (size + 1) / 2);
  int ok = 1;
  for (int round = 0; round < 2 && st == COMM_OK; ++round) {
    float* buf = round == 0 ? (float*)arena : heap;
    for (int i = 0; i < kCount; ++i) buf[i] = (float)(rank + 1);
    st = comm_allreduce(c, buf, buf, kCount, COMM_FLOAT32, COMM_SUM, NULL);
    for (int i = 0; st == COMM_OK && i < kCount; ++i) ok = ok && buf[i] == want;
  }
  free(heap);
  comm_mem_free(c, arena);
  if (st != COMM_OK) return fail("large allreduce on the grown communicator", st);
  printf("ARENA %s\n", ok ? "ok" : "bad");
  return 1;
}

/* A grown communicator's children work on members and joiners alike (its shared-memory domain). */
static int check_dup(comm_t c) {
  comm_t d = NULL;
  comm_status_t st = comm_dup(c, &d);
  if (st != COMM_OK) return fail("comm_dup of the grown communicator", st);
  if (!check_allreduce(d)) return 0;
  comm_destroy(d);
  return 1;
}

static int member(void) {
  comm_t world = NULL, small = NULL, big = NULL;
  comm_status_t st = comm_init(NULL, &world);
  if (st != COMM_OK) return fail("comm_init", st);
  int rank = -1;
  comm_rank(world, &rank);
  const int victim = getenv("GROW_VICTIM") ? atoi(getenv("GROW_VICTIM")) : -1;
  float x[1024];
  for (int iter = 0; iter < 1000; ++iter) {
    printf("ITER %d\n", iter);
    fflush(stdout);
    if (rank == victim && iter == 2) raise(SIGKILL);
    for (int i = 0; i < 1024; ++i) x[i] = 1.0f;
    st = comm_allreduce(world, x, x, 1024, COMM_FLOAT32, COMM_SUM, NULL);
    if (st != COMM_OK) break;
  }
  if (st == COMM_OK) return fail("no rank died", COMM_ERR_INTERNAL);
  st = comm_shrink(world, NULL, COMM_SHRINK_AGREE, &small);
  int r = -1, n = 0;
  if (st == COMM_OK) {
    comm_rank(small, &r);
    comm_size(small, &n);
  }
  printf("SHRINK %d %d %d\n", (int)st, r, n);
  fflush(stdout);
  if (st != COMM_OK) return fail("comm_shrink", st);
  comm_destroy(world);
  const int n_join = getenv("GROW_N") ? atoi(getenv("GROW_N")) : 0;
  if (n_join > 0) {
    st = comm_grow(small, n_join, &big);
  } else {
    /* As a training loop does at each step: cheap while nobody waits. The test starts the
     * joiner once every survivor printed SHRINK; 60 s covers a busy host's process start. */
    for (int i = 0; i < 1200 && st == COMM_OK && big == NULL; ++i) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      st = comm_grow(small, COMM_GROW_WAITING, &big);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (st == COMM_OK && big == NULL) sleep_ms(50);
      /* The call that admitted the joiner (docs/benchmarks.md, "comm_grow"). */
      if (big != NULL)
        printf("GROWMS %.2f\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
  }
  r = -1;
  n = 0;
  if (st == COMM_OK && big != NULL) {
    comm_rank(big, &r);
    comm_size(big, &n);
  }
  printf("GROW %d %d %d\n", (int)st, r, n);
  fflush(stdout);
  if (st != COMM_OK || big == NULL) return fail("comm_grow", st != COMM_OK ? st : COMM_ERR_TIMEOUT);
  if (!check_allreduce(big)) return 0;
  if (!check_large_allreduce(big)) return 0;
  if (!check_dup(big)) return 0;
  if (!check_allreduce(small)) return 0; /* the communicator it grew from stays usable */
  comm_destroy(big);
  comm_destroy(small);
  printf("DONE 0\n");
  return 0;
}

static int joiner(void) {
  comm_t c = NULL;
  comm_status_t st = comm_init(NULL, &c);
  int r = -1, n = 0;
  if (st == COMM_OK) {
    comm_rank(c, &r);
    comm_size(c, &n);
  }
  printf("INIT %d %d %d\n", (int)st, r, n);
  fflush(stdout);
  if (st != COMM_OK) return fail("comm_init with COMM_JOIN=1", st);
  if (!check_allreduce(c)) return 0;
  if (!check_large_allreduce(c)) return 0;
  if (!check_dup(c)) return 0;
  comm_destroy(c);
  printf("DONE 0\n");
  return 0;
}

static int waiting(void) {
  comm_t c = NULL, out = NULL;
  comm_status_t st = comm_init(NULL, &c);
  if (st != COMM_OK) return fail("comm_init", st);
  int nulls = 0;
  for (int i = 0; i < 5; ++i) {
    out = (comm_t)1; /* must come back NULL */
    st = comm_grow(c, COMM_GROW_WAITING, &out);
    if (st != COMM_OK) return fail("comm_grow(COMM_GROW_WAITING)", st);
    nulls += out == NULL;
  }
  printf("NULLS %d\n", nulls);
  /* What a training loop pays per step for asking (docs/benchmarks.md): GROW_TIMING calls. */
  const int timing = getenv("GROW_TIMING") ? atoi(getenv("GROW_TIMING")) : 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < timing; ++i)
    if ((st = comm_grow(c, COMM_GROW_WAITING, &out)) != COMM_OK) return fail("comm_grow(COMM_GROW_WAITING)", st);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (timing > 0)
    printf("WAITUS %.1f\n", ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3) / timing);
  st = comm_grow(c, 0, &out);
  printf("ZERO %d\n", (int)st); /* n_join 0: invalid argument */
  if (!check_allreduce(c)) return 0;
  comm_destroy(c);
  printf("DONE 0\n");
  return 0;
}

/* Under comm-run --replace-failed: all-reduces GROW_STEPS steps; GROW_VICTIM's first process
 * SIGKILLs itself (GROW_STOP=1: SIGSTOPs itself) at step 3; the others agree and shrink, redo the
 * step, and at each step boundary admit whoever waits (comm_grow, COMM_GROW_WAITING); the
 * replacement comm-run starts (COMM_JOIN=1) learns the step from the lowest member. Every rank
 * goes on until the steps are done on the full world. Exit 0 only then (comm-run judges it). */
static int train(void) {
  const int joining = getenv("COMM_JOIN") != NULL && atoi(getenv("COMM_JOIN")) == 1;
  const int world = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 1;
  const int victim = getenv("GROW_VICTIM") ? atoi(getenv("GROW_VICTIM")) : -1;
  const int stop = getenv("GROW_STOP") != NULL && atoi(getenv("GROW_STOP")) == 1;
  const long steps = getenv("GROW_STEPS") ? atol(getenv("GROW_STEPS")) : 10;
  /* GROW_EARLY=FILE: the first replacement dies before it asks to join (the file marks that it did). */
  const char* early = getenv("GROW_EARLY");
  if (joining && early != NULL && access(early, F_OK) != 0) {
    FILE* f = fopen(early, "w");
    if (f != NULL) fclose(f);
    raise(SIGKILL);
  }
  /* GROW_HELLO_EXIT=FILE: the first replacement exits as soon as a comm_grow answered it (it is
   * counted into its slot, and the members' comm_grow fails without it). */
  const char* hello_exit = getenv("GROW_HELLO_EXIT");
  if (joining && hello_exit != NULL && access(hello_exit, F_OK) != 0) {
    FILE* f = fopen(hello_exit, "w");
    if (f != NULL) fclose(f);
    setenv("COMM_TEST_JOIN_EXIT", "answered", 1);
  }
  /* GROW_REGISTERED_EXIT=FILE: the first replacement exits once it registered (ticket and hello
   * written), before any comm_grow answered it. */
  const char* registered_exit = getenv("GROW_REGISTERED_EXIT");
  if (joining && registered_exit != NULL && access(registered_exit, F_OK) != 0) {
    FILE* f = fopen(registered_exit, "w");
    if (f != NULL) fclose(f);
    setenv("COMM_TEST_JOIN_EXIT", "registered", 1);
  }
  comm_t c = NULL;
  comm_status_t st = comm_init(NULL, &c);
  if (st != COMM_OK) return fail("comm_init", st), 1;
  int rank = -1, size = 0;
  comm_rank(c, &rank);
  const int first_rank = rank;
  int64_t step = 0;
  if (joining && comm_broadcast(c, &step, &step, 1, COMM_INT64, 0, NULL) != COMM_OK)
    return fail("the step from the lowest member", COMM_ERR_REMOTE), 1;
  const time_t give_up = time(NULL) + 100;
  float x[256];
  int grown = joining; /* a joiner is where the members are after their comm_grow and the step */
  for (;;) {
    if (time(NULL) > give_up) return fail("the job did not finish in 100 s", COMM_ERR_TIMEOUT), 1;
    comm_t big = NULL;
    st = grown ? COMM_OK : comm_grow(c, COMM_GROW_WAITING, &big);
    grown = 0;
    /* A joiner that died after it was claimed fails the grow on every member alike (REMOTE: a
     * member saw it silent, libcomm/src/setup_watch.h; TIMEOUT: its set-up timed out first); the
     * communicator stays as it was (docs/design/core.md, "Growing a communicator"). */
    if (st != COMM_OK && st != COMM_ERR_TIMEOUT && st != COMM_ERR_REMOTE) return fail("comm_grow", st), 1;
    if (st != COMM_OK) printf("GROW_FAILED %lld %d\n", (long long)step, (int)st);
    if (big != NULL) {
      comm_destroy(c);
      c = big;
      if ((st = comm_broadcast(c, &step, &step, 1, COMM_INT64, 0, NULL)) != COMM_OK) return fail("step", st), 1;
    }
    comm_rank(c, &rank);
    comm_size(c, &size);
    if (step >= steps && size == world) break;
    if (!joining && first_rank == victim && step == 3) raise(stop ? SIGSTOP : SIGKILL);
    /* GROW_AGAIN=FILE: the first replacement dies too, at its first step from 8 on (the file marks that it did). */
    const char* again = getenv("GROW_AGAIN");
    if (joining && again != NULL && step >= 8 && access(again, F_OK) != 0) {
      FILE* f = fopen(again, "w");
      if (f != NULL) fclose(f);
      raise(SIGKILL);
    }
    for (int i = 0; i < 256; ++i) x[i] = 1.0f;
    st = comm_allreduce(c, x, x, 256, COMM_FLOAT32, COMM_SUM, NULL);
    if (st != COMM_OK) {
      comm_t small = NULL;
      st = comm_shrink(c, NULL, COMM_SHRINK_AGREE, &small);
      if (st != COMM_OK) return fail("comm_shrink", st), 1;
      comm_destroy(c);
      c = small;
      continue; /* the step again, on the survivors */
    }
    if (x[0] != (float)size) return fail("wrong all-reduce", COMM_ERR_INTERNAL), 1;
    ++step;
    sleep_ms(20);
  }
  printf("FINAL %lld %d %d\n", (long long)step, rank, size);
  comm_destroy(c);
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "train") == 0) return train();
  if (strcmp(mode, "joiner") != 0) wait_gate();
  if (strcmp(mode, "member") == 0) return member();
  if (strcmp(mode, "joiner") == 0) return joiner();
  if (strcmp(mode, "waiting") == 0) return waiting();
  fprintf(stderr, "grow_worker: unknown mode '%s' (member, joiner, waiting, train)\n", mode);
  return 2;
}
