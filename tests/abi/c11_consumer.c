/* A C11 program built against the installed comm/comm.h through `pkg-config comm`: the
 * header must be valid C, not only C++. A one-rank communicator, an all-reduce, destroy. */
#include <comm/comm.h>
#include <stdio.h>
#include <string.h>

static int check(comm_status_t st, const char* what) {
  if (st != COMM_OK) {
    fprintf(stderr, "c11_consumer: %s: %s: %s\n", what, comm_status_string(st), comm_last_error(NULL));
    return 1;
  }
  return 0;
}

int main(void) {
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm = NULL;
  float in[4] = {1.5f, -2.0f, 3.25f, 0.0f};
  float out[4] = {0};
  int rank = -1, size = -1, major = -1, minor = -1;

  cfg.init_method = "memory://c11-consumer";
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_ms = 10000;
  if (check(comm_get_version(&major, &minor), "comm_get_version")) return 1;
  if (major != COMM_ABI_VERSION_MAJOR) {
    fprintf(stderr, "c11_consumer: library ABI %d, header %d\n", major, COMM_ABI_VERSION_MAJOR);
    return 1;
  }
  if (check(comm_init(&cfg, &comm), "comm_init")) return 1;
  if (check(comm_rank(comm, &rank), "comm_rank") || check(comm_size(comm, &size), "comm_size")) return 1;
  if (check(comm_allreduce(comm, in, out, 4, COMM_FLOAT32, COMM_SUM, NULL), "comm_allreduce")) return 1;
  if (memcmp(in, out, sizeof in) != 0 || rank != 0 || size != 1) {
    fprintf(stderr, "c11_consumer: wrong result (rank %d of %d)\n", rank, size);
    return 1;
  }
  if (check(comm_destroy(comm), "comm_destroy")) return 1;
  printf("c11_consumer: ok (%s, ABI %d.%d, libcomm %s)\n", comm_status_string(COMM_OK), major, minor,
         comm_get_version_string());
  return 0;
}
