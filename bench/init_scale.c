/* One rank of bench/init_scale.sh: times comm_init, a barrier, the first and later 8-byte
 * all-reduces and a 1 MiB all-reduce (results checked), and reports this rank's open file
 * descriptors (before and after init and at the end) and peak RSS. Every rank prints one
 * "INIT_SCALE" line with its numbers; the script aggregates them. */
#define _POSIX_C_SOURCE 200809L
#include <comm/comm.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int open_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}


/* Established TCP connections whose local port is MASTER_PORT: rank 0's store clients, seen
 * from the server side (the kernel's table of this network namespace). -1 when unknown. */
static int store_connections(void) {
  const char* port_text = getenv("MASTER_PORT");
  if (port_text == NULL) return -1;
  unsigned port = (unsigned)atoi(port_text);
  int n = 0;
  const char* tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int t = 0; t < 2; ++t) {
    FILE* f = fopen(tables[t], "r");
    if (f == NULL) continue;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
      char local[128];
      unsigned state = 0;
      if (sscanf(line, " %*d: %127s %*s %x", local, &state) != 2) continue;
      const char* colon = strrchr(local, ':');
      if (colon != NULL && strtoul(colon + 1, NULL, 16) == port && state == 1) ++n;
    }
    fclose(f);
  }
  return n;
}

/* INIT_SCALE_LIST_FDS=R: rank R lists what its descriptors are (for reading the table's fds). */
static void list_fds(int rank) {
  const char* want = getenv("INIT_SCALE_LIST_FDS");
  if (want == NULL || atoi(want) != rank) return;
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  char path[300], target[300];
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    printf("INIT_SCALE_FD rank=%d fd=%s %s\n", rank, e->d_name, target);
  }
  if (d != NULL) closedir(d);
}

static int fail(comm_t comm, const char* what, comm_status_t st) {
  fprintf(stderr, "init_scale: %s: %s: %s\n", what, comm_status_string(st), comm_last_error(comm));
  return 1;
}

int main(int argc, char** argv) {
  int later = argc > 1 ? atoi(argv[1]) : 10;
  int fds_pre = open_fds();
  double t0 = now_s();
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm;
  comm_status_t st = comm_init(&cfg, &comm);
  if (st != COMM_OK) return fail(NULL, "comm_init", st);
  double t_init = now_s() - t0;
  int fds_init = open_fds();
  int rank, size;
  comm_rank(comm, &rank);
  comm_size(comm, &size);
  int store_init = rank == 0 ? store_connections() : -1;

  double t = now_s();
  if ((st = comm_barrier(comm, NULL)) != COMM_OK) return fail(comm, "barrier", st);
  double t_barrier = now_s() - t;

  double x = rank, y = 0;
  t = now_s();
  if ((st = comm_allreduce(comm, &x, &y, 1, COMM_FLOAT64, COMM_SUM, NULL)) != COMM_OK)
    return fail(comm, "first 8 B allreduce", st);
  double t_first = now_s() - t;
  double expect = (double)size * (size - 1) / 2;
  if (y != expect) {
    fprintf(stderr, "init_scale: rank %d: 8 B allreduce gave %g, expected %g\n", rank, y, expect);
    return 1;
  }
  t = now_s();
  for (int i = 0; i < later; ++i)
    if ((st = comm_allreduce(comm, &x, &y, 1, COMM_FLOAT64, COMM_SUM, NULL)) != COMM_OK)
      return fail(comm, "8 B allreduce", st);
  double t_later = later > 0 ? (now_s() - t) / later : 0;

  size_t count = (1u << 20) / sizeof(float);
  float* big = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) big[i] = (float)((rank + (int)i) % 7);
  t = now_s();
  if ((st = comm_allreduce(comm, big, big, count, COMM_FLOAT32, COMM_SUM, NULL)) != COMM_OK)
    return fail(comm, "1 MiB allreduce", st);
  double t_big = now_s() - t;
  for (size_t i = 0; i < count; i += 997) {
    double want = 0;
    for (int r = 0; r < size; ++r) want += (r + (int)i) % 7;
    if (big[i] != (float)want) {
      fprintf(stderr, "init_scale: rank %d: 1 MiB allreduce element %zu is %g, expected %g\n", rank, i, big[i], want);
      return 1;
    }
  }
  free(big);
  int fds_end = open_fds();
  int store_end = rank == 0 ? store_connections() : -1;
  list_fds(rank);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("INIT_SCALE rank=%d size=%d init_s=%.4f barrier_s=%.4f first8_s=%.5f later8_s=%.6f big_s=%.4f "
         "fds_init=%d fds_end=%d rss_kb=%ld store_init=%d store_end=%d fds_pre=%d\n",
         rank, size, t_init, t_barrier, t_first, t_later, t_big, fds_init, fds_end, ru.ru_maxrss, store_init,
         store_end, fds_pre);
  fflush(stdout);
  if ((st = comm_barrier(comm, NULL)) != COMM_OK) return fail(comm, "last barrier", st);
  comm_destroy(comm);
  return 0;
}
