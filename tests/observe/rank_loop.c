/* One rank of comm-top's tests (tests/observe/test_comm_top.py): all-reduces in a loop, the
 * slow rank (SLOW_RANK) computing SLOW_MS longer before each, until ITERATIONS (0: until killed).
 * RANK_LOOP_COLL=alltoall: all-to-alls of COUNT floats per peer instead, so that every rank
 * receives from every other (test_slow_link.py: one host's slow link must show in its peers' waits).
 *     rank_loop ITERATIONS SLOW_RANK SLOW_MS COUNT */
#define _POSIX_C_SOURCE 200809L
#include <comm/comm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: rank_loop ITERATIONS SLOW_RANK SLOW_MS COUNT\n");
    return 2;
  }
  const long iterations = atol(argv[1]), slow_ms = atol(argv[3]);
  const int slow_rank = atoi(argv[2]);
  const size_t count = (size_t)atol(argv[4]);
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm;
  if (comm_init(&cfg, &comm) != COMM_OK) {
    fprintf(stderr, "comm_init: %s\n", comm_last_error(NULL));
    return 1;
  }
  int rank = 0;
  comm_rank(comm, &rank);
  int size = 1;
  comm_size(comm, &size);
  const char* coll = getenv("RANK_LOOP_COLL");
  const int alltoall = coll != NULL && strcmp(coll, "alltoall") == 0;
  const size_t elems = alltoall ? count * (size_t)size : count;
  float* x = calloc(elems > 0 ? elems : 1, sizeof(float));
  float* y = alltoall ? calloc(elems > 0 ? elems : 1, sizeof(float)) : x;
  const struct timespec nap = {slow_ms / 1000, (slow_ms % 1000) * 1000000L};
  for (long i = 0; iterations == 0 || i < iterations; ++i) {
    if (rank == slow_rank && slow_ms > 0) nanosleep(&nap, NULL);
    comm_status_t st = alltoall ? comm_alltoall(comm, x, y, count, COMM_FLOAT32, NULL)
                                : comm_allreduce(comm, x, x, count, COMM_FLOAT32, COMM_SUM, NULL);
    if (st != COMM_OK) {
      fprintf(stderr, "rank %d: %s: %s\n", rank, comm_status_string(st), comm_last_error(comm));
      return 1;
    }
  }
  /* No barrier before comm_destroy: over a slow link the last all-to-all's bytes may still be on their
   * way when a rank exits, and comm_destroy waits for them (tests/observe/test_destroy_drain.py). */
  if (y != x) free(y);
  free(x);
  comm_destroy(comm);
  return 0;
}
